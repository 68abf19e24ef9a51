"""What `prepare` does to one host (pure): the host plan's failed checks, each automatable one
mapped to the operation keyed by the same check id, and every other one reported with why it is
left to the operator.

The driver is never installed or changed: a failed driver check (or a card, systemd or recipe
check that says this host cannot serve at all) stops the host with one line naming the driver
the recipes need. Docker is never installed; podman comes from the host's own packages, the
NVIDIA Container Toolkit from NVIDIA's package repository (or the mirror the inventory names).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensorless_deploy.decisions.cards import branch_of
from tensorless_deploy.decisions.checks import Check
from tensorless_deploy.decisions.guard import apt_pin, loaded_driver
from tensorless_deploy.decisions.options import (
    DATA_TOOLKIT_KEY,
    DATA_TOOLKIT_REPO,
    DATA_TOOLKIT_VERSION,
)
from tensorless_deploy.errors import InventoryError, UsageError
from tensorless_deploy.facts.nvidia import DRIVER_PIN_FILE
from tensorless_deploy.facts.values import HostFacts
from tensorless_deploy.hostplan.plan import HostPlan
from tensorless_deploy.recipe.schema import Recipe

# Where NVIDIA publishes the toolkit's packages (its install guide's repository); the inventory
# keys (decisions.options) and flags point elsewhere (a mirror) or pin a version.
NVIDIA_TOOLKIT_REPO = "https://nvidia.github.io/libnvidia-container"
TOOLKIT_DATA_KEYS = (DATA_TOOLKIT_VERSION, DATA_TOOLKIT_REPO, DATA_TOOLKIT_KEY)

# The check ids prepare has an operation for, in the order the operations run.
ENGINE = "engine.present"
TOOLKIT = "toolkit.present"
CDI = "toolkit.cdi"
UVM = "gpu.uvm"
CHAR_LINKS = "gpu.char_links"
SELINUX = "selinux.devices"
MODELS = "disk.model"
DRIVER_LOCK = "driver.lock"
DOOR = "gateway.haproxy"  # prepare --gateway, and the first step of every gateway run
STEP_ORDER = (ENGINE, TOOLKIT, CDI, UVM, CHAR_LINKS, SELINUX, MODELS, DOOR, DRIVER_LOCK)
# A failed check among these means the host cannot serve at all (or this login cannot change
# it): prepare changes nothing there.
DRIVER_CHECKS = (
    "driver.present",
    "driver.loaded",
    "driver.version",
    "driver.branch",
    "driver.module",
)
STOPS = (
    "access.root",
    *DRIVER_CHECKS,
    "gpu.responsive",
    "card.match",
    "systemd.pid1",
    "recipe.state",
)
# The SELinux type the models directory gets where SELinux is enforcing: the units mount it
# read-only, and a container may read files of this type.
MODELS_LABEL = "container_ro_file_t"

# Why prepare leaves a check to the operator (the check's own fix says what to run).
LEFT_WHY = {
    "engine.quadlet": "a newer podman is a distribution upgrade: prepare leaves it to you",
    "toolkit.docker_runtime": "registering the runtime restarts docker, which stops every "
    "container on the host: run the fix when you choose",
    "disk.model": "prepare never deletes anything to make room",
    "port.free": "prepare never stops what holds a port",
}
DOCKER_NEVER = (
    "docker is never installed by prepare: install it yourself, or let prepare install podman "
    "(tensorless_engine auto or podman)"
)

_VERSION = re.compile(r"[0-9][A-Za-z0-9.+~:-]*")
_URL = re.compile(r"https?://[A-Za-z0-9._~:/%+@-]+")


@dataclass(frozen=True)
class ToolkitSource:
    """Where the toolkit's packages come from, and which version (None: the repository's
    newest)."""

    repo: str = NVIDIA_TOOLKIT_REPO
    key: str | None = None  # None: <repo>/gpgkey, as NVIDIA publishes it
    version: str | None = None

    @property
    def key_url(self) -> str:
        return self.key or f"{self.repo}/gpgkey"

    def describe(self) -> str:
        return f"{self.version or 'newest'} from {self.repo}"


def _check_version(v: object) -> str | None:
    if isinstance(v, str) and _VERSION.fullmatch(v):
        return None
    return "must be a package version as apt or dnf shows it, e.g. 1.17.8-1"


def _check_url(v: object) -> str | None:
    if isinstance(v, str) and _URL.fullmatch(v):
        return None
    return "must be an http:// or https:// URL of letters, digits and . _ ~ : / % + @ -"


_RULES = (
    ("version", DATA_TOOLKIT_VERSION, "--toolkit-version", _check_version),
    ("repo", DATA_TOOLKIT_REPO, "--toolkit-repo", _check_url),
    ("key", DATA_TOOLKIT_KEY, "--toolkit-key", _check_url),
)


def toolkit_source(
    flags: Mapping[str, str | None], data: Mapping[str, object] | None, host: str
) -> ToolkitSource:
    """One host's toolkit source: a flag (flags: version, repo, key; None: not given) wins over
    the host's data, which wins over NVIDIA's repository and its newest version."""
    values: dict[str, Any] = {}
    for name, key, flag, rule in _RULES:
        value: object = flags.get(name)
        if value is not None:
            why = rule(value)
            if why is not None:
                raise UsageError(f"{flag} {value}: {why}")
        elif data is not None and data.get(key) is not None:
            value = data.get(key)
            why = rule(value)
            if why is not None:
                raise InventoryError(
                    f"{host}: {key}: {why} (got {value!r})",
                    fix=f"correct {key} in the inventory, or override with {flag}",
                )
        values[name] = value.rstrip("/") if isinstance(value, str) else None
    return ToolkitSource(
        repo=values["repo"] or NVIDIA_TOOLKIT_REPO, key=values["key"], version=values["version"]
    )


@dataclass(frozen=True)
class Step:
    """One operation prepare runs: the check id it fixes, what it does (one line), and the
    operation's arguments (operations.prepare.OPERATIONS[check])."""

    check: str
    action: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Left:
    """A check that is not ok and that prepare does not fix: the check (with its fix) and why."""

    check: Check
    why: str


@dataclass(frozen=True)
class HostPrep:
    """Everything prepare will do on one host, decided before anything runs."""

    host: str
    steps: tuple[Step, ...] = ()
    left: tuple[Left, ...] = ()
    stop: str | None = None  # why nothing is done on this host

    @property
    def checks(self) -> tuple[str, ...]:
        return tuple(s.check for s in self.steps)


def driver_need(recipes: Sequence[Recipe]) -> str:
    """The drivers the recipes need, one per card: '525.60.13 (p100), 580.65.06 (h200)'."""
    need: dict[str, str] = {}
    for r in recipes:
        need.setdefault(r.card.id, r.card.min_driver)
    return ", ".join(f"{v} ({card})" for card, v in sorted(need.items())) or "any"


def _stop_line(c: Check, need: str) -> str:
    if c.id in DRIVER_CHECKS:
        return (
            f"{c.id}: {c.evidence}; the recipes need NVIDIA driver {need} or newer, and prepare "
            "never installs or changes a driver (it needs a reboot in a window you choose)"
            + (f": {c.fix}" if c.fix else "")
        )
    return f"{c.id}: {c.evidence}" + (f" (fix: {c.fix})" if c.fix else "")


def _left_why(c: Check) -> str:
    if c.id.endswith(".read"):
        return "part of the survey could not be read: nothing to fix automatically"
    return LEFT_WHY.get(c.id, "no safe automatic fix")


def prepare_host(
    plan: HostPlan,
    facts: HostFacts,
    toolkit: ToolkitSource,
    need: str = "any",
    gateway: bool = False,
) -> HostPrep:
    """The steps for one host's plan (readiness or a model's), in STEP_ORDER, and the checks
    left to the operator. need: the drivers the recipes need (``driver_need``). gateway: the
    host is to run a front door (HAProxy from its packages, version checked)."""
    checks = plan.verdict.checks
    bad = [c for c in checks if c.status != "ok"]
    stops = [c for c in bad if c.status == "fail" and c.id in STOPS]
    if stops:
        return HostPrep(plan.host, stop=_stop_line(stops[0], need), left=_left(bad, set()))
    engine_docker = plan.options.engine == "docker" or plan.verdict.engine == "docker"
    steps: dict[str, Step] = {}
    failed = {c.id: c for c in bad}
    if ENGINE in failed and facts.engines is not None and plan.options.engine != "docker":
        steps[ENGINE] = Step(ENGINE, "podman from the host's own packages (apt or dnf)")
    if TOOLKIT in failed:
        steps[TOOLKIT] = Step(
            TOOLKIT,
            f"NVIDIA Container Toolkit {toolkit.describe()} (signing key {toolkit.key_url})",
            {"repo_url": toolkit.repo, "key_url": toolkit.key_url, "version": toolkit.version},
        )
    if CDI in failed or (TOOLKIT in failed and not engine_docker):
        cdi = _cdi_step(plan, facts)
        if cdi is not None:
            steps[CDI] = cdi
    if UVM in failed:
        steps[UVM] = Step(
            UVM,
            "nvidia-uvm loaded now (modprobe, where the nvidia module is loaded) and at boot "
            "(/etc/modules-load.d/nvidia-uvm.conf), its device nodes created now (nvidia-ctk "
            "system create-device-nodes --control-devices) and at every boot, before the served "
            "units (tensorless-nvidia-devices.service)",
        )
    if CHAR_LINKS in failed:
        steps[CHAR_LINKS] = Step(
            CHAR_LINKS,
            "/dev/char links created now (nvidia-ctk system create-dev-char-symlinks "
            "--create-all), kept by the udev rule /etc/udev/rules.d/71-nvidia-dev-char.rules "
            "and made again at every boot (tensorless-nvidia-devices.service)",
            {"nodes_pending": UVM in steps},
        )
    if SELINUX in failed:
        steps[SELINUX] = Step(SELINUX, "SELinux boolean container_use_devices on, persistent")
    if DRIVER_LOCK in failed:
        lock = driver_lock_step(facts)
        if lock is not None:
            steps[DRIVER_LOCK] = lock
    enforcing = facts.selinux is not None and facts.selinux.mode == "enforcing"
    models = plan.options.models_dir
    steps[MODELS] = Step(
        MODELS,
        f"models directory {models}: root-owned, mode 0755"
        + (f", SELinux type {MODELS_LABEL}" if enforcing else ""),
        {"path": models, "selinux_label": enforcing},
    )
    if gateway:
        from tensorless_deploy.hostplan.gateway import MIN_HAPROXY

        steps[DOOR] = Step(
            DOOR,
            "HAProxy from the host's own packages (apt or dnf), at least "
            f"{'.'.join(map(str, MIN_HAPROXY))}, for a front door (gateway)",
        )
    ordered = tuple(steps[c] for c in STEP_ORDER if c in steps)
    return HostPrep(plan.host, ordered, _left(bad, set(steps) - {MODELS, DOOR}, engine_docker))


def _cdi_step(plan: HostPlan, facts: HostFacts) -> Step | None:
    """The CDI spec for the cards the plan serves on (every card for readiness); None where
    the driver cannot say which cards there are."""
    if facts.gpus.state != "ok" or facts.driver_version is None:
        return None
    uuids = (
        plan.verdict.match.uuids
        if plan.verdict.match is not None
        else tuple(g.uuid for g in facts.gpus.gpus if g.uuid)
    )
    return Step(
        CDI,
        f"CDI spec generated for driver {facts.driver_version}, kept fresh after driver "
        "changes (the toolkit's nvidia-cdi-refresh units where it ships them, else "
        "tensorless-cdi-refresh.path), conflicting nvidia.com/gpu specs moved aside",
        {"driver_version": facts.driver_version, "gpu_uuids": uuids},
    )


def driver_lock_step(facts: HostFacts) -> Step | None:
    """Lock the driver's branch as found: its packages (those of the loaded driver's version)
    pinned by apt preferences (guard.apt_pin) or version-locked by dnf. None: nothing to lock."""
    pk = facts.driver_packages
    version = loaded_driver(facts)
    branch = branch_of(version) if version else None
    if pk is None or pk.manager is None or version is None or branch is None:
        return None
    names = pk.of_driver(version)
    if not names:
        return None
    if pk.manager == "apt":
        action = f"pin {', '.join(names)} to branch {branch} ({DRIVER_PIN_FILE})"
        args: dict[str, Any] = {"pin": apt_pin(names, branch)}
    else:
        specs = [f"{n}-{pk.packages[n]}" for n in names]
        action = f"dnf versionlock {', '.join(specs)}"
        args = {"specs": specs}
    return Step(DRIVER_LOCK, action, {"manager": pk.manager, **args})


def _left(bad: Sequence[Check], fixed: set[str], engine_docker: bool = False) -> tuple[Left, ...]:
    out = []
    for c in bad:
        if c.id in fixed or c.id in STOPS:
            continue
        why = DOCKER_NEVER if c.id == ENGINE and engine_docker else _left_why(c)
        out.append(Left(c, why))
    return tuple(out)
