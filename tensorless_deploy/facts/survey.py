"""The host survey: POSIX-sh snippets printing every fact in one SSH round trip, and their reading.

Each section runs in its own ``sh -c`` with stderr merged, framed by marker lines, so a failing
tool (nvidia-smi exit 9, a missing binary: exit 127) arrives as text plus exit code, never as a
failed command. The sections run side by side, each bounded in time (``PROBE_TIMEOUT_S``,
``scripts/bound.sh``): one that does not answer reads as exit 124 (``TIMED_OUT``) and the survey
goes on. Pure: building
the script and reading its output do no I/O.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tensorless_deploy import shell
from tensorless_deploy.hub import DEFAULT_MODELS_DIR, host_state_dir
from tensorless_deploy.recipe.text import CONTROL

from .device import DEVICE_LINE
from .errors import FactError
from .maintain import MAINTENANCE_RECORD, parse_maintenance
from .nvidia import (
    DRIVER_PIN_FILE,
    parse_driver_packages,
    parse_engine_labels,
    parse_health_xml,
    parse_kernel_log,
    parse_module_version,
)
from .parsers import (
    NVIDIA_SMI_QUERY,
    TIMED_OUT,
    analyse_cdi,
    nvidia_devices,
    parse_access,
    parse_cdi_dump,
    parse_cgroups,
    parse_df,
    parse_docker_version,
    parse_engine_paths,
    parse_gpu_apps,
    parse_nproc,
    parse_nvidia_ctk_version,
    parse_nvidia_smi,
    parse_pid1,
    parse_podman_version,
    parse_quadlet_path,
    parse_selinux,
    parse_ss,
    parse_sudo,
    parse_systemd_version,
    parse_tool_state,
)
from .values import (
    COMPUTE_CAP,
    Access,
    CdiReport,
    CdiSpec,
    Cgroups,
    ContainerEngines,
    ContainerToolkit,
    DiskSpace,
    DriverModule,
    DriverPackages,
    EngineImage,
    GpuApp,
    GpuReport,
    HealthReport,
    HostFacts,
    InitSystem,
    KernelLog,
    Listener,
    Login,
    MaintenanceRecord,
    NvidiaDevices,
    Selinux,
    Source,
    ToolState,
)

SECTION_MARKER = "@@td section "
EXIT_MARKER = "@@td rc "
TIMEOUT_MARKER = "@@td timeout "
# The one bound of every host probe (each survey section, each fact command): a wedged NVML
# makes every nvidia-smi hang, so nothing may wait on a probe for longer than this.
PROBE_TIMEOUT_S = 20

DEFAULT_CDI_DIRS: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")
QUADLET_PATHS: tuple[str, ...] = ("/usr/libexec/podman/quadlet", "/usr/lib/podman/quadlet")

T = TypeVar("T")


@dataclass(frozen=True)
class Section:
    """One named shell snippet; its exit status is the snippet's own."""

    name: str
    script: str


@dataclass(frozen=True)
class SectionOutput:
    text: str
    exit_code: int

    @property
    def timed_out(self) -> bool:
        return self.exit_code in TIMED_OUT


def _need(command: str) -> str:
    return f"command -v {command} >/dev/null 2>&1 || exit 127"


def access_sections() -> tuple[Section, ...]:
    """Who the commands run as: the uid, its name, and the login sudo ran them for (if any)."""
    return (Section("access", "id -u; id -un; printf '%s\\n' \"${SUDO_USER-}\""),)


def login_sections(sudo: bool) -> tuple[Section, ...]:
    """What the SSH user is before anything runs under sudo, and with sudo whether it works
    without a password: ``sudo -n`` never prompts, and stdin is /dev/null besides."""
    sections = access_sections()
    if sudo:
        sections += (Section("sudo", f"{_need('sudo')}; sudo -n true"),)
    return sections


def gpu_sections() -> tuple[Section, ...]:
    return (Section("nvidia-smi", f"{_need('nvidia-smi')}; {NVIDIA_SMI_QUERY}"),)


def gpu_app_sections() -> tuple[Section, ...]:
    """The compute processes on each card and their containers (the memory verdict counts what
    a model's own instances hold as free when that model is planned again)."""
    return (Section("gpu-apps", shell.load("tensorless_deploy.facts", "gpu-apps")),)


def driver_packages_section() -> Section:
    """The driver's packages, their holds and locks, and tensorless-deploy's apt pin file."""
    script = shell.load("tensorless_deploy.facts", "driver-packages")
    return Section("driver-packages", shell.bind(script, pin_file=DRIVER_PIN_FILE))


def driver_sections() -> tuple[Section, ...]:
    """The loaded kernel module, the driver's NVRM lines since boot, and the cards' health."""
    return (
        Section(
            "nvidia-module",
            "[ -r /proc/driver/nvidia/version ] || exit 2; cat /proc/driver/nvidia/version",
        ),
        Section("kernel-nvrm", shell.load("tensorless_deploy.facts", "kernel-log")),
        Section("nvidia-health", f"{_need('nvidia-smi')}; nvidia-smi -q -x"),
        driver_packages_section(),
        Section(
            ENGINE_LABELS,
            f"{_need('podman')}; podman images --no-trunc --digests --format "
            "'{{.Repository}}@{{.Digest}} {{json .Labels}}'",
        ),
    )


# The section that lists podman's images with their labels; the tool's state takes podman's
# image list from it rather than asking podman again.
ENGINE_LABELS = "engine-labels"


def device_sections() -> tuple[Section, ...]:
    return (
        Section("nvidia-devices", "ls -l /dev/nvidia*"),
        # exit 2: no /dev/char at all; otherwise only the lines that point at NVIDIA nodes
        Section("dev-char", "[ -d /dev/char ] || exit 2; ls -l /dev/char | grep nvidia; exit 0"),
    )


def engine_sections() -> tuple[Section, ...]:
    quadlets = " ".join(shlex.quote(path) for path in QUADLET_PATHS)
    docker_info = "docker info --format '{{json .Runtimes}}'"
    return (
        Section("podman", f"{_need('podman')}; podman --version"),
        Section("quadlet", f'for q in {quadlets}; do [ -x "$q" ] && echo "$q"; done; exit 0'),
        Section("docker", f"{_need('docker')}; docker --version"),
        # one name per `command -v`: dash prints only the first of several
        Section("engine-paths", 'for e in podman docker; do command -v "$e"; done; exit 0'),
        Section(
            "docker-runtimes",
            f"{_need('docker')}; docker --version 2>&1 | grep -q 'podman version' && exit 3; "
            f"{docker_info}",
        ),
    )


def toolkit_sections() -> tuple[Section, ...]:
    return (Section("nvidia-ctk", f"{_need('nvidia-ctk')}; nvidia-ctk --version"),)


def cdi_sections(cdi_dirs: Sequence[str] = DEFAULT_CDI_DIRS) -> tuple[Section, ...]:
    dirs = " ".join(shlex.quote(d) for d in cdi_dirs)
    return (
        Section(
            "cdi",
            f'for d in {dirs}; do for f in "$d"/*.yaml "$d"/*.yml "$d"/*.json; do '
            '[ -f "$f" ] || continue; echo "@@td file $f"; cat "$f"; echo; done; done; exit 0',
        ),
    )


def selinux_sections() -> tuple[Section, ...]:
    return (
        Section("getenforce", f"{_need('getenforce')}; getenforce"),
        Section("getsebool", f"{_need('getsebool')}; getsebool container_use_devices"),
    )


def init_sections() -> tuple[Section, ...]:
    return (
        Section("pid1", "cat /proc/1/comm 2>/dev/null || ps -p 1 -o comm="),
        # which [Service] keys the units may use (RestartSteps= needs systemd 254)
        Section("systemctl", f"{_need('systemctl')}; systemctl --version | head -n 1"),
    )


def cgroup_sections() -> tuple[Section, ...]:
    """The cgroup tree a unit's container lands in, and the controllers it offers (a unit's
    PidsLimit= needs pids): facts.parsers.parse_cgroups."""
    return (
        Section(
            "cgroup",
            't=$(stat -fc %T /sys/fs/cgroup 2>/dev/null) || exit 2; echo "fs $t"; '
            'if [ "$t" = cgroup2fs ]; then echo "v2 $(cat /sys/fs/cgroup/cgroup.controllers)"; '
            'else for d in /sys/fs/cgroup/*; do [ -d "$d" ] && [ ! -L "$d" ] && '
            'echo "v1 ${d##*/}"; done; fi; exit 0',
        ),
    )


def cpu_sections() -> tuple[Section, ...]:
    return (Section("nproc", "nproc 2>/dev/null || getconf _NPROCESSORS_ONLN"),)


def _check_models_dir(models_dir: str) -> None:
    if not models_dir.startswith("/") or "\n" in models_dir or "\r" in models_dir:
        raise FactError(f"models directory {models_dir!r}: must be an absolute one-line path")


def disk_sections(models_dir: str = DEFAULT_MODELS_DIR) -> tuple[Section, ...]:
    _check_models_dir(models_dir)
    quoted = shlex.quote(models_dir)
    return (
        Section(
            "disk",
            f"p={quoted}; printf '%s\\n' \"$p\"; "
            # the nearest existing parent, by the shell alone (a host without dirname would
            # loop here forever): a/b/c -> a/b -> a -> /
            'while [ ! -e "$p" ]; do q=${p%/*}; '
            '[ "$q" != "$p" ] && [ -n "$q" ] || q=/; p=$q; done; '
            'printf \'%s\\n\' "$p"; df -Pk "$p"',
        ),
    )


def tool_sections(models_dir: str = DEFAULT_MODELS_DIR) -> tuple[Section, ...]:
    """What this tool put on the host: units, model blobs and their stamps, engine images."""
    _check_models_dir(models_dir)
    bound = shell.program(
        "tensorless_deploy.facts",
        "tool-state",
        models_dir=models_dir,
        state_dir=host_state_dir(models_dir),
        device_re=DEVICE_LINE,
        podman_images=ENGINE_LABELS,
    )
    return (Section("tensorless", bound),)


def port_sections() -> tuple[Section, ...]:
    return (Section("ports", f"{_need('ss')}; ss -Hltn 2>/dev/null || ss -ltn"),)


def maintenance_sections() -> tuple[Section, ...]:
    """The maintenance window's record, when one is open (facts.maintain)."""
    rec = shlex.quote(MAINTENANCE_RECORD)
    return (Section("maintenance", f"[ -f {rec} ] || exit 0; cat {rec}"),)


def all_sections(
    models_dir: str = DEFAULT_MODELS_DIR, cdi_dirs: Sequence[str] = DEFAULT_CDI_DIRS
) -> tuple[Section, ...]:
    return (
        *access_sections(),
        *gpu_sections(),
        *gpu_app_sections(),
        *driver_sections(),
        *device_sections(),
        *engine_sections(),
        *toolkit_sections(),
        *cdi_sections(cdi_dirs),
        *selinux_sections(),
        *init_sections(),
        *cgroup_sections(),
        *cpu_sections(),
        *disk_sections(models_dir),
        *port_sections(),
        *tool_sections(models_dir),
        *maintenance_sections(),
    )


def bound_preamble() -> str:
    """The shell that bounds probes (``td_start``, ``td_wait``, ``td_show``), once per script."""
    return "export LC_ALL=C\n" + shell.load("tensorless_deploy.facts", "bound")


def survey_script(sections: Iterable[Section]) -> str:
    """One POSIX-sh script printing each section framed by markers. The sections run side by
    side (``td_start``), each under PROBE_TIMEOUT_S; one that does not end in time reads as
    exit 124. The script always exits 0."""
    sections = tuple(sections)
    parts = [bound_preamble()]
    parts += [f"td_start {PROBE_TIMEOUT_S} {shlex.quote(s.script)}" for s in sections]
    parts.append("td_wait")
    exit_marker = shlex.quote(EXIT_MARKER)
    for n, section in enumerate(sections, 1):
        parts.append(f"td_frame {n} {shlex.quote(SECTION_MARKER + section.name)} {exit_marker}")
    parts.append("td_emit")
    parts.append("exit 0")
    return "\n".join(parts)


def bounded_command(script: str) -> str:
    """One fact's command under the survey's bound: its output, then ``TIMEOUT_MARKER`` when it
    ran past PROBE_TIMEOUT_S (read by ``unbounded_output``)."""
    return (
        f"{bound_preamble()}\n"
        f"td_start {PROBE_TIMEOUT_S} {shlex.quote(script)}\n"
        "td_wait\n"
        "td_show; td_r=$?\n"
        f"case $td_r in {'|'.join(map(str, TIMED_OUT))}) "
        f"echo '{TIMEOUT_MARKER}{PROBE_TIMEOUT_S}';; esac\n"
        "exit 0"
    )


def unbounded_output(lines: Iterable[str], what: str) -> list[str]:
    """A bounded command's output lines; FactError when it ran past its bound."""
    out = [line.rstrip("\r") for line in lines]
    if any(line.startswith(TIMEOUT_MARKER) for line in out):
        raise FactError(f"{what}: no answer within {PROBE_TIMEOUT_S} s (the command hung)")
    return out


def split_sections(output: str | Iterable[str]) -> dict[str, SectionOutput]:
    """Section name -> its text and exit code. A section cut short raises FactError."""
    lines = output.splitlines() if isinstance(output, str) else list(output)
    sections: dict[str, SectionOutput] = {}
    name: str | None = None
    body: list[str] = []
    for line in lines:
        line = line.rstrip("\r")
        if name is None:
            if line.startswith(SECTION_MARKER):
                name, body = line[len(SECTION_MARKER) :].strip(), []
            continue
        # the exit marker may be glued to a last line that had no newline of its own
        head, sep, code = line.rpartition(EXIT_MARKER)
        if sep and code.strip().isdigit():
            if head:
                body.append(head)
            sections[name] = SectionOutput("\n".join(body), int(code.strip()))
            name = None
            continue
        body.append(line)
    if name is not None:
        raise FactError(f"host output ended inside section {name!r} (no exit status)")
    return sections


def _section(sections: Mapping[str, SectionOutput], name: str) -> SectionOutput:
    try:
        return sections[name]
    except KeyError:
        raise FactError(f"host output lacks section {name!r}") from None


# --- readers: sections -> one fact value ------------------------------------------------------


def read_gpus(sections: Mapping[str, SectionOutput]) -> GpuReport:
    smi = _section(sections, "nvidia-smi")
    return parse_nvidia_smi(smi.text, smi.exit_code)


def read_module(sections: Mapping[str, SectionOutput]) -> DriverModule:
    module = _section(sections, "nvidia-module")
    return parse_module_version(module.text, module.exit_code)


def read_kernel_log(sections: Mapping[str, SectionOutput]) -> KernelLog:
    log = _section(sections, "kernel-nvrm")
    return parse_kernel_log(log.text, log.exit_code)


def read_health(sections: Mapping[str, SectionOutput]) -> HealthReport:
    health = _section(sections, "nvidia-health")
    return parse_health_xml(health.text, health.exit_code)


def read_maintenance(sections: Mapping[str, SectionOutput]) -> MaintenanceRecord | None:
    record = _section(sections, "maintenance")
    return parse_maintenance(record.text, record.exit_code)


def read_driver_packages(sections: Mapping[str, SectionOutput]) -> DriverPackages:
    packages = _section(sections, "driver-packages")
    return parse_driver_packages(packages.text, packages.exit_code)


def read_engine_labels(sections: Mapping[str, SectionOutput]) -> dict[str, EngineImage]:
    images = _section(sections, ENGINE_LABELS)
    return parse_engine_labels(images.text, images.exit_code)


def read_devices(sections: Mapping[str, SectionOutput]) -> NvidiaDevices:
    char = _section(sections, "dev-char")
    return nvidia_devices(_section(sections, "nvidia-devices").text, char.text, char.exit_code)


def read_engines(sections: Mapping[str, SectionOutput]) -> ContainerEngines:
    podman = _section(sections, "podman")
    docker = _section(sections, "docker")
    runtimes = _section(sections, "docker-runtimes")
    # surveys captured before the engine-paths section existed leave the paths unknown
    where = sections.get("engine-paths")
    paths = parse_engine_paths(where.text) if where is not None else {}
    p = parse_podman_version(
        podman.text, podman.exit_code, parse_quadlet_path(_section(sections, "quadlet").text)
    )
    d = parse_docker_version(docker.text, docker.exit_code, runtimes.text, runtimes.exit_code)
    return ContainerEngines(
        podman=p.model_copy(update={"path": paths.get("podman")}) if p.present else p,
        docker=d.model_copy(update={"path": paths.get("docker")}) if d.present else d,
    )


def read_toolkit(sections: Mapping[str, SectionOutput]) -> ContainerToolkit:
    ctk = _section(sections, "nvidia-ctk")
    return parse_nvidia_ctk_version(ctk.text, ctk.exit_code)


def read_cdi_specs(sections: Mapping[str, SectionOutput]) -> tuple[CdiSpec, ...]:
    return parse_cdi_dump(_section(sections, "cdi").text)


def read_selinux(sections: Mapping[str, SectionOutput]) -> Selinux:
    mode = _section(sections, "getenforce")
    boolean = _section(sections, "getsebool")
    return parse_selinux(mode.text, mode.exit_code, boolean.text, boolean.exit_code)


def read_init(sections: Mapping[str, SectionOutput]) -> InitSystem:
    pid1 = _section(sections, "pid1")
    init = parse_pid1(pid1.text, pid1.exit_code)
    # surveys captured before the systemctl section existed leave the version unknown
    ctl = sections.get("systemctl")
    if ctl is None:
        return init
    return init.model_copy(
        update={"systemd_version": parse_systemd_version(ctl.text, ctl.exit_code)}
    )


def read_cgroups(sections: Mapping[str, SectionOutput]) -> Cgroups:
    cgroup = _section(sections, "cgroup")
    return parse_cgroups(cgroup.text, cgroup.exit_code)


def read_access(sections: Mapping[str, SectionOutput]) -> Access:
    access = _section(sections, "access")
    return parse_access(access.text, access.exit_code)


def read_login(sections: Mapping[str, SectionOutput]) -> Login:
    """``login_sections``' output: the login's access, and the sudo probe where it ran."""
    sudo = sections.get("sudo")
    probe = parse_sudo(sudo.text, sudo.exit_code) if sudo is not None else None
    return Login(access=read_access(sections), sudo=probe)


def read_cpus(sections: Mapping[str, SectionOutput]) -> int:
    nproc = _section(sections, "nproc")
    return parse_nproc(nproc.text, nproc.exit_code)


def read_disk(sections: Mapping[str, SectionOutput]) -> DiskSpace:
    disk = _section(sections, "disk")
    return parse_df(disk.text, disk.exit_code)


def read_listeners(sections: Mapping[str, SectionOutput]) -> tuple[Listener, ...]:
    ports = _section(sections, "ports")
    return parse_ss(ports.text, ports.exit_code)


def read_gpu_apps(sections: Mapping[str, SectionOutput]) -> tuple[GpuApp, ...] | None:
    apps = _section(sections, "gpu-apps")
    return parse_gpu_apps(apps.text, apps.exit_code)


def read_tool(sections: Mapping[str, SectionOutput]) -> ToolState:
    tool = _section(sections, "tensorless")
    listed = sections.get(ENGINE_LABELS)
    return parse_tool_state(
        tool.text, tool.exit_code, None if listed is None else (listed.text, listed.exit_code)
    )


# --- HostFacts ---------------------------------------------------------------------------------


def build_host_facts(
    *,
    gpus: GpuReport,
    devices: NvidiaDevices | None = None,
    engines: ContainerEngines | None = None,
    toolkit: ContainerToolkit | None = None,
    cdi_specs: Sequence[CdiSpec] | None = None,
    selinux: Selinux | None = None,
    init: InitSystem | None = None,
    access: Access | None = None,
    cgroups: Cgroups | None = None,
    cpus: int | None = None,
    disk: DiskSpace | None = None,
    listeners: Sequence[Listener] | None = None,
    tool: ToolState | None = None,
    gpu_apps: Sequence[GpuApp] | None = None,
    module: DriverModule | None = None,
    kernel_log: KernelLog | None = None,
    health: HealthReport | None = None,
    engine_images: Mapping[str, EngineImage] | None = None,
    driver_packages: DriverPackages | None = None,
    maintenance: MaintenanceRecord | None = None,
    problems: Sequence[str] = (),
    source: Source = "host",
) -> HostFacts:
    """HostFacts from parsed pieces; the CDI specs are judged against the GPUs' driver here."""
    cdi: CdiReport | None = None
    if cdi_specs is not None:
        uuids = [gpu.uuid for gpu in gpus.gpus if gpu.uuid is not None]
        cdi = analyse_cdi(cdi_specs, gpus.driver_version, uuids)
    return HostFacts.model_validate(
        {
            "source": source,
            "gpus": gpus,
            "devices": devices,
            "engines": engines,
            "toolkit": toolkit,
            "cdi": cdi,
            "selinux": selinux,
            "init": init,
            "access": access,
            "cgroups": cgroups,
            "cpus": cpus,
            "disk": disk,
            "listeners": None if listeners is None else tuple(listeners),
            "tool": tool,
            "gpu_apps": None if gpu_apps is None else tuple(gpu_apps),
            "module": module,
            "kernel_log": kernel_log,
            "health": health,
            "engine_images": None if engine_images is None else dict(engine_images),
            "driver_packages": driver_packages,
            "maintenance": maintenance,
            "problems": tuple(problems),
        }
    )


def host_facts_from_survey(output: str | Iterable[str]) -> HostFacts:
    """HostFacts from the output of ``survey_script(all_sections(...))``.

    A section whose output cannot be read leaves its field None and says why in ``problems``;
    only a survey without its nvidia-smi section, or one cut short, raises FactError.
    """
    sections = split_sections(output)
    problems: list[str] = []

    def read(name: str, reader: Callable[[Mapping[str, SectionOutput]], T]) -> T | None:
        try:
            return reader(sections)
        except FactError as exc:
            problems.append(f"{name}: {exc.message}")
            return None

    return build_host_facts(
        gpus=read_gpus(sections),
        devices=read("devices", read_devices),
        engines=read("engines", read_engines),
        toolkit=read("toolkit", read_toolkit),
        cdi_specs=read("cdi", read_cdi_specs),
        selinux=read("selinux", read_selinux),
        init=read("init", read_init),
        # surveys captured before the section existed say nothing of who ran them
        access=read("access", read_access) if "access" in sections else None,
        # surveys captured before the cgroup section existed leave the tree unknown
        cgroups=read("cgroup", read_cgroups) if "cgroup" in sections else None,
        cpus=read("cpus", read_cpus),
        disk=read("disk", read_disk),
        listeners=read("ports", read_listeners),
        # surveys captured before the section existed say nothing of the tool's own state
        tool=read("tensorless", read_tool) if "tensorless" in sections else None,
        gpu_apps=read("gpu-apps", read_gpu_apps) if "gpu-apps" in sections else None,
        module=read("nvidia-module", read_module) if "nvidia-module" in sections else None,
        kernel_log=read("kernel-nvrm", read_kernel_log) if "kernel-nvrm" in sections else None,
        health=read("nvidia-health", read_health) if "nvidia-health" in sections else None,
        engine_images=read(ENGINE_LABELS, read_engine_labels)
        if ENGINE_LABELS in sections
        else None,
        driver_packages=read("driver-packages", read_driver_packages)
        if "driver-packages" in sections
        else None,
        maintenance=read("maintenance", read_maintenance) if "maintenance" in sections else None,
        problems=problems,
    )


# --- offline: HostFacts from inventory data ----------------------------------------------------

INVENTORY_KEYS: tuple[str, ...] = ("gpus", "driver_version", "cpus")
INVENTORY_GPU_KEYS: tuple[str, ...] = (
    "name",
    "compute_cap",
    "memory_total_mib",
    "memory_used_mib",
    "driver_version",
    "uuid",
    "index",
    "count",
)
MAX_INVENTORY_GPUS = 64  # cards one host's data may describe (count included)
_MIB_MAX = 2**31 - 1
_DRIVER = re.compile(r"[0-9]+(\.[0-9]+)+")
_GPU_UUID = re.compile(r"GPU-[0-9A-Fa-f-]{8,64}")
_INVENTORY_FIX = (
    'give gpus as a list of {"name": ..., "compute_cap": "6.0", "memory_total_mib": 16384'
    '[, "memory_used_mib", "driver_version": "535.183.01", "uuid": "GPU-...", "count": N]}'
)


class InventoryDataError(FactError):
    """Inventory host data of the wrong shape: which key (``gpus[0].memory_total_mib``), why."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"inventory host data: {key}: {why}", fix=_INVENTORY_FIX)
        self.key, self.why = key, why


def _inventory_error(key: str, why: str) -> InventoryDataError:
    return InventoryDataError(key, why)


def _shown(value: object) -> str:
    """A value in an inventory error: short, one line, its type named."""
    text = repr(value)
    text = text if len(text) <= 60 else text[:60] + "..."
    return f"{text} ({type(value).__name__})"


def _whole(value: object, key: str, what: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _inventory_error(key, f"must be {what} from {low} to {high:,}, not {_shown(value)}")
    return value


def _text(value: object, key: str, pattern: re.Pattern[str] | None, what: str) -> str:
    ok = isinstance(value, str) and value.strip() != "" and not CONTROL.search(value)
    if not ok or (pattern is not None and not pattern.fullmatch(str(value))):
        raise _inventory_error(key, f"must be {what}, not {_shown(value)}")
    return str(value)


def _inventory_gpu(raw: object, key: str, driver: str | None) -> tuple[dict[str, Any], int]:
    """One entry of gpus, checked key by key: the row nvidia-smi would give, and its count."""
    if not isinstance(raw, Mapping):
        raise _inventory_error(key, f"must be a mapping of GPU facts, not {_shown(raw)}")
    unknown = [k for k in raw if k not in INVENTORY_GPU_KEYS]
    if unknown:
        raise _inventory_error(
            f"{key}.{unknown[0]}" if isinstance(unknown[0], str) else key,
            f"unknown key (a GPU has: {', '.join(INVENTORY_GPU_KEYS)})",
        )
    for required in ("name", "compute_cap", "memory_total_mib"):
        if required not in raw:
            raise _inventory_error(f"{key}.{required}", "is required")
    total = _whole(raw["memory_total_mib"], f"{key}.memory_total_mib", "MiB", 1, _MIB_MAX)
    row: dict[str, Any] = {
        "name": _text(raw["name"], f"{key}.name", None, "the GPU's name, one line of text"),
        "compute_cap": _text(
            raw["compute_cap"], f"{key}.compute_cap", COMPUTE_CAP, 'a string such as "6.0"'
        ),
        "memory_total_mib": total,
        "memory_used_mib": None,
        "driver_version": driver,
        "uuid": None,
    }
    if raw.get("memory_used_mib") is not None:
        row["memory_used_mib"] = _whole(
            raw["memory_used_mib"], f"{key}.memory_used_mib", "MiB", 0, total
        )
    if raw.get("driver_version") is not None:
        row["driver_version"] = _text(
            raw["driver_version"],
            f"{key}.driver_version",
            _DRIVER,
            'a version such as "535.183.01"',
        )
    if raw.get("uuid") is not None:
        row["uuid"] = _text(raw["uuid"], f"{key}.uuid", _GPU_UUID, '"GPU-" and its hex uuid')
    if raw.get("index") is not None:
        row["index"] = _whole(raw["index"], f"{key}.index", "a GPU index", 0, MAX_INVENTORY_GPUS)
    count = _whole(raw.get("count", 1), f"{key}.count", "a number of cards", 1, MAX_INVENTORY_GPUS)
    if count > 1 and (row["uuid"] is not None or "index" in row):
        what = "uuid" if row["uuid"] is not None else "index"
        raise _inventory_error(f"{key}.{what}", f"one {what} cannot name {count} cards (count)")
    return row, count


def host_facts_from_inventory(data: Mapping[str, Any]) -> HostFacts:
    """HostFacts for offline planning from inventory host data; other keys are ignored.

    ``gpus``: list of mappings with ``name``, ``compute_cap`` ("6.0"), ``memory_total_mib``,
    optionally ``memory_used_mib``, ``driver_version``, ``uuid``, ``index`` and ``count`` (that
    many identical cards); ``driver_version`` and ``cpus`` optional. Everything else stays
    unknown (None). Every value is checked by type and range: a wrong one raises
    InventoryDataError naming the key (``gpus[0].memory_total_mib``), never a traceback.
    """
    raw_gpus = data.get("gpus")
    if not isinstance(raw_gpus, (list, tuple)) or not raw_gpus:
        raise _inventory_error("gpus", f"must be a non-empty list, not {_shown(raw_gpus)}")
    driver = data.get("driver_version")
    if driver is not None:
        driver = _text(driver, "driver_version", _DRIVER, 'a version such as "535.183.01"')
    rows: list[dict[str, Any]] = []
    for n, raw in enumerate(raw_gpus):
        row, count = _inventory_gpu(raw, f"gpus[{n}]", driver)
        if len(rows) + count > MAX_INVENTORY_GPUS:
            raise _inventory_error("gpus", f"describes more than {MAX_INVENTORY_GPUS} cards")
        rows.extend(dict(row) for _ in range(count))
    gpus: list[dict[str, Any]] = []
    for position, row in enumerate(rows):
        row.setdefault("index", position)
        gpus.append(row)
    for what in ("index", "uuid"):
        seen = [g[what] for g in gpus if g[what] is not None]
        if len(set(seen)) != len(seen):
            raise _inventory_error("gpus", f"names a GPU {what} twice")
    cpus = data.get("cpus")
    if cpus is not None:
        cpus = _whole(cpus, "cpus", "a number of CPUs", 1, 65536)
    try:
        report = GpuReport.model_validate({"state": "ok", "gpus": gpus})
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise _inventory_error("gpus", str(exc).replace("\n", "; ")) from None
    return build_host_facts(gpus=report, cpus=cpus, source="inventory")
