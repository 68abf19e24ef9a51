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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

SHARED_BASE = "/var/tmp/tensorless-hosts"  # set 0's BASE; also holds what all sets share
DEFAULT_BASE = SHARED_BASE
MAX_SET = 7
HERE = Path(__file__).resolve().parent
PROFILES_DIR = HERE / "profiles"
STANDIN_DIR = PROFILES_DIR / "_standin"
STATE_DIR = "/var/lib/tensorless-test"
MANIFEST = f"{STATE_DIR}/profile.files"
PROFILE_NAME_FILE = f"{STATE_DIR}/profile"
PROFILE_STAMP = f"{STATE_DIR}/profile.stamp"
PROFILE_SUMS = f"{STATE_DIR}/profile.sha256"
HOSTS_JSON_VERSION = 2
SUDO_USER = "operator"  # on every host: the harness key, passwordless sudo
PERSIST_HOST = "persist1"  # the host with a persistent root: it reboots for real
IFNAME_MAX = 15  # Linux interface names (IFNAMSIZ - 1)


# --------------------------------------------------------------------------- host sets


@dataclass(frozen=True)
class PlannedHost:
    """One host of a set as setup.sh boots it (names and addresses from ``HostSet``)."""

    name: str
    ip: str
    suite: str
    profile: str
    netns: str
    veth: str  # the bridge side of the host's veth pair (root namespace)
    peer: str  # its other end before it moves into the namespace and becomes eth0
    persistent: bool  # own root that survives reboots (else --volatile=overlay)
    gpu_host: bool


@dataclass(frozen=True)
class HostSet:
    """The names and addresses of one set of test hosts, ``TL_SET`` = 0..7.

    Set 0 is the historical plan (BASE /var/tmp/tensorless-hosts, bridge tlbr0, 10.253.0.0/24,
    namespaces tl-NAME, veths tlv-NAME); set S uses BASE /var/tmp/tensorless-hosts-S, bridge
    tlbrS, 10.253.S.0/24, namespaces tlS-NAME, veths tlSv-NAME. Every other script and fixture
    takes the plan from here (setup.sh and teardown.sh through ``harness.py plan``) or from
    hosts.json, which setup writes from here.
    """

    index: int
    base: Path
    shared: Path  # rootfs trees, the engine image tar and their build lock, shared by all sets

    @property
    def net(self) -> str:
        return f"10.253.{self.index}"

    @property
    def subnet(self) -> str:
        return f"{self.net}.0/24"

    @property
    def gateway(self) -> str:
        return f"{self.net}.1"

    @property
    def registry(self) -> str:
        return f"{self.gateway}:5000"

    @property
    def unreachable(self) -> str:
        """On the set's bridge, never assigned: connections to it time out."""
        return f"{self.net}.250"

    @property
    def bridge(self) -> str:
        return f"tlbr{self.index}"

    @property
    def _tag(self) -> str:
        return "" if self.index == 0 else str(self.index)

    def netns(self, name: str) -> str:
        return f"tl{self._tag}-{name}"

    def veth(self, name: str) -> str:
        return self._ifname(f"tl{self._tag}v-{name}")

    def peer(self, name: str) -> str:
        return self._ifname(f"tl{self._tag}p-{name}")

    @staticmethod
    def _ifname(s: str) -> str:
        if len(s) > IFNAME_MAX:
            raise ValueError(f"interface name {s!r} is longer than {IFNAME_MAX} characters")
        return s

    def host_ip(self, name: str) -> str:
        if name.startswith("gpu") and name[3:].isdigit() and 1 <= int(name[3:]) <= 16:
            return f"{self.net}.{10 + int(name[3:])}"
        fixed = {"legacy1": 100, PERSIST_HOST: 90}
        if name not in fixed:
            raise ValueError(f"no address for host {name!r} in the plan")
        return f"{self.net}.{fixed[name]}"

    def hosts(self, gpus: int) -> list[PlannedHost]:
        """gpu1..gpuN (trixie, volatile), legacy1 (bookworm), persist1 (trixie, persistent)."""
        if not 1 <= gpus <= 16:
            raise ValueError(f"GPU hosts: 1..16 (got {gpus})")
        spec = [(f"gpu{i}", "trixie", "h200" if i == 2 else "p100") for i in range(1, gpus + 1)]
        spec += [("legacy1", "bookworm", "p100"), (PERSIST_HOST, "trixie", "p100")]
        return [
            PlannedHost(
                name=n,
                ip=self.host_ip(n),
                suite=suite,
                profile=prof,
                netns=self.netns(n),
                veth=self.veth(n),
                peer=self.peer(n),
                persistent=n == PERSIST_HOST,
                gpu_host=n.startswith("gpu"),
            )
            for n, suite, prof in spec
        ]


def set_index(value: str | int | None = None) -> int:
    """``TL_SET`` (0..7, default 0) as an int; anything else is an error."""
    raw = os.environ.get("TL_SET", "") if value is None else str(value)
    raw = raw.strip() or "0"
    if not raw.isdigit() or not 0 <= int(raw) <= MAX_SET:
        raise ValueError(f"TL_SET must be 0..{MAX_SET} (got {raw!r})")
    return int(raw)


def host_set(index: int | None = None) -> HostSet:
    """The plan of set ``index`` (default: ``TL_SET``). ``BASE``/``TL_HOSTS_BASE`` override the
    set's BASE, ``TL_SHARED`` the shared directory."""
    i = set_index(index)
    default = SHARED_BASE if i == 0 else f"{SHARED_BASE}-{i}"
    base = os.environ.get("TL_HOSTS_BASE") or os.environ.get("BASE") or default
    shared = os.environ.get("TL_SHARED") or SHARED_BASE
    return HostSet(index=i, base=Path(base), shared=Path(shared))


def base_dir() -> Path:
    """The harness BASE directory of the current set (``TL_SET``; ``BASE`` or ``TL_HOSTS_BASE``
    override it)."""
    return host_set().base


def _shell_plan(hs: HostSet, gpus: int) -> str:
    """``harness.py plan``: the set's plan as bash assignments for setup.sh / teardown.sh."""
    hosts = hs.hosts(gpus)

    def arr(key: str, values: Sequence[object]) -> str:
        return f"{key}=({' '.join(shlex.quote(str(v)) for v in values)})"

    scalars = {
        "TL_SET": hs.index,
        "BASE": hs.base,
        "SHARED": hs.shared,
        "BRIDGE": hs.bridge,
        "GW": hs.gateway,
        "SUBNET": hs.subnet,
        "REGISTRY": hs.registry,
        "UNREACHABLE": hs.unreachable,
        "NETNS_PREFIX": hs.netns(""),
        "VETH_PREFIX": f"tl{hs._tag}v-",
        "ALL_REGISTRIES": " ".join(host_set(i).registry for i in range(MAX_SET + 1)),
        "SUDO_USER_NAME": SUDO_USER,
    }
    lines = [f"{k}={shlex.quote(str(v))}" for k, v in scalars.items()]
    lines += [
        arr("NAMES", [h.name for h in hosts]),
        arr("IPS", [h.ip for h in hosts]),
        arr("SUITES", [h.suite for h in hosts]),
        arr("PROFILES", [h.profile for h in hosts]),
        arr("NETNS", [h.netns for h in hosts]),
        arr("VETHS", [h.veth for h in hosts]),
        arr("PEERS", [h.peer for h in hosts]),
        arr("PERSISTENT", [int(h.persistent) for h in hosts]),
    ]
    return "\n".join(lines) + "\n"


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

    @property
    def sudo_user(self) -> str:
        """The non-root user with the same key and passwordless sudo (pyinfra ``_sudo``)."""
        return str(self.extra.get("sudo_user", SUDO_USER))

    @property
    def persistent(self) -> bool:
        """True for the host with its own root (persist1): it survives ``reboot``."""
        return bool(self.extra.get("persistent", False))

    def as_user(self, user: str) -> Host:
        """The same host, logged in as ``user`` (``host.as_user(host.sudo_user)``)."""
        return replace(self, user=user)

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
    """Files the profile puts on a host: absolute path -> (bytes, mode). Besides the profile's
    own files: its name, the manifest (every path, for the next apply to remove), their sha256
    sums and a stamp naming this exact content (what a reset checks to skip re-applying)."""
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
    paths = sorted({*files, MANIFEST, PROFILE_SUMS, PROFILE_STAMP})
    files[MANIFEST] = ("".join(f"{p}\n" for p in paths).encode(), 0o644)
    sums = "".join(
        f"{hashlib.sha256(files[p][0]).hexdigest()}  {p}\n" for p in sorted(files)
    ).encode()
    files[PROFILE_SUMS] = (sums, 0o644)
    nodes = _nodes_script(profile_device_nodes(name)).encode()
    modes = "".join(f"{oct(files[p][1])} {p}\n" for p in sorted(files)).encode()
    stamp = hashlib.sha256(sums + modes + nodes).hexdigest()[:32]
    files[PROFILE_STAMP] = (f"{name} {stamp}\n".encode(), 0o644)
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


# What the kernel says of the driver, stood in inside the guest (its kernel is the outer
# machine's, shared by every set: nothing is ever written there): /proc/driver/nvidia/version on a
# tmpfs mounted over the guest's own (empty) /proc/driver, and the kernel log's NVRM lines as
# journal entries of the kernel transport for this boot (systemd-journal-remote writes them into
# a journal file of their own, which `journalctl -k -b` reads with the guest's own journal).
STANDIN_DRIVER = "/usr/share/nvidia-standin/driver"
KMSG_JOURNAL = "tensorless-kmsg.journal"
_DRIVER_SCRIPT = f"""D={STANDIN_DRIVER}
if [ -f "$D/version" ]; then
  grep -q ' /proc/driver tmpfs ' /proc/mounts \\
    || mount -t tmpfs -o mode=0555,size=64k tensorless-standin /proc/driver
  mkdir -p /proc/driver/nvidia
  cp "$D/version" /proc/driver/nvidia/version
elif grep -q ' /proc/driver tmpfs ' /proc/mounts; then
  umount /proc/driver
fi
mid=$(cat /etc/machine-id)
rm -f /var/log/journal/*/{KMSG_JOURNAL} /run/log/journal/*/{KMSG_JOURNAL}
if [ -f "$D/kmsg" ]; then
  jr=/usr/lib/systemd/systemd-journal-remote
  [ -x "$jr" ] || {{ echo "profile needs $jr (package systemd-journal-remote)" >&2; exit 1; }}
  dir=/var/log/journal/$mid
  [ -d "$dir" ] || dir=/run/log/journal/$mid
  mkdir -p "$dir"
  boot=$(tr -d - < /proc/sys/kernel/random/boot_id)
  now=$(date +%s%6N)
  up=$(awk '{{printf "%.0f", $1 * 1000000}}' /proc/uptime)
  awk -v now="$now" -v up="$up" -v boot="$boot" -v mid="$mid" '{{
    printf "__REALTIME_TIMESTAMP=%.0f\\n", now + NR
    printf "__MONOTONIC_TIMESTAMP=%.0f\\n_BOOT_ID=%s\\n_MACHINE_ID=%s\\n", up + NR, boot, mid
    printf "_TRANSPORT=kernel\\nSYSLOG_FACILITY=0\\nSYSLOG_IDENTIFIER=kernel\\n"
    printf "PRIORITY=3\\nMESSAGE=%s\\n\\n", $0
  }}' "$D/kmsg" > "$dir/.tensorless-kmsg.export"
  "$jr" --output="$dir/{KMSG_JOURNAL}" --split-mode=none "$dir/.tensorless-kmsg.export" 2>/dev/null
  rm -f "$dir/.tensorless-kmsg.export"
fi
"""
# the reset's check that the host still shows exactly what the profile's driver files say
_DRIVER_OK = f"""driver_ok() {{
  if [ -f {STANDIN_DRIVER}/version ]; then
    cmp -s {STANDIN_DRIVER}/version /proc/driver/nvidia/version || return 1
  else
    [ ! -e /proc/driver/nvidia/version ] || return 1
  fi
  j="/var/log/journal/*/{KMSG_JOURNAL} /run/log/journal/*/{KMSG_JOURNAL}"
  if [ -f {STANDIN_DRIVER}/kmsg ]; then
    ls $j >/dev/null 2>&1 || return 1
  else
    ! ls $j >/dev/null 2>&1 || return 1
  fi
}}
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
    script = _APPLY_SCRIPT + _nodes_script(profile_device_nodes(name)) + _DRIVER_SCRIPT
    ssh_run(host, script, input=_tar_of(files), text=False, timeout=timeout)


def current_profile(host: Host, *, timeout: float = 30) -> str | None:
    proc = ssh_run(host, f"cat {PROFILE_NAME_FILE} 2>/dev/null || true", timeout=timeout)
    out = str(proc.stdout).strip()
    return out or None


# --------------------------------------------------------------------------- reset

# Paths a reset returns to their pristine (rootfs) content: anything a test added there is
# removed; units defined there are stopped first.
RESET_DIRS = (
    "/etc/systemd/system",
    "/etc/containers/systemd",
    "/etc/tensorless-deploy",
    "/var/lib/tensorless-deploy",
    "/var/lib/tensorless",  # the default models_dir: models--ORG--NAME/..., .tensorless/
    "/run/tensorless",  # where a download token file lives for the length of a download
    "/run/tensorless-deploy",  # the host's lock (fleet.lock) and its record
    "/srv",
    "/opt",
    f"/home/{SUDO_USER}",
)
QUADLET_SUFFIX = {
    ".container": "",
    ".pod": "-pod",
    ".network": "-network",
    ".volume": "-volume",
    ".kube": "",
    ".image": "-image",
    ".build": "-build",
}
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


def pristine_files(rootfs: Path) -> list[str]:
    """What RESET_DIRS hold in the pristine rootfs a host booted from (C-sorted)."""
    return list(_pristine(str(rootfs)))


_PRISTINE_CACHE: dict[str, tuple[str, ...]] = {}


def _pristine(rootfs: str) -> tuple[str, ...]:
    if rootfs not in _PRISTINE_CACHE:
        root = Path(rootfs)
        found: set[str] = set()
        for d in RESET_DIRS:
            top = root / d.lstrip("/")
            if top.is_dir():
                for p in top.rglob("*"):
                    found.add("/" + p.relative_to(root).as_posix())
        _PRISTINE_CACHE[rootfs] = tuple(sorted(found, key=lambda s: s.encode()))
    return _PRISTINE_CACHE[rootfs]


def _units_case() -> str:
    """sh ``case`` arms mapping an added file to the unit it defines."""
    arms = [
        f'    /etc/containers/systemd/*{suf}) units="$units ${{n%{suf}}}{add}.service";;'
        for suf, add in QUADLET_SUFFIX.items()
    ]
    arms.append(
        "    /etc/systemd/system/*.service|/etc/systemd/system/*.timer|"
        '/etc/systemd/system/*.socket|/etc/systemd/system/*.path) units="$units $n";;'
    )
    return "\n".join(arms)


def reset_script(pristine: Sequence[str], profile: str, *, images: bool = False) -> str:
    """The remote side of ``reset_host``: one SSH round trip that changes only what differs
    from pristine; the default profile's tar arrives on stdin and is unpacked only when the
    host's profile (stamp, file sums, CDI dirs, device nodes) is not exactly that one."""
    files = profile_files(profile)
    stamp = files[PROFILE_STAMP][0].decode().strip()
    cdi = sorted((p for p in files if any(p.startswith(d + "/") for d in CDI_DIRS)), key=str.encode)
    nodes = sorted(
        (
            x
            for path, major, minor in profile_device_nodes(profile)
            for x in (path, f"/dev/char/{major}:{minor}")
        ),
        key=str.encode,
    )
    dirs = " ".join(RESET_DIRS)
    body = "\n".join(pristine)
    return f"""set -u
export LC_ALL=C
P=$(mktemp); trap 'rm -f "$P"' EXIT
cat > "$P" <<'TL_PRISTINE'
{body}
TL_PRISTINE
extra=$(for d in {dirs}; do [ -d "$d" ] && find "$d" -mindepth 1; done | sort | comm -23 - "$P")
units=
for p in $extra; do
  n=${{p##*/}}
  case $p in
{_units_case()}
  esac
done
# transient services and timers (systemd-run, podman healthchecks); never login sessions
for f in /run/systemd/transient/*.service /run/systemd/transient/*.timer; do
  [ -e "$f" ] && units="$units ${{f##*/}}"
done
if [ -n "$units" ]; then
  timeout 60 systemctl stop $units >/dev/null 2>&1 || true
  systemctl disable $units >/dev/null 2>&1 || true
fi
# podman is slow to start (2 cores): only call it when its state has something
ctrs=/var/lib/containers/storage/overlay-containers/containers.json
if [ -s $ctrs ] && [ "$(cat $ctrs)" != "[]" ]; then
  timeout 60 podman pod rm -af -t 2 >/dev/null 2>&1 || true
  timeout 60 podman rm -af -t 2 >/dev/null 2>&1 || true
fi
if ls /etc/containers/networks/*.json >/dev/null 2>&1; then
  timeout 30 podman network prune -f >/dev/null 2>&1 || true
fi
if [ -n "$(ls -A /var/lib/containers/storage/volumes 2>/dev/null)" ]; then
  timeout 30 podman volume prune -f >/dev/null 2>&1 || true
fi
{"timeout 60 podman rmi -af >/dev/null 2>&1 || true" if images else ":"}
if [ -n "$extra" ]; then
  rm -rf -- $extra
  systemctl daemon-reload
fi
if [ -n "$(systemctl list-units --failed --no-legend --plain 2>/dev/null)" ]; then
  systemctl reset-failed || true
fi
# nftables tables a test added (convention: named tl_*)
if command -v nft >/dev/null 2>&1; then
  nft list tables 2>/dev/null | awk '$3 ~ /^tl_/ {{print $2, $3}}' | while read -r fam t; do
    nft delete table "$fam" "$t" || true
  done
fi
{_DRIVER_OK}profile_ok() {{
  [ "$(cat {PROFILE_STAMP} 2>/dev/null)" = {shlex.quote(stamp)} ] || return 1
  driver_ok || return 1
  sha256sum -c --quiet --status {PROFILE_SUMS} 2>/dev/null || return 1
  [ "$(find {" ".join(CDI_DIRS)} -mindepth 1 ! -type d 2>/dev/null | sort)" = \
{shlex.quote(chr(10).join(cdi))} ] || return 1
  [ "$(ls -d /dev/nvidia* /dev/char/195:* /dev/char/{UVM_MAJOR}:* 2>/dev/null | sort)" = \
{shlex.quote(chr(10).join(nodes))} ] || return 1
}}
if profile_ok; then
  cat > /dev/null
  echo "reset: profile {profile} unchanged"
else
  rm -rf /etc/cdi/* /var/run/cdi/*
  (
{_APPLY_SCRIPT}{_nodes_script(profile_device_nodes(profile))}{_DRIVER_SCRIPT}  ) || exit 1
  echo "reset: profile {profile} applied"
fi
echo "reset: $(echo $extra | wc -w) added paths removed, units stopped:${{units:- none}}"
"""


def host_rootfs(host: Host, base: Path | None = None) -> Path:
    """The pristine tree a host booted from (hosts.json ``rootfs``; older files: BASE/rootfs)."""
    if host.extra.get("rootfs"):
        return Path(str(host.extra["rootfs"]))
    return (base or base_dir()) / "rootfs" / host.suite


def reset_host(
    host: Host, *, rootfs: Path | None = None, images: bool = False, timeout: float = 180
) -> str:
    """Return ``host`` to its pristine default in one SSH round trip (see ``reset_script``):
    units and quadlet files a test added (stopped, disabled, removed), transient units, all
    podman containers and pods, unused networks and volumes (images too with ``images``),
    anything added under RESET_DIRS, tl_* nftables tables, and the default GPU profile.
    Returns the remote summary line(s)."""
    profile = str(host.extra.get("default_profile", host.profile))
    script = reset_script(_pristine(str(rootfs or host_rootfs(host))), profile, images=images)
    tar = _tar_of(profile_files(profile))
    proc = ssh_run(host, script, input=tar, text=False, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"reset of {host.name} failed (exit {proc.returncode}): "
            f"{proc.stderr.decode(errors='replace').strip()[-2000:]}"
        )
    return str(proc.stdout.decode(errors="replace"))


# --------------------------------------------------------------------------- reboot

BOOT_ID = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class Reboot:
    host: str
    old_boot_id: str
    new_boot_id: str
    seconds: float  # from `systemctl reboot` to SSH answering with the new boot id
    ready_seconds: float  # ... to `systemctl is-system-running` saying running/degraded


def boot_id(host: Host, *, timeout: float = 15) -> str:
    return str(ssh_run(host, f"cat {BOOT_ID}", timeout=timeout).stdout).strip()


def reboot(host: Host, *, timeout: float = 180) -> Reboot:
    """``systemctl reboot`` on a persistent host (persist1), then wait, bounded by ``timeout``
    seconds, until SSH answers with a new boot id and systemd says running (or degraded).
    Its supervisor starts systemd-nspawn again on exit code 133; a volatile host cannot reboot
    (nspawn refuses and the overlay would forget everything), so this refuses those."""
    if not host.persistent:
        raise ValueError(f"{host.name} has a volatile root and cannot reboot (use persist1)")
    log = host.extra.get("log", "BASE/logs/nspawn-<host>.log")
    old = boot_id(host)
    t0 = time.monotonic()
    # the session may be cut while systemd stops: its exit status says nothing
    ssh_run(host, "systemctl reboot", timeout=30, check=False)
    deadline = t0 + timeout
    new, last = "", ""
    while time.monotonic() < deadline:
        try:
            proc = ssh_run(
                host,
                f"cat {BOOT_ID}",
                timeout=max(1.0, min(10.0, deadline - time.monotonic())),
                check=False,
            )
            got = str(proc.stdout).strip()
            if proc.returncode == 0 and got and got != old:
                new = got
                break
            last = f"exit {proc.returncode}: {str(proc.stderr).strip()[-200:]}"
        except subprocess.TimeoutExpired:
            last = "ssh timed out"
        time.sleep(0.3)
    if not new:
        raise TimeoutError(
            f"reboot {host.name}: no SSH answer with a new boot id within {timeout:.0f} s "
            f"(last: {last}); read {log}"
        )
    seconds = time.monotonic() - t0
    left = max(5, int(deadline - time.monotonic()))
    state = str(
        ssh_run(
            host,
            f"timeout {left} systemctl is-system-running --wait",
            timeout=left + 10,
            check=False,
        ).stdout
    ).strip()
    if state not in ("running", "degraded"):
        raise RuntimeError(f"reboot {host.name}: systemd says {state!r} after boot; read {log}")
    return Reboot(host.name, old, new, seconds, time.monotonic() - t0)


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
    hs: HostSet,
    gpus: int,
    rootfs: Mapping[str, str],
    image_ref: str,
    gguf: Path,
    engine_tar: Path,
    out: Path | None = None,
) -> dict[str, Any]:
    """Probe every host of the set's plan over SSH (in parallel) and write ``out`` (default
    BASE/hosts.json)."""
    base = hs.base
    key = base / "ssh" / "id_ed25519"
    known = base / "ssh" / "known_hosts"
    cfg = base / "ssh" / "config"

    def record(ph: PlannedHost) -> dict[str, Any]:
        probe = Host(
            name=ph.name,
            ip=ph.ip,
            user="root",
            key=str(key),
            known_hosts=str(known),
            ssh_config=str(cfg),
            distro="debian",
            suite=ph.suite,
            podman_major=0,
            podman_version="",
            quadlet=False,
            profile=ph.profile,
            netns=ph.netns,
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
            gpu_host=ph.gpu_host,
            default_profile=ph.profile,
            sudo_user=SUDO_USER,
            rootfs=rootfs[ph.suite],
            persistent=ph.persistent,
            veth=ph.veth,
            log=str(base / "logs" / f"nspawn-{ph.name}.log"),
        )
        if ph.persistent:
            rec["root"] = str(base / "hosts" / ph.name / "root")
        return rec

    with ThreadPoolExecutor(max_workers=8) as pool:
        hosts = list(pool.map(record, hs.hosts(gpus)))
    data: dict[str, Any] = {
        "version": HOSTS_JSON_VERSION,
        "set": hs.index,
        "base": str(base),
        "shared": str(hs.shared),
        "gateway": hs.gateway,
        "bridge": hs.bridge,
        "subnet": hs.subnet,
        "unreachable": hs.unreachable,
        "ssh": {
            "key": str(key),
            "known_hosts": str(known),
            "config": str(cfg),
            "user": "root",
            "sudo_user": SUDO_USER,
        },
        "hosts": hosts,
        "registry": hs.registry,
        "image": {
            "ref": image_ref,
            "repository": image_ref.split("@")[0],
            "digest": image_ref.split("@")[1],
            "tar": str(engine_tar),
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
    dest = out or base / "hosts.json"
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(dest)
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
    a3.add_argument("--gpus", type=int, required=True)
    a3.add_argument("--rootfs", action="append", default=[], help="SUITE=PATH (each suite)")
    a3.add_argument("--image-ref", required=True)
    a3.add_argument("--gguf", type=Path, required=True)
    a3.add_argument("--engine-tar", type=Path, required=True)
    a3.add_argument("--out", type=Path, default=None, help="default BASE/hosts.json")
    a4 = sub.add_parser("plan", help="(setup.sh, teardown.sh) the set's plan as bash")
    a4.add_argument("--gpus", type=int, default=2)
    a5 = sub.add_parser("reset", help="reset hosts to their pristine default (all: no HOST)")
    a5.add_argument("hosts", nargs="*")
    a5.add_argument("--images", action="store_true")
    a5.add_argument("--hosts-json", type=Path, default=None, help="default BASE/hosts.json")
    a6 = sub.add_parser("reboot", help="reboot the persistent host, wait for the new boot")
    a6.add_argument("host", nargs="?", default=PERSIST_HOST)
    sub.add_parser("profiles", help="list GPU profiles")
    a = ap.parse_args(argv)
    hs = host_set()
    if a.base:
        hs = replace(hs, base=a.base)
    base = hs.base

    if a.cmd == "profiles":
        for n in profile_names():
            print(f"{n}\t{profile_meta(n).get('description', '')}")
        return 0
    if a.cmd == "plan":
        sys.stdout.write(_shell_plan(hs, a.gpus))
        return 0
    if a.cmd == "write-hosts-json":
        roots = dict(item.split("=", 1) for item in a.rootfs)
        write_hosts_json(hs, a.gpus, roots, a.image_ref, a.gguf, a.engine_tar, a.out)
        print(a.out or base / "hosts.json")
        return 0

    # during setup hosts.json may be missing or stale: the ssh config lists every host
    hosts = _hosts_from_ssh_config(hs) if (base / "ssh" / "config").is_file() else {}
    hjson = getattr(a, "hosts_json", None) or base / "hosts.json"
    if hjson.is_file():
        with hjson.open() as f:
            hosts.update({h["name"]: Host.from_json(h) for h in json.load(f)["hosts"]})
    if a.cmd == "reset":
        names = a.hosts or sorted(hosts)
        unknown = [n for n in names if n not in hosts]
        if unknown:
            print(f"unknown host(s) {unknown} (have: {', '.join(sorted(hosts))})", file=sys.stderr)
            return 2
        with ThreadPoolExecutor(max_workers=8) as pool:
            outs = pool.map(lambda n: reset_host(hosts[n], images=a.images), names)
            for n, out in zip(names, outs, strict=True):
                print(f"{n}: {' | '.join(out.splitlines())}")
        return 0
    if a.host not in hosts:
        print(f"unknown host {a.host!r} (have: {', '.join(sorted(hosts))})", file=sys.stderr)
        return 2
    host = hosts[a.host]
    if a.cmd == "apply-profile":
        apply_profile(host, a.profile)
        print(f"{host.name}: profile {a.profile}")
        return 0
    if a.cmd == "reboot":
        r = reboot(host)
        print(
            f"{r.host}: boot id {r.old_boot_id} -> {r.new_boot_id}; SSH after {r.seconds:.1f} s, "
            f"system running after {r.ready_seconds:.1f} s"
        )
        return 0
    proc = ssh_run(host, " ".join(a.command), check=False, timeout=600)
    sys.stdout.write(str(proc.stdout))
    sys.stderr.write(str(proc.stderr))
    return int(proc.returncode)


def _hosts_from_ssh_config(hs: HostSet) -> dict[str, Host]:
    base = hs.base
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
                netns=hs.netns(name),
                extra={"persistent": name == PERSIST_HOST},
            )
    return hosts


if __name__ == "__main__":
    sys.exit(main())
