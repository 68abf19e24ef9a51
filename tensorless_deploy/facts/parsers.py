"""Pure parsers of GPU-host command output: text (and exit code) in, typed fact values out.

No I/O here. Each parser either returns a value (the states a host can be in, failures of the
tool included, are values) or raises FactError when the text cannot be read at all.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# PyYAML comes with gguf and huggingface_hub (both project dependencies); it ships no stubs.
import yaml  # type: ignore[import-untyped]

from .errors import FactError
from .values import (
    CDI_GPU_KIND,
    COMPUTE_CAP,
    LABEL_HEALTH,
    LABEL_PREFIX,
    Access,
    BlobState,
    CdiReport,
    CdiSpec,
    Cgroups,
    CharLink,
    ContainerToolkit,
    DeployedUnit,
    DeviceNode,
    DiskSpace,
    Docker,
    Gpu,
    GpuApp,
    GpuReport,
    GpuState,
    InitSystem,
    Listener,
    ModelBlobFile,
    NvidiaDevices,
    Podman,
    Selinux,
    SelinuxMode,
    SudoProbe,
    ToolState,
    ToolUnit,
    Version,
)

# The one GPU query the project runs; its field order is what parse_nvidia_smi reads.
NVIDIA_SMI_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "compute_cap",
    "memory.total",
    "memory.used",
    "driver_version",
    "pci.bus_id",  # last: rows of the older 7-field query (fixtures) still read, without it
)
NVIDIA_SMI_QUERY = (
    f"nvidia-smi --query-gpu={','.join(NVIDIA_SMI_FIELDS)} --format=csv,noheader,nounits"
)

COMMAND_NOT_FOUND = 127
NVIDIA_SMI_NO_DRIVER = 9
# Exit statuses of a probe that ran past its bound (facts.survey.PROBE_TIMEOUT_S): coreutils
# timeout's 124 (137 when it had to SIGKILL), and 124 from scripts/bound.sh for a probe that
# could not be killed at all (nvidia-smi in uninterruptible sleep on a wedged GPU).
TIMED_OUT = (124, 137)

_NO_DRIVER_TEXT = "couldn't communicate with the nvidia driver"
_MISMATCH_TEXT = "driver/library version mismatch"
_NO_DEVICES_TEXT = "no devices were found"
_INVALID_FIELD = re.compile(r'Field "([^"]*)" is not a valid field to query')
_UUID = re.compile(r"GPU-[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)*")
_DRIVER = re.compile(r"[0-9]+(?:\.[0-9]+)+")
_INT = re.compile(r"[0-9]+")
_PCI_BUS = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
_MIB = re.compile(r"([0-9]+)(?: ?MiB)?")
_VERSION = re.compile(r"([0-9]+)\.([0-9]+)(?:\.([0-9]+))?")


def _lines(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.strip()]


def _not_available(value: str) -> bool:
    """nvidia-smi's placeholders: [N/A], [Not Supported], [Unknown Error], ..."""
    return value == "N/A" or (value.startswith("[") and value.endswith("]"))


# --- nvidia-smi --------------------------------------------------------------------------------


def parse_gpu_row(line: str) -> Gpu | None:
    """One CSV row of NVIDIA_SMI_QUERY, or None when the line is not one."""
    parts = [part.strip() for part in line.split(",")]
    bus = parts.pop() if len(parts) > 1 and _PCI_BUS.fullmatch(parts[-1]) else None
    if len(parts) < len(NVIDIA_SMI_FIELDS) - 1:
        return None
    index, uuid = parts[0], parts[1]
    cap, total, used, driver = parts[-4:]
    name = ", ".join(parts[2:-4])  # a name with a comma in it would still land here whole
    if not _INT.fullmatch(index) or not _UUID.fullmatch(uuid) or not name:
        return None
    if not (_not_available(cap) or COMPUTE_CAP.fullmatch(cap)):
        return None
    if not (_not_available(driver) or _DRIVER.fullmatch(driver)):
        return None
    memory: list[int | None] = []
    for value in (total, used):
        match = _MIB.fullmatch(value)
        if match:
            memory.append(int(match.group(1)))
        elif _not_available(value):
            memory.append(None)
        else:
            return None
    return Gpu(
        index=int(index),
        uuid=uuid,
        name=name,
        compute_cap=None if _not_available(cap) else cap,
        memory_total_mib=memory[0],
        memory_used_mib=memory[1],
        driver_version=None if _not_available(driver) else driver,
        pci_bus_id=bus,
    )


def nvidia_smi_state(text: str, exit_code: int) -> GpuState | None:
    """What any nvidia-smi call's exit code and output (stderr merged in) say before its own
    output is parsed: absent, hung (the survey's bound), no driver, a driver/library mismatch,
    no devices; None: nothing of these, parse on."""
    lowered = text.lower()
    if exit_code == COMMAND_NOT_FOUND:
        return "absent"
    if exit_code in TIMED_OUT:
        return "hung"
    if exit_code == NVIDIA_SMI_NO_DRIVER or _NO_DRIVER_TEXT in lowered:
        return "no_driver"
    if _MISMATCH_TEXT in lowered:
        return "driver_mismatch"
    if _NO_DEVICES_TEXT in lowered:
        return "no_devices"
    return None


def parse_nvidia_smi(output: str, exit_code: int) -> GpuReport:
    """NVIDIA_SMI_QUERY's output (stderr merged in) and exit code, as one of its states."""
    text = output.strip()
    said = nvidia_smi_state(text, exit_code)
    if said is not None:
        return GpuReport(state=said, exit_code=exit_code, message=text)
    if exit_code != 0:
        field = _INVALID_FIELD.search(text)
        return GpuReport(
            state="failed",
            exit_code=exit_code,
            message=text,
            invalid_field=field.group(1) if field else None,
        )
    gpus: list[Gpu] = []
    warnings: list[str] = []
    for line in _lines(output):
        gpu = parse_gpu_row(line)
        if gpu is None:
            warnings.append(line)
        else:
            gpus.append(gpu)
    if not gpus:
        why = text or "nvidia-smi printed nothing"
        return GpuReport(state="failed", exit_code=exit_code, message=why)
    return GpuReport(state="ok", gpus=tuple(gpus), exit_code=exit_code, warnings=tuple(warnings))


# --- /dev/nvidia* and /dev/char ----------------------------------------------------------------

# `LC_ALL=C ls -l`: mode, links, owner, group, "MAJOR, MINOR", three date fields, name.
_LS_CHAR = re.compile(
    r"c[-rwxsStTl]{9}[.+@]?\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s+\S+\s+\S+\s+\S+\s+(\S.*)"
)
_LS_DIR_HEADER = re.compile(r"(/\S*):")
_CHAR_LINK = re.compile(r"(\d+):(\d+) -> (\S+)")


def parse_device_nodes(output: str) -> tuple[DeviceNode, ...]:
    """Character devices in ``ls -l /dev/nvidia*`` output (directory listings included)."""
    nodes: list[DeviceNode] = []
    directory = "/dev"
    for line in _lines(output):
        header = _LS_DIR_HEADER.fullmatch(line)
        if header:
            directory = header.group(1)
            continue
        match = _LS_CHAR.fullmatch(line)
        if not match:
            continue
        name = match.group(3)
        path = name if name.startswith("/") else posixpath.join(directory, name)
        nodes.append(DeviceNode(path=path, major=int(match.group(1)), minor=int(match.group(2))))
    return tuple(nodes)


def parse_char_links(output: str, exit_code: int) -> tuple[bool, tuple[CharLink, ...]]:
    """Whether /dev/char exists (exit 2 says not), and its links to NVIDIA nodes."""
    if exit_code == 2:
        return False, ()
    links: list[CharLink] = []
    for line in _lines(output):
        match = _CHAR_LINK.search(line)
        if not match:
            continue
        target = posixpath.normpath(posixpath.join("/dev/char", match.group(3)))
        if "nvidia" not in target:
            continue
        links.append(CharLink(major=int(match.group(1)), minor=int(match.group(2)), target=target))
    return True, tuple(links)


def nvidia_devices(nodes_output: str, char_output: str, char_exit_code: int) -> NvidiaDevices:
    present, links = parse_char_links(char_output, char_exit_code)
    return NvidiaDevices(
        nodes=parse_device_nodes(nodes_output), char_dir_present=present, char_links=links
    )


# --- versions, engines, toolkit ----------------------------------------------------------------


def parse_version(text: str) -> Version | None:
    """The first dotted version in text as a tuple: "5.4.2" -> (5, 4, 2), "28.2.2+dfsg1" too."""
    match = _VERSION.search(text)
    if not match:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


_PODMAN_VERSION = re.compile(r"podman version (\S+)", re.IGNORECASE)
_DOCKER_VERSION = re.compile(r"Docker version ([^\s,]+)")


def parse_podman_version(output: str, exit_code: int, quadlet_path: str | None = None) -> Podman:
    """``podman --version``: "podman version 5.4.2"."""
    if exit_code == COMMAND_NOT_FOUND:
        return Podman(present=False)
    match = _PODMAN_VERSION.search(output) if exit_code == 0 else None
    if not match:
        return Podman(present=True, version_text=output.strip(), quadlet_path=quadlet_path)
    return Podman(
        present=True,
        version=parse_version(match.group(1)),
        version_text=match.group(1),
        quadlet_path=quadlet_path,
    )


def parse_quadlet_path(output: str) -> str | None:
    """The first quadlet generator path the host listed (the command prints only existing ones)."""
    for line in _lines(output):
        if line.startswith("/") and line.endswith("/quadlet"):
            return line
    return None


def parse_docker_runtimes(output: str, exit_code: int) -> tuple[tuple[str, ...] | None, str]:
    """``docker info --format '{{json .Runtimes}}'``: runtime names, or None and why not."""
    if exit_code == COMMAND_NOT_FOUND:
        return None, ""
    if exit_code == 0:
        for line in _lines(output):
            if not line.startswith("{"):
                continue  # docker prints WARNING lines beside the JSON
            try:
                runtimes = json.loads(line)
            except ValueError:
                continue
            if isinstance(runtimes, dict):
                return tuple(sorted(str(name) for name in runtimes)), ""
    return None, output.strip() or f"docker info exited {exit_code}"


def parse_docker_version(
    output: str,
    exit_code: int,
    runtimes_output: str = "",
    runtimes_exit_code: int = COMMAND_NOT_FOUND,
) -> Docker:
    """``docker --version`` ("Docker version 28.2.2, build e6534b4") and its runtimes."""
    if exit_code == COMMAND_NOT_FOUND:
        return Docker(present=False)
    runtimes, error = parse_docker_runtimes(runtimes_output, runtimes_exit_code)
    shim = _PODMAN_VERSION.search(output)
    if shim and exit_code == 0:
        # podman-docker: `docker` runs podman; there is no docker daemon to have runtimes
        version = shim.group(1)
        return Docker(
            present=True, version=parse_version(version), version_text=version, podman_shim=True
        )
    match = _DOCKER_VERSION.search(output) if exit_code == 0 else None
    if not match:
        return Docker(
            present=True, version_text=output.strip(), runtimes=runtimes, runtimes_error=error
        )
    return Docker(
        present=True,
        version=parse_version(match.group(1)),
        version_text=match.group(1),
        runtimes=runtimes,
        runtimes_error=error,
    )


_CTK_VERSION = re.compile(r"NVIDIA Container Toolkit CLI version (\S+)")
_CTK_COMMIT = re.compile(r"^commit: ([0-9a-fA-F]+)\s*$", re.MULTILINE)


def parse_nvidia_ctk_version(output: str, exit_code: int) -> ContainerToolkit:
    """``nvidia-ctk --version``: "NVIDIA Container Toolkit CLI version 1.17.8\\ncommit: <sha>"."""
    if exit_code == COMMAND_NOT_FOUND:
        return ContainerToolkit(present=False)
    match = _CTK_VERSION.search(output) if exit_code == 0 else None
    if not match:
        return ContainerToolkit(present=True, message=output.strip())
    commit = _CTK_COMMIT.search(output)
    return ContainerToolkit(
        present=True,
        version=parse_version(match.group(1)),
        version_text=match.group(1),
        commit=commit.group(1) if commit else None,
    )


# --- CDI specs ---------------------------------------------------------------------------------

CDI_FILE_MARKER = "@@td file "
# Driver version from what a generated spec mounts, most telling first: libcuda.so.580.159.04,
# libnvidia-ml.so.<v>, then the enable-cuda-compat hook's --host-driver-version=<v>. Driver
# majors have three digits; that keeps WSL's libcuda.so.1.1 from passing for a version.
_SPEC_DRIVER = (
    re.compile(r"libcuda\.so\.([0-9]{3}\.[0-9]+(?:\.[0-9]+)?)"),
    re.compile(r"libnvidia-ml\.so\.([0-9]{3}\.[0-9]+(?:\.[0-9]+)?)"),
    re.compile(r"--host-driver-version=([0-9]{3}\.[0-9]+(?:\.[0-9]+)?)"),
)


def _load_spec(path: str, text: str) -> Any:
    if path.endswith(".json"):
        return json.loads(text)
    return yaml.safe_load(text)


def parse_cdi_spec(path: str, text: str) -> CdiSpec:
    """One CDI spec file (YAML or JSON) as written by ``nvidia-ctk cdi generate`` or by hand."""
    try:
        doc = _load_spec(path, text)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        syntax = "JSON" if path.endswith(".json") else "YAML"
        return CdiSpec(path=path, error=f"not valid {syntax}: {first}")
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        snippet = text.strip().splitlines()[0][:200] if text.strip() else "empty file"
        return CdiSpec(path=path, error=f"not a CDI spec (no kind): {snippet}")
    devices: list[str] = []
    raw_devices = doc.get("devices")
    if isinstance(raw_devices, list):
        for device in raw_devices:
            if isinstance(device, dict) and device.get("name") is not None:
                devices.append(str(device["name"]))
    driver: str | None = None
    for pattern in _SPEC_DRIVER:
        match = pattern.search(text)
        if match:
            driver = match.group(1)
            break
    version = doc.get("cdiVersion")
    return CdiSpec(
        path=path,
        kind=doc["kind"],
        cdi_version=None if version is None else str(version),
        devices=tuple(devices),
        driver_version=driver,
    )


def parse_cdi_dump(output: str) -> tuple[CdiSpec, ...]:
    """The spec files the host printed, each after a ``@@td file PATH`` line."""
    specs: list[CdiSpec] = []
    path: str | None = None
    body: list[str] = []
    for line in [*output.splitlines(), None]:
        if line is None or line.startswith(CDI_FILE_MARKER):
            if path is not None:
                specs.append(parse_cdi_spec(path, "\n".join(body)))
            if line is not None:
                path, body = line[len(CDI_FILE_MARKER) :].strip(), []
            continue
        if path is not None:
            body.append(line)
    return tuple(specs)


def _group(pairs: Iterable[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    grouped: dict[str, list[str]] = {}
    for key, path in pairs:
        paths = grouped.setdefault(key, [])
        if path not in paths:
            paths.append(path)
    return {key: tuple(paths) for key, paths in sorted(grouped.items()) if len(paths) > 1}


def analyse_cdi(
    specs: Sequence[CdiSpec], driver_version: str | None, gpu_uuids: Sequence[str]
) -> CdiReport:
    """Duplicates, stale specs, and which GPUs are addressable by UUID."""
    valid = [spec for spec in specs if spec.error is None and spec.kind is not None]
    declared = {name for spec in valid for name in spec.qualified_devices}
    stale: tuple[str, ...] = ()
    if driver_version is not None:
        stale = tuple(
            spec.path
            for spec in valid
            if spec.driver_version is not None and spec.driver_version != driver_version
        )
    addressable = tuple(uuid for uuid in gpu_uuids if f"{CDI_GPU_KIND}={uuid}" in declared)
    return CdiReport(
        specs=tuple(specs),
        driver_version=driver_version,
        duplicate_kinds=_group((spec.kind or "", spec.path) for spec in valid),
        conflicting_devices=_group(
            (name, spec.path) for spec in valid for name in spec.qualified_devices
        ),
        stale=stale,
        addressable_uuids=addressable,
        unaddressable_uuids=tuple(uuid for uuid in gpu_uuids if uuid not in addressable),
        all_device=f"{CDI_GPU_KIND}=all" in declared,
    )


# --- SELinux, init, CPUs, disk, ports ----------------------------------------------------------

_SEBOOL = re.compile(r"^container_use_devices\s+-->\s+(on|off)\s*$", re.MULTILINE)
_MODES: dict[str, SelinuxMode] = {
    "enforcing": "enforcing",
    "permissive": "permissive",
    "disabled": "disabled",
}


def parse_selinux(
    getenforce_output: str,
    getenforce_exit_code: int,
    getsebool_output: str,
    getsebool_exit_code: int,
) -> Selinux:
    """``getenforce`` and ``getsebool container_use_devices`` ("container_use_devices --> on")."""
    if getenforce_exit_code == COMMAND_NOT_FOUND and getsebool_exit_code == COMMAND_NOT_FOUND:
        return Selinux(mode="absent", container_use_devices=None)
    lines = _lines(getenforce_output)
    mode: SelinuxMode = "unknown"
    if getenforce_exit_code == 0 and lines:
        mode = _MODES.get(lines[0].lower(), "unknown")
    match = _SEBOOL.search(getsebool_output) if getsebool_exit_code == 0 else None
    if match:
        return Selinux(mode=mode, container_use_devices=match.group(1) == "on")
    message = getsebool_output.strip() if mode != "disabled" else ""
    return Selinux(mode=mode, container_use_devices=None, message=message)


def parse_pid1(output: str, exit_code: int) -> InitSystem:
    """``cat /proc/1/comm`` (or ``ps -p 1 -o comm=``): "systemd" on a systemd host."""
    lines = _lines(output)
    if exit_code != 0 or len(lines) != 1:
        return InitSystem(pid1=None)
    return InitSystem(pid1=lines[0])


def parse_access(output: str, exit_code: int) -> Access:
    """``id -u``, ``id -un`` and ``$SUDO_USER`` (empty without sudo), one a line."""
    lines = [line.strip() for line in output.splitlines()]
    if exit_code != 0 or len(lines) < 2 or not _INT.fullmatch(lines[0]) or not lines[1]:
        raise FactError(f"id: not a user id and name: {output.strip()[:200]!r}")
    sudo_user = lines[2] if len(lines) > 2 and lines[2] else None
    return Access(uid=int(lines[0]), user=lines[1], sudo_user=sudo_user)


# What sudo (and sudo-rs) print with -n where they would ask for a password, or refuse the user.
SUDO_PASSWORD_TEXTS = ("a password is required", "interactive authentication is required")
SUDO_DENIED_TEXTS = ("not in the sudoers file", "may not run sudo", "is not allowed to execute")


def parse_sudo(output: str, exit_code: int) -> SudoProbe:
    """``sudo -n true`` as the SSH user: works, asks for a password, refuses the user, absent."""
    text = " ".join(_lines(output))[:300]
    if exit_code == 0:
        return SudoProbe(state="ok")
    if exit_code == COMMAND_NOT_FOUND:
        return SudoProbe(state="absent", message=text)
    low = text.lower()
    if any(t in low for t in SUDO_PASSWORD_TEXTS):
        return SudoProbe(state="password", message=text)
    if any(t in low for t in SUDO_DENIED_TEXTS):
        return SudoProbe(state="denied", message=text)
    return SudoProbe(state="failed", message=text or f"exit {exit_code}")


_SYSTEMD_VERSION = re.compile(r"systemd ([0-9]+)\b")


def parse_systemd_version(output: str, exit_code: int) -> int | None:
    """``systemctl --version``'s first line, "systemd 257 (257.13-1~deb13u1)": 257; None when
    there is no systemctl or it says something else."""
    match = _SYSTEMD_VERSION.match(output.strip()) if exit_code == 0 else None
    return int(match.group(1)) if match else None


def parse_cgroups(output: str, exit_code: int) -> Cgroups:
    """The cgroup section: ``fs TYPE`` (``stat -fc %T /sys/fs/cgroup``), then on cgroup v2
    (``cgroup2fs``) ``v2 CONTROLLERS`` (its cgroup.controllers), else ``v1 NAMES`` (the
    hierarchies mounted under /sys/fs/cgroup: cpu,cpuacct memory pids ...)."""
    lines = _lines(output)
    if exit_code != 0 or not lines or not lines[0].startswith("fs "):
        raise FactError(f"cgroup: cannot tell the cgroup tree: {output.strip()[:200]!r}")
    found: dict[str, list[str]] = {}
    for line in lines[1:]:
        key, _, rest = line.partition(" ")
        if key in ("v1", "v2"):
            found.setdefault(key, []).extend(rest.split())
    version = "v2" if lines[0] == "fs cgroup2fs" else "v1"
    names: list[str] = []
    for item in found.get(version, []):  # v1: "cpu,cpuacct" is one hierarchy of two
        names += [n for n in item.split(",") if n and n not in names]
    return Cgroups(version=version, controllers=tuple(names))


def parse_nproc(output: str, exit_code: int) -> int:
    """``nproc``: the CPUs this login may use."""
    lines = _lines(output)
    if exit_code != 0 or len(lines) != 1 or not _INT.fullmatch(lines[0]) or int(lines[0]) < 1:
        raise FactError(f"nproc: not a CPU count: {output.strip()[:200]!r}")
    return int(lines[0])


_DF_HEADER_BLOCKS = re.compile(r"\b([0-9]+)-blocks\b")
_DF_ROW = re.compile(r"(.*?)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+%|-)\s+(/.*)")


def parse_df(output: str, exit_code: int) -> DiskSpace:
    """The path asked about, its nearest existing ancestor, then ``df -Pk`` of that ancestor."""
    lines = [line for line in output.splitlines() if line.strip()]
    if exit_code != 0 or len(lines) < 4:
        raise FactError(f"df: no usable output (exit {exit_code}): {output.strip()[:200]!r}")
    requested, checked, header, row = lines[0], lines[1], lines[2], lines[-1]
    blocks = _DF_HEADER_BLOCKS.search(header)
    match = _DF_ROW.fullmatch(row.strip())
    if not blocks or not match:
        raise FactError(f"df: unrecognised output: {header.strip()!r} / {row.strip()!r}")
    unit = int(blocks.group(1))
    return DiskSpace(
        path=requested,
        checked_path=checked,
        filesystem=match.group(1),
        mount_point=match.group(6),
        total_bytes=int(match.group(2)) * unit,
        available_bytes=int(match.group(4)) * unit,
    )


def parse_listen_address(local: str) -> Listener | None:
    """ss's Local Address:Port column: 0.0.0.0:22, *:80, [::]:22, [::1]:631, 127.0.0.53%lo:53."""
    host, sep, port = local.rpartition(":")
    if not sep or not _INT.fullmatch(port) or not host:
        return None
    host, _, interface = host.partition("%")
    address = host.strip("[]")
    interface = interface.strip("[]")
    if not address or int(port) > 65535:
        return None
    return Listener(address=address, port=int(port), interface=interface or None)


def parse_ss(output: str, exit_code: int) -> tuple[Listener, ...]:
    """``ss -Hltn`` (or ``ss -ltn``, its header skipped): every listening TCP socket."""
    if exit_code == COMMAND_NOT_FOUND:
        raise FactError("ss not found on the host (iproute2)")
    if exit_code != 0:
        raise FactError(f"ss exited {exit_code}: {output.strip()[:200]!r}")
    listeners: list[Listener] = []
    for line in _lines(output):
        fields = line.split()
        if len(fields) < 5 or fields[0] != "LISTEN":
            continue
        listener = parse_listen_address(fields[3])
        if listener is not None:
            listeners.append(listener)
    return tuple(listeners)


def parse_engine_paths(output: str) -> dict[str, str]:
    """``command -v podman docker``: engine name -> absolute path, for those found."""
    paths: dict[str, str] = {}
    for line in _lines(output):
        if line.startswith("/") and " " not in line:
            paths.setdefault(posixpath.basename(line), line)
    return paths


_UNIT_FILE = re.compile(r"/(tensorless-[A-Za-z0-9._@-]+)\.(container|service)")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def parse_tool_state(
    output: str, exit_code: int, listed: tuple[str, int] | None = None
) -> ToolState:
    """The survey's ``tensorless`` section (facts/scripts/tool-state.sh): the unit blocks of
    units.sh (``parse_unit_blocks``), then ``@blob SIZE MTIME PATH`` (then ``@stamp TEXT``),
    ``@image REF`` and ``@images-ok ENGINE`` once that engine listed its images, or ``@images-in
    SECTION ENGINE`` when another section listed them (listed: that section's text and exit
    status, a ``REF ...`` line per image), ``@link TARGET PATH`` per snapshot link."""
    if exit_code != 0:
        raise FactError(f"tool state: the survey section exited {exit_code}: {output.strip()}")
    blobs: list[ModelBlobFile] = []
    images: list[str] = []
    images_engine: str | None = None
    links: dict[str, str] = {}
    stamp_for: ModelBlobFile | None = None  # the blob the next @stamp belongs to
    for line in output.splitlines():
        word, _, rest = line.partition(" ")
        if word == "@blob":
            stamp_for = _blob(rest)
            if stamp_for is not None:
                blobs.append(stamp_for)
        elif word == "@stamp" and stamp_for is not None:
            blobs[-1] = stamp_for.model_copy(update={"stamp": rest.strip() or None})
        elif word == "@image":
            images.append(rest.strip())
        elif word == "@images-ok":
            images_engine = rest.strip() or None
        elif word == "@images-in" and listed is not None and listed[1] == 0:
            images += [x.split(" ", 1)[0] for x in listed[0].splitlines() if x.strip()]
            images_engine = rest.split(" ")[-1].strip() or None
        elif word == "@link":
            target, _, link = rest.partition(" ")
            if target and link:
                links.setdefault(link, target)
            stamp_for = None
    return ToolState(
        units=tuple(_tool_unit(u) for u in parse_unit_blocks(output)),
        blobs=tuple(blobs),
        images=tuple(i for i in images if "@sha256:" in i) if images_engine else None,
        images_engine=images_engine,
        links=links,
    )


def _blob(rest: str) -> ModelBlobFile | None:
    """A ``@blob`` line's SIZE MTIME PATH; None: not a blob this tool names (huggingface_hub's
    own, a partial)."""
    size, mtime, path = [*rest.split(" ", 2), "", ""][:3]
    name = posixpath.basename(path)
    if not (size.isdigit() and mtime.isdigit() and _SHA256.fullmatch(name)):
        return None
    return ModelBlobFile(path=path, sha256=name, size=int(size), mtime=int(mtime), stamp=None)


def _tool_unit(unit: DeployedUnit) -> ToolUnit:
    """A unit block as the survey keeps it: a unit file of this tool's name, with its sha256."""
    m = _UNIT_FILE.search(unit.path)
    sha = unit.sha256 or ""
    if not _SHA256.fullmatch(sha) or m is None or not unit.path.endswith(m.group(0)):
        raise FactError(f"tool state: unreadable unit lines for {unit.path!r} (sha256 {sha!r})")
    return ToolUnit(
        path=unit.path,
        name=m.group(1),
        kind="quadlet" if m.group(2) == "container" else "service",
        sha256=sha,
        labels=unit.unit_labels,
        # units.sh asks /health where the unit labels an address, and only there
        health=unit.health if LABEL_HEALTH in unit.unit_labels else None,
        device_log=unit.device_log,
    )


def parse_blob_state(text: str) -> BlobState:
    """Three lines: "size mtime path" or "missing", the stamp (may be empty), the link target."""
    lines = [*text.splitlines(), "", "", ""][:3]
    head = lines[0].split(" ", 2)
    stamp = lines[1].strip() or None
    link = lines[2].strip() or None
    if len(head) != 3 or not all(p.isdigit() for p in head[:2]):
        return BlobState(False, None, None, stamp, link)
    return BlobState(True, int(head[0]), int(head[1]), stamp, link, head[2])


_LABEL_LINE = re.compile(r'(?:Label=|--label" ")"?(io\.tensorless\.[a-z-]+)=([^"\s]*)')


# systemd's Result values of a service (systemd.service(5), org.freedesktop.systemd1.Service):
# none of them is also a SubState, so the @@systemd line's words tell themselves apart
SERVICE_RESULTS = frozenset(
    (
        "success",
        "protocol",
        "timeout",
        "exit-code",
        "signal",
        "core-dump",
        "watchdog",
        "start-limit-hit",
        "resources",
        "oom-kill",
    )
)


def _code(text: str) -> int:
    code = text.strip()
    return int(code) if code.isdigit() else 0


def _systemd(unit: dict[str, Any], rest: str) -> None:
    # units.sh prints NRestarts, Result and SubState; surveys before it printed `systemctl show
    # --value`'s, in systemd's own order (Result first on systemd 252 and 257): each is told by
    # its form
    for word in rest.split():
        if word.isdigit():
            unit["restarts"] = int(word)
        elif word in SERVICE_RESULTS:
            unit["result"] = word
        else:
            unit["sub_state"] = word


def _sha(unit: dict[str, Any], rest: str) -> None:
    parts = rest.split()
    unit["sha256"] = parts[0] if parts else None
    unit["written_sha256"] = parts[1] if len(parts) > 1 else None


def _text(unit: dict[str, Any], rest: str) -> None:
    unit["text"].append(rest)
    for m in _LABEL_LINE.finditer(rest):
        unit["unit_labels"][m.group(1)] = m.group(2)


def _inspect(unit: dict[str, Any], rest: str) -> None:
    fields = rest.split("\t")
    if len(fields) != 3:
        return
    try:
        labels = json.loads(fields[0])
    except ValueError:
        return
    if isinstance(labels, dict):
        unit["container_labels"] = {
            k: str(v) for k, v in labels.items() if k.startswith(LABEL_PREFIX + ".")
        }
        unit["image"] = fields[1].strip() or None
        unit["image_id"] = fields[2].strip() or None


def _metric(unit: dict[str, Any], rest: str) -> None:
    parts = rest.split()
    if len(parts) == 2:
        with contextlib.suppress(ValueError):
            unit.setdefault("metrics", {})[parts[0]] = float(parts[1])


# What each line of a unit block (facts/scripts/units.sh) adds to the unit it belongs to
_UNIT_LINES: dict[str, Callable[[dict[str, Any], str], None]] = {
    "@@active": lambda u, rest: u.update(active=rest.strip() or "unknown"),
    "@@systemd": _systemd,
    "@@sha": _sha,
    "@@prev": lambda u, rest: u.update(previous_sha256=rest.strip() or None),
    "@@prevtext": lambda u, rest: u["previous_text"].append(rest),
    "@@text": _text,
    "@@inspect": _inspect,
    "@@health": lambda u, rest: u.update(health=_code(rest)),
    "@@device": lambda u, rest: u.update(device_log=(*u["device_log"], rest)),
    "@@metrics": lambda u, rest: u.update(metrics_status=_code(rest)),
    "@@metric": _metric,
}
_TEXT_LINES = ("@@text", "@@prevtext")  # a unit file's empty line: the word alone


def _new_unit(line: str) -> dict[str, Any]:
    _, name, kind, path = [*line.split(" ", 3), "", "", ""][:4]
    return {
        "name": name,
        "kind": kind,
        "path": path.strip(),
        "active": "unknown",
        "unit_labels": {},
        "container_labels": {},
        "image": None,
        "image_id": None,
        "health": 0,
        "text": [],
        "previous_text": [],
        "device_log": (),
    }


def _unit(fields: dict[str, Any]) -> DeployedUnit:
    def joined(rows: list[str]) -> str:
        return "\n".join(rows) + "\n" if rows else ""

    text, previous = fields.pop("text"), fields.pop("previous_text")
    return DeployedUnit(**fields, text=joined(text), previous_text=joined(previous))


def parse_unit_blocks(text: str) -> tuple[DeployedUnit, ...]:
    """The unit blocks of facts/scripts/units.sh, the one reader of the unit files: ``@@unit
    NAME KIND PATH``, ``@@active``, ``@@systemd`` (NRestarts, Result and SubState, in any
    order), ``@@sha FILE [WRITTEN]``, ``@@prev SHA``, ``@@prevtext LINE``..., ``@@text
    LINE``..., ``@@inspect JSON``, ``@@device LINE``... (the running start's device lines),
    ``@@health CODE``, and when /metrics was read ``@@metric NAME VALUE``... and ``@@metrics
    CODE``. Other lines (the survey's own, around them) are not a unit's."""
    units: list[dict[str, Any]] = []
    for line in text.splitlines():
        word, sep, rest = line.partition(" ")
        if word == "@@unit" and sep:
            units.append(_new_unit(line))
        elif units and word in _UNIT_LINES and (sep or word in _TEXT_LINES):
            _UNIT_LINES[word](units[-1], rest)
    return tuple(_unit(u) for u in units)


def parse_deployed_units(text: str) -> tuple[DeployedUnit, ...]:
    """What facts/scripts/deployed-units.sh printed: units.sh's blocks, containers included."""
    return parse_unit_blocks(text)


_APP_UUID = re.compile(r"GPU-[0-9A-Fa-f-]{8,64}")


def parse_gpu_apps(output: str, exit_code: int) -> tuple[GpuApp, ...] | None:
    """The survey's ``gpu-apps`` section (scripts/gpu-apps.sh): one ``@app UUID PID MIB NAME``
    line per compute process; None when nvidia-smi could not list them (exit 3) or did not answer
    within the survey's bound (a hung NVML: the nvidia-smi section's gpu.responsive says so)."""
    if exit_code == 3 or exit_code in TIMED_OUT:
        return None
    if exit_code != 0:
        raise FactError(f"gpu apps: the survey section exited {exit_code}: {output.strip()}")
    apps: list[GpuApp] = []
    for line in output.splitlines():
        parts = line.split()
        if len(parts) != 5 or parts[0] != "@app":
            continue
        _, uuid, pid, mib, name = parts
        if not (_APP_UUID.fullmatch(uuid) and pid.isdigit() and mib.isdigit()):
            continue  # [N/A] memory (MIG, some drivers): nothing to count
        apps.append(
            GpuApp(
                gpu_uuid=uuid,
                pid=int(pid),
                used_mib=int(mib),
                container=None if name == "-" else name,
            )
        )
    return tuple(apps)
