"""pyinfra facts the deploy operations decide on: image present, model blob, unit file, service."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyinfra.api.facts import FactBase


def _one(output: Iterable[str]) -> str:
    return "\n".join(output).strip()


class ImagePresent(FactBase[bool]):
    """Whether the engine already holds the image (by digest)."""

    def command(self, engine_bin: str, image: str) -> str:
        check = "image exists" if engine_bin.endswith("podman") else "image inspect"
        return (
            f"{shlex.quote(engine_bin)} {check} {shlex.quote(image)} >/dev/null 2>&1 "
            "&& echo yes || echo no"
        )

    def process(self, output: Iterable[str]) -> bool:
        return _one(output) == "yes"


@dataclass(frozen=True)
class BlobState:
    """The model blob on the host, the stamp left when it was last verified, and where the
    snapshot link points."""

    exists: bool
    size: int | None
    mtime: int | None
    stamp: str | None
    link: str | None = None

    @property
    def verified(self) -> bool:
        """Verified before and untouched since: same size and mtime as the stamp says."""
        return self.exists and self.stamp == f"{self.size} {self.mtime}"


def parse_blob_state(text: str) -> BlobState:
    """Three lines: "size mtime" or "missing", the stamp (may be empty), the link target."""
    lines = [*text.splitlines(), "", "", ""][:3]
    head = lines[0].split()
    stamp = lines[1].strip() or None
    link = lines[2].strip() or None
    if len(head) != 2 or not all(p.isdigit() for p in head):
        return BlobState(False, None, None, stamp, link)
    return BlobState(True, int(head[0]), int(head[1]), stamp, link)


class ModelBlob(FactBase[BlobState]):
    """`stat` of the blob, its verification stamp, and the snapshot link's target."""

    def command(self, blob: str, stamp: str, snapshot: str) -> str:
        b, s, n = shlex.quote(blob), shlex.quote(stamp), shlex.quote(snapshot)
        return (
            f"stat -c '%s %Y' {b} 2>/dev/null || echo missing; "
            f'echo "$(cat {s} 2>/dev/null)"; echo "$(readlink {n} 2>/dev/null)"'
        )

    def process(self, output: Iterable[str]) -> BlobState:
        return parse_blob_state("\n".join(output))


class FileSha256(FactBase["str | None"]):
    """The sha256 of a file, or None when it does not exist."""

    def command(self, path: str) -> str:
        p = shlex.quote(path)
        return (
            f"if [ -f {p} ]; then (openssl dgst -sha256 -r {p} 2>/dev/null || sha256sum {p}) "
            "| cut -d' ' -f1; else echo none; fi"
        )

    def process(self, output: Iterable[str]) -> str | None:
        value = _one(output)
        return None if value in ("", "none") else value


@dataclass(frozen=True)
class ServiceState:
    active: str  # systemctl is-active: active, inactive, failed, activating, ...
    enabled: str  # systemctl is-enabled: enabled, disabled, generated, not-found, ...


class UnitActive(FactBase[ServiceState]):
    def command(self, service: str) -> str:
        s = shlex.quote(service)
        return (
            f"echo $(systemctl is-active {s} 2>/dev/null || true); "
            f"echo $(systemctl is-enabled {s} 2>/dev/null || true)"
        )

    def process(self, output: Iterable[str]) -> ServiceState:
        lines = [line.strip() for line in output]
        active = lines[0] if lines and lines[0] else "unknown"
        enabled = lines[1] if len(lines) > 1 and lines[1] else "not-found"
        return ServiceState(active, enabled)


class HttpStatus(FactBase[int]):
    """The HTTP status a GET of url answers on the host (0: no connection)."""

    def command(self, url: str, head: bool = False) -> str:
        return (
            f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 {'-I ' if head else ''}"
            f"{shlex.quote(url)} 2>/dev/null || true"
        )

    def process(self, output: Iterable[str]) -> int:
        text = _one(output)
        return int(text) if text.isdigit() else 0


@dataclass(frozen=True)
class DeployedUnit:
    """One tensorless unit on a host: its file, the service state, and the running container."""

    name: str
    kind: str  # quadlet or service
    active: str
    unit_labels: dict[str, str]  # from the unit file as written
    container_labels: dict[str, str]  # from the running container (empty when none runs)
    image: str | None  # the image reference the container was created from
    image_id: str | None
    health: int  # HTTP status of /health on the labelled address (0: no answer)


_LABEL_LINE = re.compile(r'(?:Label=|--label" ")"?(io\.tensorless\.[a-z-]+)=([^"\s]*)')


def parse_deployed_units(text: str) -> tuple[DeployedUnit, ...]:
    """Blocks of `@@unit NAME KIND`, `@@active`, unit file lines, `@@inspect JSON`, `@@health`."""
    units: list[DeployedUnit] = []
    cur: dict[str, Any] | None = None

    def close() -> None:
        if cur is not None:
            units.append(DeployedUnit(**cur))

    for line in text.splitlines():
        if line.startswith("@@unit "):
            close()
            _, name, kind = [*line.split(), "", ""][:3]
            cur = {
                "name": name,
                "kind": kind,
                "active": "unknown",
                "unit_labels": {},
                "container_labels": {},
                "image": None,
                "image_id": None,
                "health": 0,
            }
        elif cur is None:
            continue
        elif line.startswith("@@active "):
            cur["active"] = line.split(" ", 1)[1].strip() or "unknown"
        elif line.startswith("@@inspect "):
            fields = line.split(" ", 1)[1].split("\t")
            if len(fields) != 3:
                continue
            try:
                labels = json.loads(fields[0])
            except ValueError:
                continue
            if isinstance(labels, dict):
                cur["container_labels"] = {
                    k: str(v) for k, v in labels.items() if k.startswith("io.tensorless.")
                }
                cur["image"] = fields[1].strip() or None
                cur["image_id"] = fields[2].strip() or None
        elif line.startswith("@@health "):
            code = line.split(" ", 1)[1].strip()
            cur["health"] = int(code) if code.isdigit() else 0
        else:
            for m in _LABEL_LINE.finditer(line):
                cur["unit_labels"][m.group(1)] = m.group(2)
    close()
    return tuple(units)


_UNITS_SCRIPT = r"""
for f in /etc/containers/systemd/tensorless-*.container /etc/systemd/system/tensorless-*.service; do
  [ -f "$f" ] || continue
  b=$(basename "$f"); n=${b%.*}
  case "$f" in *.container) k=quadlet;; *) k=service;; esac
  echo "@@unit $n $k"
  echo "@@active $(systemctl is-active "$n.service" 2>/dev/null)"
  grep -o 'io\.tensorless\.[a-z-]*=[^" ]*' "$f" | sed 's/^/Label=/'
  # only the fields status needs: labels, image reference, image id (one line, tab-separated)
  if command -v podman >/dev/null 2>&1; then
    eng=podman; fmt='{{json .Config.Labels}}	{{.ImageName}}	{{.Image}}'
  else
    eng=docker; fmt='{{json .Config.Labels}}	{{.Config.Image}}	{{.Image}}'
  fi
  info=$($eng inspect --format "$fmt" "$n" 2>/dev/null) ||
    { sleep 1; info=$($eng inspect --format "$fmt" "$n" 2>/dev/null); }
  echo "@@inspect $info"
  port=$(grep -o 'io\.tensorless\.port=[0-9]*' "$f" | head -1 | cut -d= -f2)
  bind=$(grep -o 'io\.tensorless\.bind=[^" ]*' "$f" | head -1 | cut -d= -f2)
  case "$bind" in ""|0.0.0.0|::) bind=127.0.0.1;; *:*) bind="[$bind]";; esac
  url="http://$bind:${port:-8080}/health"
  echo "@@health $(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "$url" 2>/dev/null)"
done
true
"""


class DeployedUnits(FactBase[tuple[DeployedUnit, ...]]):
    """Every unit tensorless-deploy wrote on the host, with what runs from it."""

    @staticmethod
    def default() -> tuple[DeployedUnit, ...]:
        return ()  # no output: no unit of ours on the host

    def command(self) -> str:
        return _UNITS_SCRIPT

    def process(self, output: Iterable[str]) -> tuple[DeployedUnit, ...]:
        return parse_deployed_units("\n".join(output))
