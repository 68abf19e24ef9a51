"""operations.prepare: doctor's automatable fixes as idempotent pyinfra operations, one per
check id (``OPERATIONS``), and the @deploy that runs a host's prepare plan in order.

Each reads facts and yields commands, or nothing (a noop) when the host is already right. They
reuse pyinfra's own operations where those fit: ``apt.key``/``apt.repo``/``apt.packages`` (or
``dnf.repo``/``dnf.packages``) for the toolkit and podman, ``files.directory`` for the models
directory, ``server.modprobe`` for nvidia-uvm, ``selinux.boolean`` and
``selinux.file_context_mapping`` for SELinux; their small files are written as
``operations.unit`` writes units (only when the sha256 differs). The driver is never touched,
docker never installed.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable, MutableMapping, Sequence
from io import StringIO
from typing import Any

from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.rpm import RpmPackages
from pyinfra.facts.selinux import FileContext
from pyinfra.facts.server import KernelModules, Which
from pyinfra.operations import apt, dnf, files, selinux, server
from pyinfra.operations.selinux import Boolean

from tensorless_deploy.facts.nvidia import DRIVER_PIN_FILE
from tensorless_deploy.facts.prepare import (
    OUR_NODES_SERVICE,
    OUR_REFRESH_PATH,
    OUR_REFRESH_SERVICE,
    OUR_UNIT_DIR,
    TOOLKIT_REFRESH_PATH,
    TOOLKIT_UNIT_DIRS,
    CdiRefresh,
    DriverPackagesFact,
    GpuCdiSpecs,
    NodesAtBoot,
    NvidiaNodes,
)
from tensorless_deploy.facts.pyinfra import FileSha256
from tensorless_deploy.hostplan.prepare import (
    CDI,
    CHAR_LINKS,
    DOOR,
    DRIVER_LOCK,
    ENGINE,
    MODELS,
    MODELS_LABEL,
    SELINUX,
    TOOLKIT,
    UVM,
    HostPrep,
)
from tensorless_deploy.operations._run import Commands, script
from tensorless_deploy.operations.gateway import haproxy

# NVIDIA's own names (its install guide), so a host set up by hand by that guide is already right.
TOOLKIT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
TOOLKIT_LIST = "nvidia-container-toolkit"  # /etc/apt/sources.list.d/<this>.list
TOOLKIT_PACKAGE = "nvidia-container-toolkit"
# What a pinned version pins, together (NVIDIA's guide pins these four to one version).
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
ETC_SPEC = "/etc/cdi/nvidia.yaml"
RUN_SPEC = "/var/run/cdi/nvidia.yaml"
MODULES_LOAD = "/etc/modules-load.d/nvidia-uvm.conf"
MODULES_LOAD_TEXT = (
    "# tensorless-deploy prepare (gpu.uvm): CUDA needs /dev/nvidia-uvm\nnvidia-uvm\n"
)
UDEV_RULE = "/etc/udev/rules.d/71-nvidia-dev-char.rules"
UDEV_RULE_TEXT = (
    "# tensorless-deploy prepare (gpu.char_links): /dev/char links for every NVIDIA device node\n"
    "# whenever the driver binds, so systemctl daemon-reload cannot cut containers off a GPU\n"
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
    'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n'
)
NODES_SERVICE = f"{OUR_UNIT_DIR}/{OUR_NODES_SERVICE}"
NODES_SERVICE_TEXT = """\
# tensorless-deploy prepare (gpu.uvm, gpu.char_links): the NVIDIA device nodes a GPU container
# needs (/dev/nvidia-uvm, nvidiactl) and their /dev/char links exist only once something makes
# them; the driver makes none at boot. This makes them at every boot, before sysinit.target and
# so before any served unit starts, with the NVIDIA Container Toolkit's own commands (what
# NVIDIA's guides do at boot with nvidia-modprobe, or its GPU operator with nvidia-ctk).
# /etc/modules-load.d/nvidia-uvm.conf has loaded the module by then.
[Unit]
Description=NVIDIA device nodes and /dev/char links for GPU containers (tensorless-deploy)
DefaultDependencies=no
After=local-fs.target systemd-modules-load.service systemd-udev-trigger.service
Before=sysinit.target shutdown.target
Conflicts=shutdown.target
ConditionPathExists=/usr/bin/nvidia-ctk

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=-/usr/bin/nvidia-ctk system create-device-nodes --control-devices
ExecStart=/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all

[Install]
WantedBy=sysinit.target
"""
REFRESH_SERVICE_TEXT = f"""\
# tensorless-deploy prepare (toolkit.cdi): this host's NVIDIA Container Toolkit ships no CDI
# refresh units (they come with 1.18), so this regenerates the spec for the installed driver at
# boot and whenever {OUR_REFRESH_PATH} sees the driver change.
[Unit]
Description=Regenerate the NVIDIA CDI spec for the installed driver (tensorless-deploy)
ConditionPathExists=/usr/bin/nvidia-ctk

[Service]
Type=oneshot
ExecStart=/usr/bin/nvidia-ctk cdi generate --output={ETC_SPEC}

[Install]
WantedBy=multi-user.target
"""
REFRESH_PATH_TEXT = f"""\
# tensorless-deploy prepare (toolkit.cdi): a driver install or upgrade replaces nvidia-smi and
# runs depmod; either starts {OUR_REFRESH_SERVICE}, which regenerates the CDI spec.
[Unit]
Description=Watch the NVIDIA driver for changes that make the CDI spec stale (tensorless-deploy)

[Path]
PathChanged=/usr/bin/nvidia-smi
PathChanged=/lib/modules/%v/modules.dep
Unit={OUR_REFRESH_SERVICE}

[Install]
WantedBy=multi-user.target
"""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _file(path: str, text: str) -> Commands:
    """A small root-owned 0644 file with this content, written only when its sha256 differs."""
    if host.get_fact(FileSha256, path=path) == _sha256(text):
        return
    yield from _write(path, text)


def _write(path: str, text: str) -> Commands:
    yield StringCommand("mkdir", "-p", posixpath.dirname(path))
    yield FileUploadCommand(StringIO(text), path)
    yield StringCommand("chmod", "644", path)


def _nodes_at_boot() -> list[Any]:
    """The unit that makes the device nodes and links again at every boot, written and enabled
    where it is not (what prepare makes now must hold after a reboot)."""
    state = host.get_fact(NodesAtBoot)
    commands: list[Any] = []
    if state["sha256"] != _sha256(NODES_SERVICE_TEXT):
        commands += [*_write(NODES_SERVICE, NODES_SERVICE_TEXT)]
        commands.append(StringCommand("systemctl", "daemon-reload"))
    if state["enabled"] != "enabled":
        commands.append(StringCommand("systemctl", "enable", "-q", OUR_NODES_SERVICE))
    return commands


def _installed(have: dict[str, Sequence[str]], name: str, version: str | None) -> bool:
    versions = have.get(name) or []
    return bool(versions) and (version is None or version in versions)


@operation()
def podman(package: str = "podman") -> Commands:
    """
    Install podman from the host's own packages (check engine.present).

    Nothing to do where ``podman`` is on the PATH. apt hosts refresh their package lists first
    (at most once an hour); dnf hosts install directly. Docker is never installed.

    + package: the distribution's package name for podman

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import prepare

        prepare.podman(name="engine.present")
    """
    if host.get_fact(Which, command="podman"):
        host.noop("podman is installed")
        return
    if host.get_fact(Which, command="apt-get"):
        yield from apt.packages._inner(packages=[package], update=True, cache_time=3600)
    elif host.get_fact(Which, command="dnf"):
        yield from dnf.packages._inner(packages=[package])
    else:
        raise OperationError("no apt-get or dnf here: install podman with this host's packages")


@operation()
def toolkit(repo_url: str, key_url: str, version: str | None = None) -> Commands:
    """
    Install the NVIDIA Container Toolkit from NVIDIA's repository (check toolkit.present).

    The repository's signing key (``apt.key``), the repository (``apt.repo``), then the
    packages (``apt.packages``); on dnf hosts NVIDIA's ``.repo`` file (``dnf.repo``) and
    ``dnf.packages``. On apt hosts only this repository's index is refreshed (``apt-get
    update`` of its one list), so a broken or unreachable repository elsewhere does not stop
    it. Nothing to do where the toolkit is installed (at the pinned version, when one is given).

    + repo_url: the repository, ``https://nvidia.github.io/libnvidia-container`` or a mirror
      with the same layout (``stable/deb/$(ARCH)``, ``stable/rpm/nvidia-container-toolkit.repo``)
    + key_url: the repository's signing key (NVIDIA: ``<repo_url>/gpgkey``)
    + version: the package version to pin, e.g. ``1.17.8-1`` (the toolkit's four packages
      together); None: the repository's newest, and an installed toolkit is left as it is

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import prepare

        prepare.toolkit(
            name="toolkit.present",
            repo_url="https://nvidia.github.io/libnvidia-container",
            key_url="https://nvidia.github.io/libnvidia-container/gpgkey",
            version="1.17.8-1",
        )
    """
    names = TOOLKIT_PACKAGES if version else (TOOLKIT_PACKAGE,)
    wanted = [f"{n}={version}" if version else n for n in names]
    if host.get_fact(Which, command="apt-get"):
        have = host.get_fact(DebPackages)
        if all(_installed(have, n, version) for n in names):
            host.noop(f"{TOOLKIT_PACKAGE} {version or 'installed'}")
            return
        yield from apt.key._inner(src=key_url, dest=TOOLKIT_KEYRING)
        line = f"deb [signed-by={TOOLKIT_KEYRING}] {repo_url}/stable/deb/$(ARCH) /"
        yield from apt.repo._inner(src=line, filename=TOOLKIT_LIST)
        lst = f"/etc/apt/sources.list.d/{TOOLKIT_LIST}.list"
        yield StringCommand(
            "apt-get",
            "update",
            "-o",
            f"Dir::Etc::sourcelist={lst}",
            "-o",
            "Dir::Etc::sourceparts=-",
            "-o",
            "APT::Get::List-Cleanup=0",
        )
        yield from apt.packages._inner(packages=wanted, allow_downgrades=bool(version))
    elif host.get_fact(Which, command="dnf"):
        have = host.get_fact(RpmPackages)
        if all(_installed(have, n, version) for n in names):
            host.noop(f"{TOOLKIT_PACKAGE} {version or 'installed'}")
            return
        yield from dnf.repo._inner(src=f"{repo_url}/stable/rpm/nvidia-container-toolkit.repo")
        yield from dnf.packages._inner(packages=wanted)
    else:
        raise OperationError("no apt-get or dnf here: install the NVIDIA Container Toolkit by hand")


@operation()
def cdi_spec(driver_version: str, gpu_uuids: Sequence[str] = ()) -> Commands:
    """
    Generate the CDI spec for the installed driver and keep it fresh (check toolkit.cdi).

    One spec of kind nvidia.com/gpu, kept fresh after driver changes by the toolkit's
    ``nvidia-cdi-refresh.path`` where the toolkit ships it (1.18 and later; spec
    ``/var/run/cdi/nvidia.yaml``), else by ``tensorless-cdi-refresh.path`` and its service (spec
    ``/etc/cdi/nvidia.yaml``). Other specs of that kind are moved aside
    (``*.tensorless-moved``), never deleted. Which units apply is decided on the host when the
    step runs (``scripts/cdi-refresh.sh``), so it also holds right after ``prepare.toolkit``
    installed the toolkit in the same run. Nothing to do while the one spec names this driver
    and these GPUs and its refresh unit is enabled.

    + driver_version: the driver nvidia-smi reports; a spec for another one is stale
    + gpu_uuids: the GPUs the spec must address as ``nvidia.com/gpu=GPU-<uuid>``

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import prepare

        prepare.cdi_spec(
            name="toolkit.cdi",
            driver_version="535.183.01",
            gpu_uuids=["GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90"],
        )
    """
    state = host.get_fact(CdiRefresh)
    specs = host.get_fact(GpuCdiSpecs)
    if state["toolkit_units"]:
        target = RUN_SPEC
        units_ok = state["toolkit_path_enabled"] == "enabled" and not state["our_path_sha256"]
    else:
        target = ETC_SPEC
        units_ok = (
            state["our_service_sha256"] == _sha256(REFRESH_SERVICE_TEXT)
            and state["our_path_sha256"] == _sha256(REFRESH_PATH_TEXT)
            and state["our_path_enabled"] == "enabled"
        )
    spec_ok = (
        len(specs) == 1
        and specs[0]["path"] == target
        and specs[0]["driver_version"] == driver_version
        and all(u in specs[0]["devices"] for u in gpu_uuids)
    )
    if spec_ok and units_ok:
        host.noop(f"{target} is current for driver {driver_version} and kept fresh")
        return
    yield script(
        "cdi-refresh",
        service=OUR_REFRESH_SERVICE,
        path_unit=OUR_REFRESH_PATH,
        unit_dir=OUR_UNIT_DIR,
        service_text=REFRESH_SERVICE_TEXT,
        path_text=REFRESH_PATH_TEXT,
        etc_spec=ETC_SPEC,
        run_spec=RUN_SPEC,
        toolkit_paths=" ".join(f"{d}/{TOOLKIT_REFRESH_PATH}" for d in TOOLKIT_UNIT_DIRS),
    )


@operation()
def uvm(modules_load: str = MODULES_LOAD) -> Commands:
    """
    Load nvidia-uvm and make its device nodes, now and at every boot (check gpu.uvm).

    Loaded with ``modprobe`` where this kernel has the nvidia module loaded (a container that
    shares its host's kernel has none to load) and listed in a modules-load.d file for the next
    boot; the nodes made by ``nvidia-ctk system create-device-nodes --control-devices`` when
    ``/dev/nvidia-uvm`` is missing, and again at every boot by
    ``tensorless-nvidia-devices.service`` (enabled, ordered before sysinit.target, so before any
    served unit), which also makes their /dev/char links.

    + modules_load: the modules-load.d file that loads it at boot

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import prepare

        prepare.uvm(name="gpu.uvm")
    """
    commands = list(_file(modules_load, MODULES_LOAD_TEXT))
    modules = host.get_fact(KernelModules)
    if "nvidia" in modules and "nvidia_uvm" not in modules:
        commands += server.modprobe._inner(module="nvidia_uvm")
    if not host.get_fact(NvidiaNodes)["uvm_present"]:
        commands.append(
            StringCommand("nvidia-ctk", "system", "create-device-nodes", "--control-devices")
        )
    commands += _nodes_at_boot()
    if not commands:
        host.noop(f"/dev/nvidia-uvm present, {modules_load} and {OUR_NODES_SERVICE} in place")
    yield from commands


@operation()
def char_links(nodes_pending: bool = False) -> Commands:
    """
    Link every NVIDIA device node under /dev/char, now and at every boot (gpu.char_links).

    ``/dev/char/MAJOR:MINOR`` for every NVIDIA node, made now by ``nvidia-ctk system
    create-dev-char-symlinks --create-all``, after every driver load by the udev rule NVIDIA
    documents for it (``/etc/udev/rules.d/71-nvidia-dev-char.rules``), and at every boot by
    ``tensorless-nvidia-devices.service`` (for the nodes made after the driver bound): without
    them ``systemctl daemon-reload`` can cut running containers off their GPU.

    + nodes_pending: an earlier step of this run creates device nodes: link them too

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import prepare

        prepare.char_links(name="gpu.char_links")
    """
    commands = list(_file(UDEV_RULE, UDEV_RULE_TEXT))
    if nodes_pending or host.get_fact(NvidiaNodes)["missing_char_links"]:
        commands.append(
            StringCommand("nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all")
        )
    commands += _nodes_at_boot()
    if not commands:
        host.noop(
            f"every NVIDIA node has its /dev/char link, {UDEV_RULE} and {OUR_NODES_SERVICE} "
            "in place"
        )
    yield from commands


@operation()
def selinux_devices(persistent: bool = True) -> Commands:
    """
    Turn the SELinux boolean container_use_devices on (check selinux.devices).

    Containers may then open the GPU's device nodes; prepare schedules it only where SELinux is
    enforcing and the boolean is off (``selinux.boolean``).

    + persistent: write it into the policy (``setsebool -P``), so it holds after a reboot

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import prepare

        prepare.selinux_devices(name="selinux.devices")
    """
    yield from selinux.boolean._inner(
        bool_name="container_use_devices", value=Boolean.ON, persistent=persistent
    )


@operation()
def models_dir(path: str, selinux_label: bool = False) -> Commands:
    """
    Make the models directory as the units need it (check disk.model).

    Root-owned, mode 0755 (the units mount its files read-only into the container); where
    SELinux is enforcing, also a file-context rule giving it and everything under it the type
    ``container_ro_file_t`` (``selinux.file_context_mapping``), applied with ``restorecon -R``.
    Never deletes anything: free space is left to the operator.

    + path: the host's models directory (``tensorless_models_dir``)
    + selinux_label: SELinux is enforcing here

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import prepare

        prepare.models_dir(name="disk.model", path="/var/lib/tensorless/models")
    """
    yield from files.directory._inner(path=path, user="root", group="root", mode="755")
    if selinux_label:
        yield from selinux.file_context_mapping._inner(target=f"{path}(/.*)?", se_type=MODELS_LABEL)
        context = host.get_fact(FileContext, path=path) or {}
        if context.get("type") != MODELS_LABEL:
            yield StringCommand("restorecon", "-R", path)


@operation()
def driver_lock(manager: str, pin: str | None = None, specs: Sequence[str] = ()) -> Commands:
    """
    Keep the NVIDIA driver on the branch it is on (check driver.lock).

    Never installs, upgrades or removes the driver. apt: the pin file
    ``/etc/apt/preferences.d/tensorless-nvidia-driver`` (``pin``, from
    ``decisions.guard.apt_pin``): the driver's installed packages take versions of their branch
    only, and other branches' packages (by name) never install; written only when its sha256
    differs. dnf: ``dnf versionlock add`` of the installed versions (``specs``) not locked yet,
    with the versionlock command installed first where dnf lacks it.

    + manager: ``apt`` or ``dnf``, as the survey found
    + pin: (apt) the pin file's text
    + specs: (dnf) NAME-VERSION of each package to lock

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import prepare

        prepare.driver_lock(name="driver.lock", manager="apt", pin=text)
    """
    if manager == "apt":
        if pin is None:
            raise OperationError("driver_lock: apt needs the pin file's text")
        yield from _file(DRIVER_PIN_FILE, pin)
        return
    have = host.get_fact(DriverPackagesFact)
    todo = [s for s in specs if not any(lock.startswith(s) for lock in have.get("locks", []))]
    if todo:
        yield StringCommand(
            "dnf versionlock list >/dev/null 2>&1 || dnf -y install 'dnf-command(versionlock)'"
        )
        yield StringCommand("dnf", "versionlock", "add", *todo)


OPERATIONS: dict[str, Callable[..., Any]] = {
    ENGINE: podman,
    TOOLKIT: toolkit,
    CDI: cdi_spec,
    UVM: uvm,
    CHAR_LINKS: char_links,
    SELINUX: selinux_devices,
    MODELS: models_dir,
    DOOR: haproxy,
    DRIVER_LOCK: driver_lock,
}

Steps = MutableMapping[str, dict[str, Any]]  # host -> check id -> OperationMeta


@deploy("tensorless-deploy: prepare a host")
def prepare_plan(prep: HostPrep, steps: Steps | None = None) -> None:
    """Run a host's prepare steps in order; each step's OperationMeta lands in
    steps[host][check id] for the caller's report."""
    if prep.stop is not None:
        raise OperationError(f"{prep.host}: {prep.stop}")
    metas: dict[str, Any] = {}
    for step in prep.steps:
        metas[step.check] = OPERATIONS[step.check](name=f"prepare {step.check}", **step.args)
    if steps is not None:
        steps[host.name] = metas
