"""The checks of a host against a recipe (pure): each with its stable id, what was seen, and the
command that fixes it. The host plan (hostplan.plan) is their one caller for serving decisions,
so doctor, plan, deploy and run read the same verdict."""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from tensorless_deploy.decisions.options import (
    DATA_API_KEY_FILE,
    DATA_INSECURE_OPEN,
    DATA_PIDS_LIMIT,
    DATA_TLS_CERT_FILE,
    DATA_TLS_KEY_FILE,
    EngineChoice,
    Options,
    address,
    api_key_text,
    pem_text,
)
from tensorless_deploy.facts.survey import PROBE_TIMEOUT_S
from tensorless_deploy.facts.values import (
    QUADLET_MIN_PODMAN,
    Access,
    Gpu,
    HostFacts,
    MaintenanceRecord,
    SudoProbe,
)
from tensorless_deploy.recipe.schema import Recipe

QUADLET_MIN = ".".join(map(str, QUADLET_MIN_PODMAN))

Status = Literal["ok", "warn", "fail"]
Action = Literal["run", "dry_run"]
EngineName = Literal["podman", "docker"]

# Disk: the model file plus room for its partial download's filesystem overhead and logs.
DISK_MARGIN_BYTES = 1 << 30
DRIVER_INSTALL_HINT = (
    "install NVIDIA driver {need} or newer (Ubuntu: sudo ubuntu-drivers install; Debian: "
    "sudo apt install nvidia-driver), then reboot"
)


# A GPU that hangs NVML: a reset clears a wedged driver state, a reboot what a reset cannot; a card
# that wedges again after both is dying (the kernel log's Xid lines say how).
GPU_HUNG_FIX = (
    "reset the GPU (sudo nvidia-smi -r -i INDEX, with nothing running on it), else reboot the "
    "host; if it hangs again, read its Xid lines (sudo journalctl -k -b | grep Xid) and "
    "replace the card"
)


@functools.lru_cache(maxsize=256)  # a fleet has few driver versions; every card asks
def version_tuple(text: str) -> tuple[int, ...]:
    """'525.60.13' -> (525, 60, 13); anything that is not digits and dots sorts lowest."""
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", text):
        return ()
    return tuple(int(p) for p in text.split("."))


def driver_at_least(have: str | None, need: str) -> bool:
    return have is not None and version_tuple(have) >= version_tuple(need)


def gpu_fits_card(gpu: Gpu, recipe: Recipe) -> bool:
    """Seed 000: compute capability equal, memory at least the minimum."""
    return (
        gpu.compute_cap == recipe.card.compute_capability
        and gpu.memory_total_mib is not None
        and gpu.memory_total_mib >= recipe.card.min_memory_mib
    )


def describe_gpu(gpu: Gpu) -> str:
    mem = "? MiB" if gpu.memory_total_mib is None else f"{gpu.memory_total_mib} MiB"
    return f"GPU {gpu.index} {gpu.name} (compute {gpu.compute_cap or '?'}, {mem})"


@dataclass(frozen=True)
class GpuMatch:
    """A host's GPUs sorted against one recipe's card."""

    usable: tuple[Gpu, ...]  # match the card, driver new enough: the container gets these
    old_driver: tuple[Gpu, ...]  # match the card, driver older than min_driver
    other: tuple[Gpu, ...]  # do not match the card

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.usable if g.uuid is not None)


def match_gpus(recipe: Recipe, gpus: Sequence[Gpu]) -> GpuMatch:
    fits = [g for g in gpus if gpu_fits_card(g, recipe)]
    usable = tuple(g for g in fits if driver_at_least(g.driver_version, recipe.card.min_driver))
    # by identity: each card once, without comparing every field of it
    taken = {id(g) for g in usable}
    old = tuple(g for g in fits if id(g) not in taken)
    matched = {id(g) for g in fits}
    return GpuMatch(usable, old, tuple(g for g in gpus if id(g) not in matched))


def state_refusal(recipe: Recipe, action: Action, allow_draft: bool) -> str | None:
    """Why the seed's state table refuses ACTION for this recipe, or None when allowed."""
    if recipe.unpublished and action == "run":
        return (
            f"{recipe.model.hf_repo} on {recipe.card.id} is not published (placeholder "
            "revision, sha256, image digest or size); it cannot be pulled or run, even with "
            "--allow-draft"
        )
    if recipe.status == "draft" and not allow_draft:
        return (
            f"{recipe.model.hf_repo} on {recipe.card.id} is a draft recipe (not yet measured by "
            "the release gate); pass --allow-draft to use it anyway"
        )
    return None


def threads_for(recipe: Recipe, cpus: int | None) -> int:
    """-t, -tb and OMP_NUM_THREADS: the smaller of threads_max and the host's CPUs."""
    return recipe.run.threads_max if cpus is None else max(1, min(recipe.run.threads_max, cpus))


@dataclass(frozen=True)
class Tuning:
    """Whether a run is what was measured; port and bind address never change that."""

    tuned: bool
    reasons: tuple[str, ...]


def tuning(recipe: Recipe, context: int | None, extra_args: Sequence[str]) -> Tuning:
    reasons = []
    if context is not None and context != recipe.run.context:
        reasons.append(f"context {context} instead of the measured {recipe.run.context}")
    if extra_args:
        reasons.append("extra llama-server args: " + " ".join(extra_args))
    return Tuning(not reasons, tuple(reasons))


def pick_engine(facts: HostFacts, choice: EngineChoice) -> EngineName | None:
    """podman when present (quadlet, CDI), else docker; an explicit choice must be present."""
    if facts.engines is None:
        return None
    have_podman = facts.engines.podman.present
    have_docker = facts.engines.docker.present and not facts.engines.docker.podman_shim
    if choice == "podman":
        return "podman" if have_podman else None
    if choice == "docker":
        return "docker" if have_docker else None
    return "podman" if have_podman else ("docker" if have_docker else None)


@dataclass(frozen=True)
class Check:
    """One doctor row: a stable id, ok / warn / fail, what was seen, and the command that fixes
    it (None when nothing needs fixing or no single command can)."""

    id: str
    status: Status
    evidence: str
    fix: str | None = None


@dataclass(frozen=True)
class Existing:
    """What tensorless-deploy already put on the host, as it bears on one plan."""

    own_units: tuple[str, ...] = ()  # the plan's own units already there: their ports are ours
    model_present: bool = False  # the model file is there: no disk space needed
    port_units: tuple[tuple[int, str], ...] = ()  # (port, unit) of every unit of ours there


@dataclass(frozen=True)
class Verdict:
    """Every check for one host (and one recipe, or none), in a fixed order."""

    checks: tuple[Check, ...]
    match: GpuMatch | None = None
    engine: EngineName | None = None
    servable: tuple[str, ...] = field(default_factory=tuple)  # recipe paths, without MODEL

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == "fail")


def _driver_check(facts: HostFacts) -> Check:
    g = facts.gpus
    if g.state == "ok":
        names = ", ".join(sorted({gpu.name for gpu in g.gpus}))
        return Check(
            "driver.present", "ok", f"driver {g.driver_version}, {len(g.gpus)} GPU(s): {names}"
        )
    if g.state == "absent":
        return Check(
            "driver.present",
            "fail",
            "nvidia-smi not found: no NVIDIA driver installed",
            "install the NVIDIA driver (Ubuntu: sudo ubuntu-drivers install; Debian: sudo apt "
            "install nvidia-driver), then reboot",
        )
    if g.state == "no_driver":
        return Check(
            "driver.loaded",
            "fail",
            f"nvidia-smi exit {g.exit_code}: couldn't communicate with the NVIDIA driver",
            "sudo modprobe nvidia (if that fails: reinstall the driver for the running kernel "
            "and reboot)",
        )
    if g.state == "driver_mismatch":
        return Check(
            "driver.loaded", "fail", f"driver/library version mismatch: {g.message}", "sudo reboot"
        )
    if g.state == "hung":
        return Check(
            "gpu.responsive",
            "fail",
            f"GPU hung: nvidia-smi did not answer within {PROBE_TIMEOUT_S} s (a wedged NVML: "
            "one dying card makes every nvidia-smi hang)",
            GPU_HUNG_FIX,
        )
    if g.state == "no_devices":
        return Check(
            "driver.present",
            "fail",
            "the driver is loaded but sees no GPU",
            "check the card with: lspci | grep -i nvidia; dmesg | grep -i nvrm",
        )
    return Check(
        "driver.present",
        "fail",
        f"nvidia-smi failed (exit {g.exit_code}): {g.message}",
        "run nvidia-smi on the host and fix what it reports",
    )


def _card_checks(facts: HostFacts, recipe: Recipe) -> tuple[list[Check], GpuMatch]:
    match = match_gpus(recipe, facts.gpus.gpus)
    card = recipe.card
    want = f"{card.id} (compute {card.compute_capability}, >= {card.min_memory_mib} MiB)"
    checks = []
    fits = match.usable + match.old_driver
    if fits:
        listed = "; ".join(f"{describe_gpu(g)} {g.uuid}" for g in fits)
        checks.append(Check("card.match", "ok", f"{len(fits)} GPU(s) match {want}: {listed}"))
    else:
        have = "; ".join(describe_gpu(g) for g in match.other) or "no GPUs"
        checks.append(
            Check(
                "card.match",
                "fail",
                f"no GPU matches {want}; this host has {have}",
                "pick a recipe for a card this host has: tensorless-deploy doctor (no MODEL) "
                "lists them",
            )
        )
    if match.old_driver and not match.usable:
        old = match.old_driver[0].driver_version
        checks.append(
            Check(
                "driver.version",
                "fail",
                f"driver {old} is older than {card.min_driver}, the oldest this recipe runs on",
                DRIVER_INSTALL_HINT.format(need=card.min_driver),
            )
        )
    elif match.usable:
        seen = f"driver {match.usable[0].driver_version} >= {card.min_driver}"
        checks.append(Check("driver.version", "ok", seen))
    if match.usable and match.other:
        checks.append(
            Check(
                "card.isolation",
                "ok",
                f"the container gets only {', '.join(match.uuids)}; not "
                + "; ".join(describe_gpu(g) for g in match.other),
            )
        )
    return checks, match


def _device_checks(facts: HostFacts) -> list[Check]:
    d = facts.devices
    if d is None or facts.gpus.state != "ok":
        return []
    checks = []
    if d.uvm_present:
        checks.append(Check("gpu.uvm", "ok", "/dev/nvidia-uvm present"))
    else:
        checks.append(
            Check(
                "gpu.uvm",
                "fail",
                "/dev/nvidia-uvm missing: CUDA would fail or fall back silently",
                "sudo nvidia-modprobe -u -c=0",
            )
        )
    missing = d.missing_char_links
    if missing:
        checks.append(
            Check(
                "gpu.char_links",
                "warn",
                "no /dev/char links for "
                + ", ".join(missing)
                + ": systemctl daemon-reload can cut running containers off their GPU",
                "sudo nvidia-ctk system create-dev-char-symlinks --create-all",
            )
        )
    else:
        checks.append(Check("gpu.char_links", "ok", "/dev/char links present for NVIDIA devices"))
    return checks


def _engine_checks(facts: HostFacts, options: Options) -> tuple[list[Check], EngineName | None]:
    e = facts.engines
    if e is None:
        return [Check("engine.present", "fail", "could not read the container engines", None)], None
    engine = pick_engine(facts, options.engine)
    if engine is None:
        want = "podman or docker" if options.engine == "auto" else options.engine
        return [
            Check(
                "engine.present",
                "fail",
                f"no container engine ({want}) found",
                "sudo apt install podman",
            )
        ], None
    checks = []
    if engine == "podman":
        checks.append(Check("engine.present", "ok", f"podman {e.podman.version_text}".strip()))
        if e.podman.quadlet_supported:
            seen = f"quadlet at {e.podman.quadlet_path}: units are .container files"
            checks.append(Check("engine.quadlet", "ok", seen))
        else:
            checks.append(
                Check(
                    "engine.quadlet",
                    "warn",
                    f"podman {e.podman.version_text} has no quadlet with every key the units "
                    f"need (needs {QUADLET_MIN}+): a plain systemd .service running podman is "
                    "used instead",
                    f"upgrade podman to {QUADLET_MIN} or newer (Debian 13, Ubuntu 24.04) for "
                    "quadlet units",
                )
            )
    else:
        checks.append(Check("engine.present", "ok", f"docker {e.docker.version_text}".strip()))
    return checks, engine


def _toolkit_checks(
    facts: HostFacts, engine: EngineName | None, uuids: Sequence[str]
) -> list[Check]:
    t = facts.toolkit
    checks = []
    if t is None or not t.present:
        checks.append(
            Check(
                "toolkit.present",
                "fail",
                "nvidia-ctk not found: no NVIDIA Container Toolkit",
                "install nvidia-container-toolkit from NVIDIA's repository "
                "(https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/"
                "install-guide.html), e.g. sudo apt install nvidia-container-toolkit",
            )
        )
        return checks
    checks.append(Check("toolkit.present", "ok", t.version_text))
    if engine == "docker":
        d = facts.engines.docker if facts.engines else None
        if d is not None and d.nvidia_runtime is False:
            checks.append(
                Check(
                    "toolkit.docker_runtime",
                    "fail",
                    "docker has no nvidia runtime registered",
                    "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart "
                    "docker",
                )
            )
        elif d is not None and d.nvidia_runtime:
            checks.append(Check("toolkit.docker_runtime", "ok", "docker nvidia runtime registered"))
        return checks
    cdi = facts.cdi
    regen = "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
    if cdi is None:
        return checks
    gpu_specs = [s for s in cdi.specs if s.kind == "nvidia.com/gpu"]
    if not gpu_specs:
        checks.append(
            Check(
                "toolkit.cdi",
                "fail",
                "no CDI spec for nvidia.com/gpu in /etc/cdi or /var/run/cdi",
                regen,
            )
        )
        return checks
    dup = cdi.duplicate_kinds.get("nvidia.com/gpu")
    if dup:
        keep = next((p for p in dup if p.startswith("/var/run/cdi")), dup[0])
        drop = [p for p in dup if p != keep]
        checks.append(
            Check(
                "toolkit.cdi",
                "fail",
                f"{len(dup)} CDI specs declare nvidia.com/gpu: {', '.join(dup)}; podman refuses "
                "conflicting devices",
                "sudo rm " + " ".join(drop) + f"  (keep {keep})",
            )
        )
        return checks
    if cdi.stale:
        checks.append(
            Check(
                "toolkit.cdi",
                "fail",
                f"CDI spec {', '.join(cdi.stale)} was generated for another driver than "
                f"{cdi.driver_version}",
                regen,
            )
        )
        return checks
    missing = [u for u in uuids if u not in cdi.addressable_uuids]
    if missing:
        seen = f"CDI spec lists no device for {', '.join(missing)}"
        checks.append(Check("toolkit.cdi", "fail", seen, regen))
        return checks
    checks.append(
        Check(
            "toolkit.cdi",
            "ok",
            f"{gpu_specs[0].path}: nvidia.com/gpu devices for {', '.join(uuids) or 'every GPU'}",
        )
    )
    return checks


def _selinux_check(facts: HostFacts) -> list[Check]:
    s = facts.selinux
    if s is None or s.mode != "enforcing":
        return []
    if s.container_use_devices:
        return [Check("selinux.devices", "ok", "container_use_devices is on")]
    return [
        Check(
            "selinux.devices",
            "fail",
            "SELinux is enforcing and container_use_devices is off: containers cannot open the GPU",
            "sudo setsebool -P container_use_devices=true",
        )
    ]


ACCESS = "access.root"


def _sudoers_fix(user: str) -> str:
    return (
        f"give {user} NOPASSWD sudo ('{user} ALL=(ALL:ALL) NOPASSWD: ALL' in a file under "
        "/etc/sudoers.d/, written with visudo -f) and set _sudo: True for the host, or connect "
        "as root (ssh_user: root)"
    )


def access_check(access: Access, sudo: SudoProbe | None = None) -> Check:
    """access.root: units, models, containers and their journal are root's, so every host's
    commands must run as root: the SSH user is root, or sudo gives root without a password.
    access: who the commands ran as (the survey's, or the login's before any sudo); sudo: the
    login's ``sudo -n true`` where the inventory asks for sudo (None: not asked, or not read)."""
    user = access.user
    if sudo is not None and not access.root:
        if sudo.state == "ok":
            return Check(ACCESS, "ok", f"{user} has passwordless sudo")
        if sudo.state == "password":
            return Check(ACCESS, "fail", f"sudo needs a password for {user}", _sudoers_fix(user))
        if sudo.state == "absent":
            return Check(
                ACCESS,
                "fail",
                "the inventory sets _sudo, but sudo is not installed",
                f"install sudo and {_sudoers_fix(user)}",
            )
        if sudo.state == "denied":
            seen = f"{user} may not use sudo here: {sudo.message}"
            return Check(ACCESS, "fail", seen, _sudoers_fix(user))
        seen = f"sudo -n true failed for {user}: {sudo.message}"
        return Check(ACCESS, "fail", seen, _sudoers_fix(user))
    if access.root:
        via = f" (sudo from {access.sudo_user})" if access.sudo_user else ""
        return Check(ACCESS, "ok", f"commands run as root{via}")
    if access.sudo_user:
        return Check(
            ACCESS,
            "fail",
            f"commands run as {user} (uid {access.uid}) through sudo from {access.sudo_user}, "
            "not as root",
            "drop _sudo_user from the host's data: units, models and containers are root's",
        )
    return Check(
        ACCESS,
        "fail",
        f"commands run as {user} (uid {access.uid}), not root, and the inventory does not "
        "set _sudo",
        _sudoers_fix(user),
    )


def survey_access_check(facts: HostFacts) -> Check | None:
    """access.root from the survey's access section (None: a survey captured before it)."""
    if facts.access is not None:
        return access_check(facts.access)
    unread = [p for p in facts.problems if p.startswith("access:")]
    if unread:
        return Check(
            ACCESS,
            "fail",
            f"could not read who the commands run as ({unread[0]})",
            "run id -u on the host and fix what it reports",
        )
    return None


def check_line(c: Check) -> str:
    """A check as one line: ``id: evidence (fix: ...)``."""
    return f"{c.id}: {c.evidence}" + (f" (fix: {c.fix})" if c.fix else "")


def _systemd_check(facts: HostFacts, options: Options) -> list[Check]:
    if facts.init is None:
        return []
    if facts.init.systemd:
        return [Check("systemd.pid1", "ok", "systemd is PID 1")]
    status: Status = "warn" if options.local else "fail"
    return [
        Check(
            "systemd.pid1",
            status,
            f"PID 1 is {facts.init.pid1 or 'unknown'}, not systemd: no always-on unit "
            "(deploy, serve) here",
            "use tensorless-deploy run (foreground) on this machine, or a host booted with systemd",
        )
    ]


def cgroup_needs(options: Options) -> dict[str, str]:
    """The cgroup controllers a unit's container asks for, each with the unit key that asks:
    the OCI runtime refuses to create a container whose limit has no controller to hold it."""
    return {"pids": f"PidsLimit={options.pids_limit}"} if options.pids_limit else {}


def _cgroup_check(facts: HostFacts, options: Options) -> list[Check]:
    tree = facts.cgroups
    if tree is None:
        return []
    has = f"cgroup {tree.version}: {' '.join(tree.controllers) or 'no controller at all'}"
    need = cgroup_needs(options)
    if not need:
        seen = f"the units ask for no cgroup controller ({DATA_PIDS_LIMIT} = 0); {has}"
        return [Check("cgroup.controllers", "ok", seen)]
    missing = [c for c in need if not tree.has(c)]
    if not missing:
        asks = ", ".join(f"{key} needs {c}" for c, key in need.items())
        return [Check("cgroup.controllers", "ok", f"{asks}: present ({has})")]
    keys = ", ".join(need[c] for c in missing)
    return [
        Check(
            "cgroup.controllers",
            "fail",
            f"the units set {keys}, but this host's cgroup {tree.version} tree has no "
            f"{' or '.join(missing)} controller ({has}): no container would start (crun: "
            f"controller `{missing[0]}` is not available)",
            f"set {DATA_PIDS_LIMIT} = 0 for this host in the inventory (the engine's own "
            "default then applies), or boot it with the pids controller in its cgroup tree "
            "(a nested container: delegate it)",
        )
    ]


def _disk_check(facts: HostFacts, recipe: Recipe, existing: Existing) -> list[Check]:
    d = facts.disk
    if existing.model_present:
        return [Check("disk.model", "ok", "the model file is already on the host")]
    if d is None:
        return []
    need = recipe.model.size_bytes + DISK_MARGIN_BYTES
    gib = 1 << 30
    seen = f"{d.available_bytes / gib:.1f} GiB free on {d.mount_point} ({d.checked_path})"
    if d.available_bytes >= need:
        return [Check("disk.model", "ok", seen)]
    return [
        Check(
            "disk.model",
            "fail",
            f"{seen}; the model needs {recipe.model.size_bytes / gib:.1f} GiB plus 1 GiB",
            f"free {(need - d.available_bytes) / gib:.1f} GiB on {d.mount_point}: "
            "tensorless-deploy prune -i INVENTORY --limit HOST removes the model files and "
            "images no unit uses (--dry-run lists them first); or point the host's "
            "tensorless_models_dir at a larger filesystem",
        )
    ]


def _port_check(
    facts: HostFacts, options: Options, existing: Existing, ports: Sequence[int], readiness: bool
) -> list[Check]:
    """One check for every port the plan serves on (one per instance)."""
    seen: list[str] = []
    for port in ports:
        taken = facts.port_taken(port, options.bind)
        if taken is None:
            return []
        where = address(options.bind, port)
        holder = next((name for p, name in existing.port_units if p == port), None)
        if not taken:
            seen.append(f"{where} is free")
        elif holder is not None and holder in existing.own_units:
            seen.append(f"{where} is held by this recipe's own unit {holder}")
        elif holder is not None and readiness:
            seen.append(f"{where} is held by {holder}, deployed by tensorless-deploy")
        elif holder is not None:
            return [
                Check(
                    "port.free",
                    "fail",
                    f"{where} is held by {holder}, another unit of tensorless-deploy",
                    "stop it (tensorless-deploy stop MODEL), or set another port for this host "
                    "(tensorless_port = N in the inventory, or --port N)",
                )
            ]
        else:
            by = ", ".join(f"{t.address}:{t.port}" for t in taken)
            return [
                Check(
                    "port.free",
                    "fail",
                    f"{where} is taken (listening: {by})",
                    f"stop what listens there (sudo ss -ltnp 'sport = :{port}'), or set another "
                    "port for this host (tensorless_port = N in the inventory, or --port N)",
                )
            ]
    return [Check("port.free", "ok", "; ".join(seen))] if seen else []


@functools.lru_cache(maxsize=64)  # every host's plan asks of the same few addresses
def is_loopback(bind: str) -> bool:
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


def api_check(options: Options, ports: Sequence[int] | None = None) -> list[Check]:
    """Who may call the API: a key (llama-server --api-key-file; /health stays open for the
    health check), or loopback only; a wider bind without a key only when the inventory says
    so. No row for the default (loopback, no key): nothing to say."""
    scheme = "https" if options.tls else "http"
    where = ", ".join(f"{scheme}://{address(options.bind, p)}" for p in (ports or [options.port]))
    if options.api_key_file is not None:
        return [
            Check(
                "api.key",
                "ok",
                f"{where} asks every caller for the key in {options.api_key_file} "
                "(installed on the host for root only); /health answers without it",
            )
        ]
    if is_loopback(options.bind):
        return []
    if options.insecure_open:
        return [
            Check(
                "api.key",
                "warn",
                f"{where} takes requests from anyone who reaches it: no API key, "
                f"{DATA_INSECURE_OPEN} = true",
                f"set {DATA_API_KEY_FILE} to a key file on this machine (openssl rand -hex 32 "
                "> api.key)",
            )
        ]
    return [
        Check(
            "api.key",
            "fail",
            f"{where} would take requests from anyone who reaches it: no API key",
            f'set {DATA_API_KEY_FILE} = "/path/on/this/machine/api.key" in the inventory '
            "(run: --api-key-file FILE; make one with: openssl rand -hex 32 > api.key), or "
            f"bind 127.0.0.1, or say {DATA_INSECURE_OPEN} = true (run: --insecure-open)",
        )
    ]


def secret_file_checks(options: Options) -> list[Check]:
    """The operator's key and TLS files, read and checked on this machine (the controller)
    before anything is installed: what fails names the file and why, never its content."""
    checks = []
    if options.api_key_file is not None:
        try:
            api_key_text(options.api_key_file)
            checks.append(Check("api.key_file", "ok", f"{options.api_key_file}: one key"))
        except ValueError as exc:
            checks.append(
                Check(
                    "api.key_file",
                    "fail",
                    str(exc),
                    f"write one key to that file (openssl rand -hex 32 > FILE), or point "
                    f"{DATA_API_KEY_FILE} (run: --api-key-file) at the right one",
                )
            )
    if options.tls_cert_file is not None and options.tls_key_file is not None:
        problems = []
        for path, kind in (
            (options.tls_cert_file, "certificate"),
            (options.tls_key_file, "private key"),
        ):
            try:
                pem_text(path, kind)
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            checks.append(
                Check(
                    "api.tls_files",
                    "fail",
                    "; ".join(problems),
                    f"point {DATA_TLS_CERT_FILE} and {DATA_TLS_KEY_FILE} (run: --tls-cert-file, "
                    "--tls-key-file) at a PEM certificate and its private key",
                )
            )
        else:
            seen = f"{options.tls_cert_file} and {options.tls_key_file}: PEM"
            checks.append(Check("api.tls_files", "ok", seen))
    return checks


def _servable(
    facts: HostFacts, recipe: Recipe | None, catalog: Sequence[tuple[str, Recipe]]
) -> tuple[str, ...]:
    """Without a recipe: the catalog's recipes whose card a GPU here matches, driver new enough."""
    if recipe is not None or facts.gpus.state != "ok":
        return ()
    return tuple(path for path, r in catalog if match_gpus(r, facts.gpus.gpus).usable)


MAINTENANCE = "host.maintenance"


def maintenance_check(record: MaintenanceRecord) -> Check:
    """host.maintenance: a maintenance window is open (maintain begin): the host's units are
    stopped and kept from starting; nothing is deployed there until maintain end."""
    units = ", ".join(u.name for u in record.units) or "no unit"
    return Check(
        MAINTENANCE,
        "fail",
        f"in a maintenance window since {record.began} (begun by {record.by}, driver "
        f"{record.driver or 'unknown'}): {units} stopped and kept from starting",
        "finish the window once the driver is updated: tensorless-deploy maintain end -i "
        "INVENTORY --limit HOST (docs/maintain.md)",
    )


def _access_rows(facts: HostFacts, root: bool) -> list[Check]:
    """access.root first when the plan writes units (root), then each section the survey could
    not read (an access problem is the access row's, said once)."""
    access = survey_access_check(facts) if root else None
    checks: list[Check] = [access] if access is not None else []
    checks += [
        Check(p.split(":", 1)[0] + ".read", "warn", p)
        for p in facts.problems
        if not (access is not None and p.startswith("access:"))
    ]
    return checks


def _recipe_state_rows(recipe: Recipe | None, options: Options) -> list[Check]:
    """recipe.state: whether the recipe's state lets it run (no recipe: no row)."""
    if recipe is None:
        return []
    refusal = state_refusal(recipe, "run", options.allow_draft)
    return [
        Check(
            "recipe.state", "fail" if refusal else "ok", refusal or f"{recipe.state} recipe", None
        )
    ]


def _driver_rows(facts: HostFacts, recipe: Recipe | None) -> list[Check]:
    """driver.present, then the driver's branch and module for the cards a ceiling covers;
    a failed driver row that a branch or module row explains points at it."""
    from tensorless_deploy.decisions import guard

    driver = _driver_check(facts)
    branch = guard.branch_checks(
        facts,
        recipe.card.compute_capability if recipe is not None else None,
        recipe.card.id if recipe is not None else None,
    )
    explained = [c for c in branch if c.status == "fail"]
    if explained and driver.status == "fail":
        # "No devices were found" (or no driver at all) because the driver ignores the card:
        # the branch or module row says why and how to fix it
        driver = Check(
            driver.id,
            "fail",
            f"{driver.evidence}: the driver ignores the card ({explained[0].id}, below)",
            explained[0].fix,
        )
    return [driver, *branch]


def _host_rows(facts: HostFacts, recipe: Recipe | None, match: GpuMatch | None) -> list[Check]:
    """What only a surveyed host says (not inventory data): the cards' health (the recipe's
    matching cards, or all), driver.lock, an open maintenance window."""
    from tensorless_deploy.decisions import guard

    if facts.source != "host":
        return []
    checks: list[Check] = []
    if facts.gpus.state == "ok":
        scope = (
            list(match.usable + match.old_driver) if match is not None else list(facts.gpus.gpus)
        )
        checks += guard.health_checks(facts, scope, all_cards=recipe is None)
    lock = guard.driver_lock_check(facts)
    if lock is not None:
        checks.append(lock)
    if facts.maintenance is not None:
        checks.append(maintenance_check(facts.maintenance))
    return checks


def _engine_code_rows(
    facts: HostFacts, recipe: Recipe | None, match: GpuMatch | None
) -> list[Check]:
    """engine.code where a card could take the recipe: a CPU engine says so; a GPU image is
    judged where its labels were read (on the host, or from its registry by the fleet); one
    nobody read has no row."""
    from tensorless_deploy.decisions import guard

    if recipe is None or not (match is None or match.usable or match.old_driver):
        return []
    image = recipe.engine.image
    known = facts.engine_image(image)
    if recipe.engine.arch != "cpu" and known is None:
        return []
    return [
        guard.engine_code_check(recipe.engine.arch, recipe.card.compute_capability, image, known)
    ]


def _toolkit_rows(
    facts: HostFacts, engine: EngineName | None, match: GpuMatch | None
) -> list[Check]:
    """The container toolkit for the cards the container gets (the recipe's, or all)."""
    if facts.gpus.state != "ok":
        return []
    uuids = match.uuids if match is not None else tuple(g.uuid for g in facts.gpus.gpus if g.uuid)
    return _toolkit_checks(facts, engine, uuids)


def host_verdict(
    facts: HostFacts,
    recipe: Recipe | None,
    options: Options,
    catalog: Sequence[tuple[str, Recipe]] = (),
    existing: Existing = Existing(),
    ports: Sequence[int] | None = None,
    root: bool = True,
) -> Verdict:
    """Every check, in order. Without a recipe: readiness, and which catalog recipes fit.
    ports: where the plan serves (default: the option's one port). root: the plan writes units
    (deploy, serve, doctor): the host's commands must run as root, checked first."""
    checks = _access_rows(facts, root)
    checks += _systemd_check(facts, options)
    checks += api_check(options, ports)
    checks += _recipe_state_rows(recipe, options)
    checks += _driver_rows(facts, recipe)
    match = None
    if recipe is not None and facts.gpus.state == "ok":
        card_checks, match = _card_checks(facts, recipe)
        checks += card_checks
    checks += _device_checks(facts)
    checks += _host_rows(facts, recipe, match)
    servable = _servable(facts, recipe, catalog)
    if facts.source == "inventory":
        # offline: inventory data says only what the GPUs are; the rest is unknown, not failed
        return Verdict(tuple(checks), match, None, servable)
    checks += secret_file_checks(options)
    engine_checks, engine = _engine_checks(facts, options)
    checks += engine_checks
    checks += _engine_code_rows(facts, recipe, match)
    checks += _cgroup_check(facts, options)
    checks += _toolkit_rows(facts, engine, match)
    checks += _selinux_check(facts)
    if recipe is not None:
        checks += _disk_check(facts, recipe, existing)
    checks += _port_check(
        facts, options, existing, [options.port] if ports is None else ports, recipe is None
    )
    if facts.cpus is not None:
        checks.append(Check("cpu.count", "ok", f"{facts.cpus} CPUs"))
    return Verdict(tuple(checks), match, engine, servable)


def no_card_verdict(
    model: str, recipes: Sequence[Recipe], facts: HostFacts, options: Options, root: bool = True
) -> Verdict:
    """A host none of whose GPUs fits any card the model has a recipe for."""
    base = host_verdict(facts, None, options, root=root)
    cards = "; ".join(
        f"{r.card.id} (compute {r.card.compute_capability}, >= {r.card.min_memory_mib} MiB)"
        for r in recipes
    )
    have = "; ".join(describe_gpu(g) for g in facts.gpus.gpus) or "no GPUs"
    check = Check(
        "card.match",
        "fail",
        f"no recipe of {model} for this host's GPUs: it has {have}; "
        f"{model} has recipes for {cards}",
        "pick a model with a recipe for this card: tensorless-deploy doctor (no MODEL) lists them",
    )
    checks = list(base.checks)
    at = next((i for i, c in enumerate(checks) if c.id.startswith("driver.")), len(checks) - 1)
    checks.insert(at + 1, check)
    return Verdict(tuple(checks), None, base.engine)
