"""Typed values of what a GPU host is: the parsers' results, and the HostFacts decisions consume.

Everything here is data. A field that is ``None`` means *not known* (not gathered, or given as
inventory data that did not say), never "absent": absence has its own explicit state or flag.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    computed_field,
    field_validator,
    model_validator,
)

from tensorless_deploy.hub import stamp_text

Version = tuple[int, ...]

# Podman versions that gate unit kinds (docs/field-notes.md#quadlet-and-systemd): quadlet exists
# from 4.4, but the keys every unit of this tool needs (HealthCmd=, HealthOnFailure=, Tmpfs= from
# 4.5, PidsLimit= from 4.7: read in quadlet.go of each tag) only from 4.7, so an older podman gets
# the plain unit, which spells them as podman flags; Notify=healthy from 5.0.
QUADLET_MIN_PODMAN: Version = (4, 7)
NOTIFY_HEALTHY_MIN_PODMAN: Version = (5, 0)
CDI_GPU_KIND = "nvidia.com/gpu"
COMPUTE_CAP = re.compile(r"[0-9]+\.[0-9]+")


class FactModel(BaseModel):
    """Base of every fact value: immutable, unknown keys refused.

    Derived (computed) fields appear in dumps and are dropped on input, so a dumped value
    reads back as itself (facts cached as JSON, doctor --json fed to plan).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_derived(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.model_computed_fields:
            return {k: v for k, v in data.items() if k not in cls.model_computed_fields}
        return data


# --- GPUs (nvidia-smi) -------------------------------------------------------------------------

GpuState = Literal["ok", "absent", "no_driver", "driver_mismatch", "no_devices", "hung", "failed"]


class Gpu(FactModel):
    """One card as nvidia-smi lists it (or as an inventory says it is)."""

    index: int
    uuid: str | None  # "GPU-<uuid>"; None only for inventory GPUs given without one
    name: str
    compute_cap: str | None  # "6.0"; None when nvidia-smi says [N/A]
    memory_total_mib: int | None
    memory_used_mib: int | None
    driver_version: str | None
    # nvidia-smi's pci.bus_id ("00000000:04:00.0"): what ties the CUDA device an instance
    # reports to this card (decisions.device); None: not read. Kept out of dumps (facts JSON).
    pci_bus_id: str | None = Field(default=None, exclude=True)

    @field_validator("compute_cap")
    @classmethod
    def _dotted_pair(cls, value: str | None) -> str | None:
        if value is not None and not COMPUTE_CAP.fullmatch(value):
            raise ValueError("compute capability must look like 6.0 or 12.0")
        return value

    @computed_field  # type: ignore[prop-decorator]
    @property
    def memory_free_mib(self) -> int | None:
        if self.memory_total_mib is None or self.memory_used_mib is None:
            return None
        return self.memory_total_mib - self.memory_used_mib

    @computed_field  # type: ignore[prop-decorator]
    @property
    def compute_cap_tuple(self) -> tuple[int, int] | None:
        if self.compute_cap is None:
            return None
        major, _, minor = self.compute_cap.partition(".")
        return int(major), int(minor)


class GpuReport(FactModel):
    """What nvidia-smi said: the GPUs, or which of the distinct ways it failed.

    ``absent``: no nvidia-smi on the host. ``no_driver``: exit 9, the kernel driver is not
    loaded. ``driver_mismatch``: NVML and kernel module versions differ (reboot pending).
    ``no_devices``: the driver is up and sees no card. ``hung``: nvidia-smi did not answer
    within the survey's bound (a wedged NVML: one dying card hangs every call). ``failed``:
    anything else, ``message``
    carries nvidia-smi's words, ``invalid_field`` the field it refused (compute_cap before 510).
    """

    state: GpuState
    gpus: tuple[Gpu, ...] = ()
    exit_code: int | None = None
    message: str = ""
    invalid_field: str | None = None
    warnings: tuple[str, ...] = ()  # lines nvidia-smi printed beside the CSV rows

    @computed_field  # type: ignore[prop-decorator]
    @property
    def driver_version(self) -> str | None:
        for gpu in self.gpus:
            if gpu.driver_version is not None:
                return gpu.driver_version
        return None


class GpuApp(FactModel):
    """One compute process on a GPU, as `nvidia-smi --query-compute-apps` lists it, and the
    container it runs in (its name: a unit of this tool names its container after itself)."""

    gpu_uuid: str
    pid: int
    used_mib: int
    container: str | None = None


# --- device nodes ------------------------------------------------------------------------------


class DeviceNode(FactModel):
    """A character device node under /dev (``ls -l`` of /dev/nvidia*)."""

    path: str
    major: int
    minor: int


class CharLink(FactModel):
    """A /dev/char/MAJOR:MINOR symlink that points at an NVIDIA node."""

    major: int
    minor: int
    target: str


class NvidiaDevices(FactModel):
    """NVIDIA device nodes and their /dev/char links (systemd's daemon-reload needs them)."""

    nodes: tuple[DeviceNode, ...]
    char_dir_present: bool
    char_links: tuple[CharLink, ...]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def uvm_present(self) -> bool:
        return any(node.path == "/dev/nvidia-uvm" for node in self.nodes)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def missing_char_links(self) -> tuple[str, ...]:
        linked = {(link.major, link.minor) for link in self.char_links}
        return tuple(n.path for n in self.nodes if (n.major, n.minor) not in linked)


# --- container engines and toolkit -------------------------------------------------------------


class Podman(FactModel):
    present: bool
    version: Version | None = None
    version_text: str = ""
    quadlet_path: str | None = None  # the quadlet generator binary, where found
    path: str | None = None  # where `command -v podman` found it (None: not asked)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def quadlet_supported(self) -> bool:
        """Podman new enough for quadlet *and* its generator installed."""
        return (
            self.version is not None
            and self.version >= QUADLET_MIN_PODMAN
            and self.quadlet_path is not None
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def notify_healthy_supported(self) -> bool:
        return self.version is not None and self.version >= NOTIFY_HEALTHY_MIN_PODMAN


class Docker(FactModel):
    present: bool
    version: Version | None = None
    version_text: str = ""
    podman_shim: bool = False  # `docker` is podman-docker's wrapper around podman
    path: str | None = None  # where `command -v docker` found it (None: not asked)
    runtimes: tuple[str, ...] | None = None  # None: daemon not asked or not answering
    runtimes_error: str = ""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nvidia_runtime(self) -> bool | None:
        return None if self.runtimes is None else "nvidia" in self.runtimes


class ContainerEngines(FactModel):
    podman: Podman
    docker: Docker


class ContainerToolkit(FactModel):
    """The NVIDIA Container Toolkit CLI (``nvidia-ctk``)."""

    present: bool
    version: Version | None = None
    version_text: str = ""
    commit: str | None = None
    message: str = ""  # its output when it ran but did not print a version


# --- CDI ---------------------------------------------------------------------------------------


class CdiSpec(FactModel):
    """One CDI spec file: its kind, device names, and the driver it was generated for."""

    path: str
    kind: str | None = None
    cdi_version: str | None = None
    devices: tuple[str, ...] = ()
    driver_version: str | None = None
    error: str | None = None  # unreadable or not a CDI spec

    @computed_field  # type: ignore[prop-decorator]
    @property
    def qualified_devices(self) -> tuple[str, ...]:
        if self.kind is None:
            return ()
        return tuple(f"{self.kind}={name}" for name in self.devices)


class CdiReport(FactModel):
    """The CDI specs on a host judged against its driver and GPUs."""

    specs: tuple[CdiSpec, ...]
    driver_version: str | None  # the host's current driver, the yardstick for staleness
    duplicate_kinds: dict[str, tuple[str, ...]]  # kind -> spec paths, only kinds in >1 file
    conflicting_devices: dict[str, tuple[str, ...]]  # "kind=name" -> paths declaring it twice+
    stale: tuple[str, ...]  # spec paths generated for another driver version
    addressable_uuids: tuple[str, ...]  # host GPUs reachable as nvidia.com/gpu=GPU-<uuid>
    unaddressable_uuids: tuple[str, ...]
    all_device: bool  # nvidia.com/gpu=all declared


# --- the rest ----------------------------------------------------------------------------------

SelinuxMode = Literal["enforcing", "permissive", "disabled", "absent", "unknown"]


class Selinux(FactModel):
    mode: SelinuxMode
    container_use_devices: bool | None  # None: SELinux off or absent, or the boolean unknown
    message: str = ""


class Access(FactModel):
    """Who a host's commands run as: the survey's ``id -u``/``id -un`` (under pyinfra's sudo
    where the inventory asks for it: then root, with ``SUDO_USER`` naming the login)."""

    uid: int
    user: str
    sudo_user: str | None = None  # the login that sudo ran them for (SUDO_USER); None: no sudo

    @computed_field  # type: ignore[prop-decorator]
    @property
    def root(self) -> bool:
        return self.uid == 0


SudoState = Literal["ok", "password", "denied", "absent", "failed"]


class SudoProbe(FactModel):
    """``sudo -n true`` as the SSH user, before anything runs under sudo: whether sudo works
    without a password (``password``: it asks for one; ``denied``: the user may not use it)."""

    state: SudoState
    message: str = ""


class Login(FactModel):
    """The SSH user as it logs in (no sudo), and, where the inventory asks for sudo, whether
    sudo works without a password: read before any command runs under sudo."""

    access: Access
    sudo: SudoProbe | None = None  # None: the inventory does not ask for sudo


class InitSystem(FactModel):
    pid1: str | None  # the command name of PID 1
    # `systemctl --version`'s number (257); None: not read. Kept out of dumps (facts JSON).
    systemd_version: int | None = Field(default=None, exclude=True)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def systemd(self) -> bool:
        return self.pid1 == "systemd"


CgroupVersion = Literal["v1", "v2"]


class Cgroups(FactModel):
    """The cgroup tree the container engine will put a unit's container in: cgroup v2 (one
    tree, /sys/fs/cgroup/cgroup.controllers) or v1 (a hierarchy per controller), and the
    controllers it offers. A controller the unit asks for (PidsLimit= needs pids) that is not
    here makes the OCI runtime refuse to create the container."""

    version: CgroupVersion
    controllers: tuple[str, ...]

    def has(self, controller: str) -> bool:
        return controller in self.controllers


class DiskSpace(FactModel):
    """Free space where models go; a path not created yet is judged by its nearest parent."""

    path: str
    checked_path: str
    filesystem: str
    mount_point: str
    total_bytes: int
    available_bytes: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def path_exists(self) -> bool:
        return self.checked_path == self.path


ListenerFamily = Literal["ipv4", "ipv6", "any"]


class Listener(FactModel):
    """A listening TCP socket as ``ss -Hltn`` shows it (brackets and %scope removed)."""

    address: str  # "0.0.0.0", "127.0.0.1", "::", "::1", "::ffff:127.0.0.1", "*" (dual stack)
    port: int
    interface: str | None = None  # bound to one device (SO_BINDTODEVICE), "%lo" in ss

    @computed_field  # type: ignore[prop-decorator]
    @property
    def family(self) -> ListenerFamily:
        if self.address == "*":
            return "any"
        return "ipv6" if ":" in self.address else "ipv4"


def _normal_address(address: str) -> tuple[ListenerFamily, str]:
    """Family and canonical text of an address; IPv4-mapped IPv6 counts as IPv4."""
    if address in ("*", ""):
        return "any", "*"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return ("ipv6" if ":" in address else "ipv4"), address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return "ipv4", str(ip.ipv4_mapped)
    return ("ipv6" if ip.version == 6 else "ipv4"), str(ip)


def listener_blocks(listener: Listener, port: int, bind_address: str) -> bool:
    """Whether binding ``bind_address:port`` would fail because of ``listener``.

    ``*`` (dual stack) blocks every address; a wildcard of one family blocks that family; an
    IPv6-only ``[::]`` does not block IPv4 (ss prints a dual-stack socket as ``*``). Ask with
    ``bind_address="*"`` for a dual-stack bind, ``"::"`` for IPv6 only. Checked against the
    kernel's own bind() in tests/test_facts_shell.py.
    """
    if listener.port != port:
        return False
    lfam, laddr = _normal_address(listener.address)
    bfam, baddr = _normal_address(bind_address)
    if lfam == "any" or bfam == "any":
        return True
    if lfam != bfam:
        return False
    wildcard = "0.0.0.0" if lfam == "ipv4" else "::"
    return wildcard in (laddr, baddr) or laddr == baddr


def blocking_listeners(
    listeners: Iterable[Listener], port: int, bind_address: str
) -> tuple[Listener, ...]:
    """The listeners that would stop a server binding ``bind_address:port``."""
    return tuple(lst for lst in listeners if listener_blocks(lst, port, bind_address))


# --- the driver's kernel module, its kernel log, the cards' health ----------------------------

ModuleFlavour = Literal["proprietary", "open"]


class DriverModule(FactModel):
    """The loaded NVIDIA kernel module as ``/proc/driver/nvidia/version`` names it:
    ``NVIDIA UNIX x86_64 Kernel Module  535.183.01`` (proprietary) or ``NVIDIA UNIX Open Kernel
    Module for x86_64  580.159.04`` (open). ``loaded`` False: no such file (no module loaded)."""

    loaded: bool
    version: str | None = None
    flavour: ModuleFlavour | None = None
    text: str = ""  # the file's first line, as the host printed it


class LegacyNotice(FactModel):
    """The driver's refusal of a card it no longer supports, from the kernel log: ``NVRM: The
    NVIDIA Tesla P100-PCIE-16GB GPU installed in this system is supported through the NVIDIA
    580.xx Legacy drivers ... The 590.44.01 NVIDIA driver will ignore this GPU``."""

    card: str  # "Tesla P100-PCIE-16GB"
    legacy_branch: str  # "580.xx"
    driver_version: str  # the driver that ignores it: "590.44.01"


class OpenModuleRefusal(FactModel):
    """``NVRM: The NVIDIA GPU 0000:03:00.0 (PCI ID: 10de:1bb3) installed in this system is not
    supported by open nvidia.ko because it does not include the required GPU System Processor
    (GSP).``: the open module ignoring a card older than Turing."""

    pci: str
    pci_id: str


class XidEvent(FactModel):
    """``NVRM: Xid (PCI:0000:07:00): 48, pid=..., An uncorrectable double bit error ...``."""

    pci: str  # "PCI:0000:07:00"
    code: int
    text: str  # the rest of the line


KernelLogSource = Literal["journal", "dmesg"]


class KernelLog(FactModel):
    """The NVRM lines of the kernel log since boot (the journal's, else dmesg's)."""

    source: KernelLogSource | None  # None: neither could be read
    legacy: tuple[LegacyNotice, ...] = ()
    open_refusals: tuple[OpenModuleRefusal, ...] = ()
    xids: tuple[XidEvent, ...] = ()
    message: str = ""  # why it could not be read


class CardHealth(FactModel):
    """One card's health as ``nvidia-smi -q -x`` reports it; None: not reported ([N/A]).

    ECC counters are the card's (device memory and caches): single-bit errors are corrected,
    double-bit ones are not. Volatile counts run since the driver loaded, aggregate ones for the
    card's life. Retired pages are those the driver took out of use; a pending retirement (or
    a pending row remap on later cards) takes effect at the next reboot."""

    index: int  # position in nvidia-smi's list, as --query-gpu's index
    uuid: str | None
    name: str
    pci_bus_id: str | None
    persistence_mode: str | None  # "Enabled" / "Disabled"
    ecc_mode: str | None  # "Enabled" / "Disabled"
    volatile_sbe: int | None = None
    volatile_dbe: int | None = None
    aggregate_sbe: int | None = None
    aggregate_dbe: int | None = None
    retired_sbe_pages: int | None = None
    retired_dbe_pages: int | None = None
    retirement_pending: bool | None = None  # pages (or rows) to retire at the next reboot
    remap_failed: bool | None = None  # a row remap that failed (Ampere and later)
    throttle_active: tuple[str, ...] = ()  # clock event/throttle reasons that are Active
    performance_state: str | None = None  # "P0" .. "P12"
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    recovery_action: str | None = None  # the driver's own advice (580+): "None", "GPU Reset"


PackageManager = Literal["apt", "dnf"]


class DriverPackages(FactModel):
    """The driver's packages as the host's package manager knows them, and what holds them:
    dpkg's hold selection (what ``apt-mark hold`` sets), dnf's version-lock list, and the lines
    of tensorless-deploy's own apt pin file. ``manager`` None: neither dpkg nor rpm here."""

    manager: PackageManager | None
    packages: dict[str, str] = {}  # name -> installed version ("535.183.01-1", "3:580.65.06-1")
    held: tuple[str, ...] = ()
    locks: tuple[str, ...] = ()  # dnf versionlock entries, as it lists them
    pin: str | None = None  # tensorless-deploy's apt pin file (None: not there)

    def of_driver(self, version: str) -> tuple[str, ...]:
        """The packages of this driver version (their version, past any epoch, starts with
        it): what a lock must keep."""
        out = []
        for name, have in sorted(self.packages.items()):
            bare = have.split(":", 1)[1] if re.match(r"[0-9]+:", have) else have
            if bare == version or bare.startswith((version + "-", version + "+", version + "~")):
                out.append(name)
        return tuple(out)


class HeldUnit(FactModel):
    """One unit a maintenance window stopped: what ``maintain end`` starts again, health-gated."""

    name: str  # the unit's name (its service is NAME.service)
    path: str  # its file
    active: str  # systemd's ActiveState when the window began ("active": start it at the end)
    health_url: str | None = None
    model: str | None = None
    card: str | None = None
    recipe_digest: str | None = None


class MaintenanceRecord(FactModel):
    """What ``maintain begin`` saw on the host, kept there until ``maintain end``."""

    began: str  # UTC, ISO 8601
    by: str  # user@machine that began it
    driver: str | None = None  # the loaded driver (kernel module first)
    flavour: str | None = None  # proprietary or open
    units: tuple[HeldUnit, ...] = ()


EngineImageSource = Literal["host", "registry"]


class EngineImage(FactModel):
    """What an engine image says of its device code: its labels (``io.tensorless.engine.*``
    among them) and, where its contents were read, the CUDA code in its libggml-cuda fatbins.
    ``labels`` None: it could not be read (``where`` says why)."""

    ref: str  # repository@sha256:digest
    source: EngineImageSource | None
    labels: dict[str, str] | None = None
    fatbin: tuple[tuple[str, int], ...] | None = None  # ("ELF"|"PTX", 60) per entry; None: unread
    where: str = ""  # "labels read from the registry 10.253.2.1:5000", or why it was not read


HealthState = Literal["ok", "absent", "no_driver", "no_devices", "hung", "failed"]


class HealthReport(FactModel):
    """What ``nvidia-smi -q -x`` said: the cards' health, or why there is none."""

    state: HealthState
    cards: tuple[CardHealth, ...] = ()
    exit_code: int | None = None
    message: str = ""


# --- what this tool itself put on the host ----------------------------------------------------

# The labels every unit and container of this tool carries (written by launch.spec, read back
# by the survey, status and bench): the one list of their names.
LABEL_PREFIX = "io.tensorless"
LABEL_RECIPE_DIGEST = f"{LABEL_PREFIX}.recipe-digest"
LABEL_MODEL = f"{LABEL_PREFIX}.model"
LABEL_CARD = f"{LABEL_PREFIX}.card"
LABEL_BIND = f"{LABEL_PREFIX}.bind"
LABEL_PORT = f"{LABEL_PREFIX}.port"
LABEL_TUNED = f"{LABEL_PREFIX}.tuned"
LABEL_HEALTH = f"{LABEL_PREFIX}.health"  # the health URL, exactly as the health check polls it
# the device the instance must report itself on: "cpu" (a CPU engine), "CUDA0@0000:04:00.0"
# (the one GPU the container gets, by the PCI bus id nvidia-smi gives its UUID) or "CUDA0"
# (the bus id unknown): decisions.device reads it, and so do the activation scripts
LABEL_DEVICE = f"{LABEL_PREFIX}.device"

UnitKind = Literal["quadlet", "service"]


class ToolUnit(FactModel):
    """A unit file this tool wrote: where, its sha256, the io.tensorless.* labels it carries,
    and what /health answered at the address it labels (None: no address label)."""

    path: str
    name: str  # the service's name without .service: tensorless-<model>-<card>
    kind: UnitKind
    sha256: str
    labels: dict[str, str]
    health: int | None = None  # HTTP status; 0: no answer
    # the device lines of the running instance's start log (facts.device.DEVICE_LINE)
    device_log: tuple[str, ...] = ()


class ModelBlobFile(FactModel):
    """A model blob in the Hub cache layout under the models directory, and its stamp."""

    path: str
    sha256: str  # the blob's name: the content hash it was verified (or is to be) against
    size: int
    mtime: int
    stamp: str | None  # what the tool's stamp for this sha256 says (None: no stamp)


class ToolState(FactModel):
    """Everything this tool put on a host, read in the survey's round trip."""

    units: tuple[ToolUnit, ...] = ()
    blobs: tuple[ModelBlobFile, ...] = ()
    images: tuple[str, ...] | None = None  # repository@digest the engine holds; None: unknown
    images_engine: str | None = None  # which engine listed them (podman first, else docker)
    links: dict[str, str] = {}  # snapshot link -> its target, as readlink prints it

    def has_image(self, engine: str, image: str) -> bool | None:
        """Whether ``engine`` holds ``image`` (name@sha256:...); None: not known."""
        if self.images is None or self.images_engine != engine:
            return None
        name, _, digest = image.partition("@")
        for held in self.images:
            repo, _, have = held.partition("@")
            if have == digest and (repo == name or repo == f"docker.io/{name}"):
                return True
        return False

    def unit(self, name: str) -> ToolUnit | None:
        return next((u for u in self.units if u.name == name), None)

    def blob(self, path: str) -> ModelBlobFile | None:
        return next((b for b in self.blobs if b.path == path), None)

    def verified(self, blob: str, snapshot: str, target: str) -> bool:
        """The blob is there, stamped by this tool's last verification (same size and mtime,
        as ``BlobState.verified``), and its snapshot link points at it: nothing to do."""
        b = self.blob(blob)
        return (
            b is not None
            and b.stamp == stamp_text(b.size, b.mtime, b.path)
            and self.links.get(snapshot) == target
        )


Source = Literal["host", "inventory"]


class HostFacts(FactModel):
    """Everything decisions need to know about one host, in one value.

    ``source`` says whether it was read from the host over SSH or given as inventory data
    (offline planning: GPUs only). ``problems`` lists sections whose output could not be read
    ("section: why"); their fields are ``None``.
    """

    source: Source
    gpus: GpuReport
    devices: NvidiaDevices | None = None
    engines: ContainerEngines | None = None
    toolkit: ContainerToolkit | None = None
    cdi: CdiReport | None = None
    selinux: Selinux | None = None
    init: InitSystem | None = None
    access: Access | None = None  # None: a survey captured before the access section
    cgroups: Cgroups | None = None
    cpus: int | None = None
    disk: DiskSpace | None = None
    listeners: tuple[Listener, ...] | None = None
    tool: ToolState | None = None
    gpu_apps: tuple[GpuApp, ...] | None = None  # None: not known (nvidia-smi could not say)
    module: DriverModule | None = None
    kernel_log: KernelLog | None = None
    health: HealthReport | None = None
    # engine images the host holds (its labels), and those read from their registry for it
    engine_images: dict[str, EngineImage] | None = None
    driver_packages: DriverPackages | None = None
    maintenance: MaintenanceRecord | None = None  # a maintenance window is open (maintain begin)
    problems: tuple[str, ...] = ()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def driver_version(self) -> str | None:
        return self.gpus.driver_version

    def engine_image(self, image: str) -> EngineImage | None:
        """What is known of this image (name@sha256:...): the host's copy, else its registry's;
        matched by digest and name as ToolState.has_image does."""
        if self.engine_images is None:
            return None
        name, _, digest = image.partition("@")
        for ref, known in self.engine_images.items():
            repo, _, have = ref.partition("@")
            if have == digest and (repo == name or repo == f"docker.io/{name}"):
                return known
        return None

    def port_taken(self, port: int, bind_address: str = "127.0.0.1") -> tuple[Listener, ...] | None:
        """The listeners that would stop a server binding ``bind_address:port``; None: unknown."""
        if self.listeners is None:
            return None
        return blocking_listeners(self.listeners, port, bind_address)


@dataclass(frozen=True)
class BlobState:
    """The model blob on the host, the stamp left when it was last verified, and where the
    snapshot link points."""

    exists: bool
    size: int | None
    mtime: int | None
    stamp: str | None
    link: str | None = None

    path: str | None = None

    @property
    def verified(self) -> bool:
        """Verified before and untouched since: the stamp names this blob, its size and mtime
        (hub.CachePaths.stamp_text)."""
        return (
            self.exists
            and self.size is not None
            and self.mtime is not None
            and self.path is not None
            and self.stamp == stamp_text(self.size, self.mtime, self.path)
        )


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
    path: str = ""  # the unit file
    text: str = ""  # the unit file as it is on the host now
    sha256: str | None = None  # of that file
    written_sha256: str | None = None  # what this tool recorded when it wrote the file
    previous_sha256: str | None = None  # the previous unit kept for rollback (None: none)
    previous_text: str = ""  # that unit file
    restarts: int | None = None  # systemd's NRestarts
    result: str | None = None  # systemd's Result: success, exit-code, start-limit-hit...
    sub_state: str | None = None  # systemd's SubState: running, auto-restart, failed...
    # llama-server's /metrics, read only when asked (status) and the unit enables it: the HTTP
    # status of the GET (None: not read) and its llamacpp: samples, by name without the prefix
    metrics_status: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    # the device lines of the running instance's start log (facts.device.DEVICE_LINE)
    device_log: tuple[str, ...] = ()

    @property
    def edited(self) -> bool:
        """The file differs from what this tool wrote (an edit by hand, or a half write)."""
        return self.written_sha256 is not None and self.sha256 != self.written_sha256
