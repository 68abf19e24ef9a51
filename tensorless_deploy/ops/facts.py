"""pyinfra facts the deploy operations decide on: image present, model blob, unit file, service."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass

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
            f"echo \"$(cat {s} 2>/dev/null)\"; echo \"$(readlink {n} 2>/dev/null)\""
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

    def command(self, url: str) -> str:
        return (
            f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 {shlex.quote(url)} "
            "2>/dev/null || true"
        )

    def process(self, output: Iterable[str]) -> int:
        text = _one(output)
        return int(text) if text.isdigit() else 0
