"""gate run's scratch instance on one host, decided from its survey (pure): an idle card of the
recipe's, a port no listener and no unit of this tool holds, and the launch spec the deploy path
would build for that card (hostplan.plan.plan_host), under a name of its own.

Idle: no unit of this tool runs on the card (its unit names the card's CDI device or docker
--gpus id), nvidia-smi lists no compute process on it, and shows no more than IDLE_MEMORY_MIB in
use there. A card that serves is never shared: the numbers would not be the card's, and the
serving instance would feel it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tensorless_deploy.decisions.checks import (
    check_line,
    describe_gpu,
    match_gpus,
    survey_access_check,
)
from tensorless_deploy.decisions.options import DEFAULT_BIND, Options
from tensorless_deploy.facts.values import LABEL_PORT, DeployedUnit, Gpu, HostFacts
from tensorless_deploy.gguf.sizing import Sizings
from tensorless_deploy.hostplan.plan import HostPlan, Instance, plan_host
from tensorless_deploy.launch.read import read_unit
from tensorless_deploy.recipe.catalog import Entry

# A card with more than this in use runs something (a driver's own idle use is a few MiB).
IDLE_MEMORY_MIB = 1024
# Where scratch instances listen (127.0.0.1 only): the first port here that nothing holds.
SCRATCH_PORTS = range(18080, 18180)
_GPU_ID = re.compile(r"GPU-[0-9A-Fa-f-]+")


@dataclass(frozen=True)
class ScratchPlan:
    """One host's answer: the plan of the scratch instance, or why the host cannot run one."""

    host: str
    plan: HostPlan | None = None
    gpu: Gpu | None = None
    refusal: str | None = None

    @property
    def ok(self) -> bool:
        return self.refusal is None and self.plan is not None and self.plan.ok

    @property
    def instance(self) -> Instance:
        assert self.plan is not None and self.plan.instances
        return self.plan.instances[0]

    def why(self) -> str:
        if self.refusal is not None:
            return self.refusal
        return self.plan.why() if self.plan is not None else "no plan"


def unit_cards(units: Sequence[DeployedUnit]) -> dict[str, str]:
    """GPU UUID -> the unit of this tool that runs on it (read from each unit's file)."""
    out: dict[str, str] = {}
    for u in units:
        content = read_unit(u.path, u.text)
        for value in (*content.values("device"), *content.values("gpus")):
            for uuid in _GPU_ID.findall(value):
                out.setdefault(uuid, u.name)
    return out


def unit_ports(units: Sequence[DeployedUnit], facts: HostFacts) -> set[int]:
    """Every port a unit of this tool serves on (or will, once started again)."""
    labels = [u.unit_labels for u in units]
    if facts.tool is not None:
        labels += [u.labels for u in facts.tool.units]
    return {int(p) for lab in labels if (p := lab.get(LABEL_PORT, "")).isdigit()}


def free_port(facts: HostFacts, units: Sequence[DeployedUnit]) -> int | None:
    """The first scratch port no listener blocks (on 127.0.0.1) and no unit of this tool owns;
    None when the survey could not list the listeners, or every one is taken."""
    if facts.listeners is None:
        return None
    owned = unit_ports(units, facts)
    for port in SCRATCH_PORTS:
        if port not in owned and not facts.port_taken(port, DEFAULT_BIND):
            return port
    return None


def idle_card(facts: HostFacts, entry: Entry, units: Sequence[DeployedUnit]) -> Gpu | str:
    """The first usable card of the recipe's that nothing runs on, or why there is none."""
    recipe = entry.recipe
    if facts.gpus.state != "ok":
        return "nvidia-smi cannot list the GPUs here (tensorless-deploy doctor says why)"
    usable = match_gpus(recipe, facts.gpus.gpus).usable
    if not usable:
        have = "; ".join(describe_gpu(g) for g in facts.gpus.gpus) or "no GPUs"
        return f"no usable {recipe.card.id} card here (it has {have})"
    serving = unit_cards(units)
    busy = []
    for g in sorted(usable, key=lambda g: g.index):
        apps = [a for a in facts.gpu_apps or () if a.gpu_uuid == g.uuid]
        if g.uuid is not None and g.uuid in serving:
            busy.append(f"GPU {g.index} serves {serving[g.uuid]}")
        elif apps:
            held = ", ".join(a.container or f"pid {a.pid}" for a in apps)
            busy.append(f"GPU {g.index} runs {held}")
        elif g.memory_used_mib is not None and g.memory_used_mib > IDLE_MEMORY_MIB:
            busy.append(f"GPU {g.index} has {g.memory_used_mib} MiB in use")
        else:
            return g
    return (
        f"every {recipe.card.id} card here is busy ({'; '.join(busy)}): gate run measures on "
        "an idle card and never shares a serving one (stop the unit, or pick another host "
        "with --limit)"
    )


def scratch_plan(
    host: str,
    facts: HostFacts,
    entry: Entry,
    options: Options,
    units: Sequence[DeployedUnit],
    name: str,
    sizing: Sizings | None,
) -> ScratchPlan:
    """The scratch instance for ``entry`` on this host: the host plan of one instance on an
    idle card, at a free port on 127.0.0.1, named ``name``, without a key, TLS or /metrics
    (none changes what is measured, and the instance is reached through SSH only); the
    operator's extra args and a draft recipe as given. sizing: the recipe's memory sizing, as
    deploy judges the card by it (None: memory not judged). The transient unit is root's, as
    deploy's units are: a host whose commands do not run as root is refused first
    (access.root, as deploy refuses it)."""
    access = survey_access_check(facts)
    if access is not None and access.status != "ok":
        return ScratchPlan(host, refusal=check_line(access))
    card = idle_card(facts, entry, units)
    if isinstance(card, str):
        return ScratchPlan(host, refusal=card)
    port = free_port(facts, units)
    if port is None:
        why = (
            "the survey could not list the listening ports"
            if facts.listeners is None
            else f"no port of {SCRATCH_PORTS.start}-{SCRATCH_PORTS.stop - 1} is free"
        )
        return ScratchPlan(host, gpu=card, refusal=f"no port for the scratch instance: {why}")
    scratch = dataclasses.replace(
        options,
        port=port,
        ports=None,
        bind=DEFAULT_BIND,
        instances=(card.index,),
        api_key_file=None,
        insecure_open=False,
        tls_cert_file=None,
        tls_key_file=None,
        metrics=False,
        allow_draft=True,
    )
    plan = plan_host(host, facts, [entry], scratch, sizing=sizing, units=False, name=name)
    return ScratchPlan(host, plan, card)
