#!/usr/bin/env python3
"""Test-host harness helpers (stdlib only): hosts.json, SSH, GPU stand-in profiles.

Importable (``from tests.hosts.harness import load_hosts, ssh_run, apply_profile``) and runnable:

    python tests/hosts/harness.py [--base BASE] apply-profile HOST PROFILE
    python tests/hosts/harness.py [--base BASE] ssh HOST COMMAND...
    python tests/hosts/harness.py [--base BASE] write-hosts-json ...   (used by setup.sh)

A GPU profile (``tests/hosts/profiles/<name>/``) is a ``root/`` tree copied onto a host, plus the
shared stand-in scripts from ``profiles/_standin/`` when the profile's ``profile.json`` asks for
them. Every file a profile installs is listed on the host in
``/var/lib/tensorless-test/profile.files`` so the next ``apply_profile`` removes exactly those
files first.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_BASE = "/var/tmp/tensorless-hosts"
HERE = Path(__file__).resolve().parent
PROFILES_DIR = HERE / "profiles"
STANDIN_DIR = PROFILES_DIR / "_standin"
STATE_DIR = "/var/lib/tensorless-test"
MANIFEST = f"{STATE_DIR}/profile.files"
PROFILE_NAME_FILE = f"{STATE_DIR}/profile"
HOSTS_JSON_VERSION = 1


def base_dir() -> Path:
    """The harness BASE directory (env ``BASE`` or ``TL_HOSTS_BASE``, else the default)."""
    return Path(os.environ.get("TL_HOSTS_BASE") or os.environ.get("BASE") or DEFAULT_BASE)


@dataclass(frozen=True)
class Host:
    """One test host as recorded in hosts.json."""

    name: str
    ip: str
    user: str
    key: str
    known_hosts: str
    ssh_config: str
    distro: str
    suite: str
    podman_major: int
    podman_version: str
    quadlet: bool
    profile: str
    netns: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def testinfra_url(self) -> str:
        return f"paramiko://{self.user}@{self.ip}?ssh_identity_file={self.key}"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Host:
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        return cls(
            **{k: d[k] for k in known},
            extra={k: v for k, v in d.items() if k not in known},
        )


def load_hosts_json(base: Path | None = None) -> dict[str, Any]:
    path = (base or base_dir()) / "hosts.json"
    with path.open() as f:
        data: dict[str, Any] = json.load(f)
    return data


def load_hosts(base: Path | None = None) -> dict[str, Host]:
    return {h["name"]: Host.from_json(h) for h in load_hosts_json(base)["hosts"]}


def ssh_argv(host: Host, *, connect_timeout: int = 5) -> list[str]:
    """argv prefix for running a command on ``host`` with the harness key and known_hosts."""
    return [
        "ssh",
        "-F",
        "none",
        "-i",
        host.key,
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={host.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        "ServerAliveInterval=5",
        "-o",
        "ServerAliveCountMax=3",
        "-o",
        "LogLevel=ERROR",
        "-l",
        host.user,
        host.ip,
    ]


def ssh_run(
    host: Host,
    command: str | Sequence[str],
    *,
    input: bytes | str | None = None,
    timeout: float = 60,
    check: bool = True,
    text: bool = True,
) -> subprocess.CompletedProcess[Any]:
    """Run ``command`` (a shell string, or argv that is quoted for the remote shell) on ``host``.

    Bounded by ``timeout`` seconds (raises ``subprocess.TimeoutExpired``). With ``check`` a
    non-zero exit raises ``subprocess.CalledProcessError`` carrying stdout and stderr.
    """
    remote = command if isinstance(command, str) else shlex.join(command)
    if isinstance(input, str) and not text:
        input = input.encode()
    proc = subprocess.run(
        [*ssh_argv(host), remote],
        input=input,
        capture_output=True,
        timeout=timeout,
        text=text,
        check=False,
    )
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(
            proc.returncode, f"ssh {host.name} {remote}", proc.stdout, proc.stderr
        )
    return proc


# --------------------------------------------------------------------------- GPU profiles


def profile_names() -> list[str]:
    return sorted(
        p.name for p in PROFILES_DIR.iterdir() if p.is_dir() and not p.name.startswith("_")
    )


def profile_meta(name: str) -> dict[str, Any]:
    with (PROFILES_DIR / name / "profile.json").open() as f:
        meta: dict[str, Any] = json.load(f)
    return meta


def profile_files(name: str) -> dict[str, tuple[bytes, int]]:
    """Files the profile puts on a host: absolute path -> (bytes, mode)."""
    pdir = PROFILES_DIR / name
    if not (pdir / "profile.json").is_file():
        raise ValueError(f"unknown GPU profile {name!r} (have: {', '.join(profile_names())})")
    meta = profile_meta(name)
    files: dict[str, tuple[bytes, int]] = {}
    root = pdir / "root"
    if root.is_dir():
        for p in sorted(root.rglob("*")):
            if p.is_file():
                mode = 0o755 if os.access(p, os.X_OK) else 0o644
                files["/" + p.relative_to(root).as_posix()] = (p.read_bytes(), mode)
    for script, dest, flag in (
        ("nvidia-smi", "/usr/bin/nvidia-smi", "nvidia_smi"),
        ("nvidia-ctk", "/usr/bin/nvidia-ctk", "nvidia_ctk"),
        ("nvidia-cdi-hook", "/usr/bin/nvidia-cdi-hook", "nvidia_ctk"),
    ):
        if meta.get(flag, False):
            files[dest] = ((STANDIN_DIR / script).read_bytes(), 0o755)
    files[PROFILE_NAME_FILE] = (f"{name}\n".encode(), 0o644)
    manifest = "".join(f"{p}\n" for p in sorted(files) if p != MANIFEST) + f"{MANIFEST}\n"
    files[MANIFEST] = (manifest.encode(), 0o644)
    return files


def _tar_of(files: Mapping[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(data)
            info.mode = mode
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# Remote side: remove what the previous profile installed (only paths it listed), then unpack.
_APPLY_SCRIPT = f"""set -eu
if [ -f {MANIFEST} ]; then
  while IFS= read -r f; do
    case "$f" in /*) rm -f -- "$f";; esac
  done < {MANIFEST}
fi
mkdir -p /etc/cdi /var/run/cdi
tar -x -f - -C / --no-same-owner --no-overwrite-dir --keep-directory-symlink
"""


NODES_FILE = f"{STATE_DIR}/profile.nodes"
UVM_MAJOR = 238  # as the real H200 host showed (shared fixtures, host-facts.txt)


def profile_device_nodes(name: str) -> list[tuple[str, int, int]]:
    """The /dev/nvidia* nodes a host with this profile has: only where the driver is loaded
    (nvidia-smi present and answering), one per GPU plus nvidiactl and the UVM pair."""
    meta = profile_meta(name)
    gpus = meta.get("gpus") or []
    if not meta.get("nvidia_smi") or not gpus or meta.get("nvidia_smi_exit"):
        return []
    nodes = [(f"/dev/nvidia{i}", 195, i) for i in range(len(gpus))]
    return [
        *nodes,
        ("/dev/nvidiactl", 195, 255),
        ("/dev/nvidia-uvm", UVM_MAJOR, 0),
        ("/dev/nvidia-uvm-tools", UVM_MAJOR, 1),
    ]


def _nodes_script(nodes: list[tuple[str, int, int]]) -> str:
    """Remove the previous profile's device nodes and /dev/char links, then make these. The
    nodes only need to exist (doctor's facts); containers get /dev/zero through the CDI spec."""
    lines = [
        f'if [ -f {NODES_FILE} ]; then while IFS= read -r f; do rm -f -- "$f"; done '
        f"< {NODES_FILE}; fi",
        f": > {NODES_FILE}",
        "mkdir -p /dev/char",
    ]
    for path, major, minor in nodes:
        link = f"/dev/char/{major}:{minor}"
        lines += [
            f"mknod -m 666 {path} c {major} {minor}",
            f"ln -sfn ../{path.removeprefix('/dev/')} {link}",
            f"printf '%s\\n%s\\n' {path} {link} >> {NODES_FILE}",
        ]
    return "\n".join(lines) + "\n"


def apply_profile(host: Host, name: str, *, timeout: float = 60) -> None:
    """Install GPU stand-in profile ``name`` on ``host`` over SSH (removes the previous first),
    with the device nodes a host with that driver state has."""
    files = profile_files(name)
    script = _APPLY_SCRIPT + _nodes_script(profile_device_nodes(name))
    ssh_run(host, script, input=_tar_of(files), text=False, timeout=timeout)


def current_profile(host: Host, *, timeout: float = 30) -> str | None:
    proc = ssh_run(host, f"cat {PROFILE_NAME_FILE} 2>/dev/null || true", timeout=timeout)
    out = str(proc.stdout).strip()
    return out or None


# --------------------------------------------------------------------------- hosts.json


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_timings(path: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            k, _, v = line.partition("\t")
            if k and v:
                out[k] = float(v)
    return out


def write_hosts_json(
    base: Path,
    hostspec: str,
    registry: str,
    image_ref: str,
    gguf: Path,
    gateway: str,
) -> dict[str, Any]:
    key = base / "ssh" / "id_ed25519"
    known = base / "ssh" / "known_hosts"
    cfg = base / "ssh" / "config"
    hosts: list[dict[str, Any]] = []
    for item in hostspec.split():
        name, ip, suite, profile = item.split(":")
        probe = Host(
            name=name,
            ip=ip,
            user="root",
            key=str(key),
            known_hosts=str(known),
            ssh_config=str(cfg),
            distro="debian",
            suite=suite,
            podman_major=0,
            podman_version="",
            quadlet=False,
            profile=profile,
            netns=f"tl-{name}",
        )
        out = ssh_run(
            probe,
            "podman version --format '{{.Client.Version}}'; "
            "if [ -x /usr/libexec/podman/quadlet ]; then echo quadlet; else echo noquadlet; fi; "
            ". /etc/os-release; echo $VERSION_ID",
            timeout=30,
        ).stdout.split()
        version, quadlet, version_id = out[0], out[1] == "quadlet", out[2]
        rec = asdict(probe)
        rec.pop("extra")
        rec.update(
            podman_version=version,
            podman_major=int(version.split(".")[0]),
            quadlet=quadlet,
            distro_version=version_id,
            gpu_host=name.startswith("gpu"),
            default_profile=profile,
        )
        hosts.append(rec)
    data: dict[str, Any] = {
        "version": HOSTS_JSON_VERSION,
        "base": str(base),
        "gateway": gateway,
        "bridge": "tlbr0",
        "ssh": {"key": str(key), "known_hosts": str(known), "config": str(cfg), "user": "root"},
        "hosts": hosts,
        "registry": registry,
        "image": {
            "ref": image_ref,
            "repository": image_ref.split("@")[0],
            "digest": image_ref.split("@")[1],
            "tar": str(base / "engine" / "engine-cpu.tar"),
        },
        "tiny_gguf": {
            "path": str(gguf),
            "sha256": _sha256(gguf),
            "size": gguf.stat().st_size,
            "hf_repo": "tensorless-test/tiny-llama-GGUF",
            "hf_file": "tiny-llama.gguf",
        },
        "timings": _read_timings(base / "timings.tsv"),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = base / "hosts.json.tmp"
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(base / "hosts.json")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="tensorless test-host harness")
    ap.add_argument("--base", type=Path, default=None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a1 = sub.add_parser("apply-profile", help="apply a GPU stand-in profile to a host")
    a1.add_argument("host")
    a1.add_argument("profile")
    a2 = sub.add_parser("ssh", help="run a command on a host")
    a2.add_argument("host")
    a2.add_argument("command", nargs=argparse.REMAINDER)
    a3 = sub.add_parser("write-hosts-json", help="(setup.sh) probe hosts, write hosts.json")
    a3.add_argument("--hosts", required=True, help="'name:ip:suite:profile ...'")
    a3.add_argument("--registry", required=True)
    a3.add_argument("--image-ref", required=True)
    a3.add_argument("--gguf", type=Path, required=True)
    a3.add_argument("--gateway", required=True)
    sub.add_parser("profiles", help="list GPU profiles")
    a = ap.parse_args(argv)
    base = a.base or base_dir()

    if a.cmd == "profiles":
        for n in profile_names():
            print(f"{n}\t{profile_meta(n).get('description', '')}")
        return 0
    if a.cmd == "write-hosts-json":
        write_hosts_json(base, a.hosts, a.registry, a.image_ref, a.gguf, a.gateway)
        print(base / "hosts.json")
        return 0

    # during setup hosts.json may be missing or stale: the ssh config lists every host
    hosts = _hosts_from_ssh_config(base) if (base / "ssh" / "config").is_file() else {}
    if (base / "hosts.json").is_file():
        hosts.update({h["name"]: Host.from_json(h) for h in load_hosts_json(base)["hosts"]})
    if a.host not in hosts:
        print(f"unknown host {a.host!r} (have: {', '.join(sorted(hosts))})", file=sys.stderr)
        return 2
    host = hosts[a.host]
    if a.cmd == "apply-profile":
        apply_profile(host, a.profile)
        print(f"{host.name}: profile {a.profile}")
        return 0
    proc = ssh_run(host, " ".join(a.command), check=False, timeout=600)
    sys.stdout.write(str(proc.stdout))
    sys.stderr.write(str(proc.stderr))
    return int(proc.returncode)


def _hosts_from_ssh_config(base: Path) -> dict[str, Host]:
    hosts: dict[str, Host] = {}
    name = ""
    for line in (base / "ssh" / "config").read_text().splitlines():
        words = line.split()
        if words[:1] == ["Host"]:
            name = words[1]
        elif words[:1] == ["HostName"] and name:
            hosts[name] = Host(
                name=name,
                ip=words[1],
                user="root",
                key=str(base / "ssh" / "id_ed25519"),
                known_hosts=str(base / "ssh" / "known_hosts"),
                ssh_config=str(base / "ssh" / "config"),
                distro="debian",
                suite="",
                podman_major=0,
                podman_version="",
                quadlet=False,
                profile="",
                netns=f"tl-{name}",
            )
    return hosts


if __name__ == "__main__":
    sys.exit(main())
