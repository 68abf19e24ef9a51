"""deploy: survey every host, plan each one (hostplan.plan_host), refuse those whose plan fails,
converge the rest in parallel with pyinfra, and report per host. Also the rolling form.

A host the survey shows converged (every step of ``operations.deploy.serve_plan`` a no-op: the
image held, the model blob stamped and linked, each unit's sha256 the rendered unit's, /health
200 for every instance, no surplus instance) gets no pyinfra operation at all: its one round
trip was the survey. A dry run is judged from the survey the same way, and shows the unit diff
where a unit would change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tensorless_deploy.decisions.device import CPU_DEVICE, DeviceVerdict, device_verdict
from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.facts.device import parse_device_log
from tensorless_deploy.facts.values import (
    LABEL_DEVICE,
    LABEL_PORT,
    LABEL_RECIPE_DIGEST,
    DeployedUnit,
    HostFacts,
)
from tensorless_deploy.fleet.connect import (
    Refused,
    Unreachable,
    disconnect,
    fleet_of,
    lost,
    new_state,
    on_each_host,
    survey_and_size,
)
from tensorless_deploy.fleet.lock import LockHeld
from tensorless_deploy.fleet.runner import (
    HostResult,
    Outcome,
    StepResult,
    add_deploys,
    execute,
    first_failure,
    host_outcome,
    seconds_of,
    step_result,
    would,
)
from tensorless_deploy.fleet.unitlog import read_output
from tensorless_deploy.hostplan.plan import HostPlan, Instance, plan_host
from tensorless_deploy.recipe.catalog import Catalog

if TYPE_CHECKING:
    from tensorless_deploy.fleet.gateway import FleetDoor
    from tensorless_deploy.fleet.push import Progress, Source
    from tensorless_deploy.operations.deploy import Door

TokenSource = Callable[[], "str | None"]


@dataclass(frozen=True)
class DeployRequest:
    model: str
    flags: Flags = field(default_factory=Flags)
    dry: bool = False
    token: str | None = None
    transfer: str = "auto"  # pull: hosts fetch; push: the controller sends; auto: per host
    local: bool = False  # this machine through the deploy path (serve)
    # where the Hub token comes from when no token is given: asked only once a download will
    # really happen (a host lacks the model, or the controller must fetch it to push it)
    token_source: TokenSource | None = None
    # bytes of each transfer while it runs (host, what, done, total): shown, never decided on
    progress: Progress | None = None
    # the bytes to push from (a verified offline bundle) instead of the Hub and the registry
    source: Source | None = None
    # the front door before the instances (door_of): each instance that changes is taken out
    # of it before its restart and put back once healthy and on its card
    door: Door | None = None


@contextlib.contextmanager
def door_of(inventory: Any, dry: bool = False) -> Iterator[FleetDoor | None]:
    """The front door of the run's hosts (fleet.gateway.FleetDoor: each host's door, as its
    marker names it, found when one of its instances first changes; a host no door fronts is
    changed as without one, its /slots idle wait still first); None for a dry run, which asks
    no door. Its connections end with the block."""
    if dry:
        yield None
        return
    from tensorless_deploy.fleet.gateway import FleetDoor

    door = FleetDoor(inventory)
    try:
        yield door
    finally:
        door.close()


def unit_port(unit: DeployedUnit) -> int | None:
    """The port a unit serves on, as its labels say (the door knows an instance by it)."""
    labels = unit.container_labels or unit.unit_labels
    text = labels.get(LABEL_PORT, "")
    return int(text) if text.isdigit() else None


def take_out_units(
    door: Door | None, host: str, units: Sequence[DeployedUnit], timeout_s: float
) -> tuple[str, ...]:
    """Each of a host's units that are about to stop taken out of the door, one line each on
    what it answered (nothing without a door): for stop and maintain begin, where every unit
    of the host goes and none comes back in this run."""
    if door is None or not door.fronts(host):
        return ()
    out = []
    for u in units:
        port = unit_port(u)
        if port is None:
            out.append(f"{u.name}: carries no {LABEL_PORT} label: not taken out of the door")
            continue
        out.append(f"{u.name} ({port}): {door.take_out(host, port, timeout_s) or 'taken out'}")
    return tuple(out)


class _Token:
    """The request's Hub token, looked up at most once, and only when asked for."""

    def __init__(self, request: DeployRequest) -> None:
        self.request = request
        self.value: str | None = request.token
        self.asked = request.token is not None or request.token_source is None

    def __call__(self) -> str | None:
        if not self.asked:
            self.asked = True
            assert self.request.token_source is not None
            self.value = self.request.token_source()
        return self.value


def _step(name: str, instance: int, count: int) -> str:
    """A step's name in the report, as operations.deploy.serve_plan names it."""
    return name if count == 1 else f"{name} {instance}"


def holds_model(plan: HostPlan, facts: HostFacts) -> bool:
    """The survey shows the host's cache holding the plan's model verified (stamped by this
    tool's last verification, linked from its snapshot): nothing to fetch, and a relay sender."""
    tool, paths = facts.tool, plan.paths
    return (
        tool is not None
        and paths is not None
        and tool.verified(paths.blob, paths.snapshot, paths.link_target)
    )


def survey_steps(plan: HostPlan, facts: HostFacts) -> dict[str, bool] | None:
    """Every step ``serve_plan`` would take on this host and whether it would change anything,
    judged from the survey alone (the same tests its operations make with their own facts); None
    where the survey cannot tell (a survey without the tool-state section, images not listed,
    a key or TLS files to compare)."""
    tool = facts.tool
    if tool is None or plan.recipe is None or plan.paths is None or not plan.instances:
        return None
    if any(inst.spec.secrets for inst in plan.instances):
        return None  # the survey reads no secret: the secrets operation compares them itself
    held = tool.has_image(plan.instances[0].spec.engine, plan.recipe.engine.image)
    if held is None:
        return None
    steps = {"image": not held, "model": not holds_model(plan, facts)}
    count = len(plan.instances)
    for inst in plan.instances:
        if inst.unit is None:
            return None
        want = hashlib.sha256(inst.unit.content.encode()).hexdigest()
        there = next((u for u in tool.units if u.path == inst.unit.path), None)
        changes = there is None or there.sha256 != want
        steps[_step("unit", inst.ordinal, count)] = changes
        steps[_step("restart", inst.ordinal, count)] = changes
        healthy = there is not None and there.health == 200
        steps[_step("serving", inst.ordinal, count)] = not changes and not healthy
    for u in plan.surplus:
        steps[f"remove {u.name}"] = True
    return steps


def converged(steps: dict[str, bool] | None) -> bool:
    return steps is not None and not any(steps.values())


def unit_diffs(
    state: Any, by_name: dict[str, Any], changing: dict[str, HostPlan], steps: dict[str, Any]
) -> dict[str, dict[str, tuple[str, ...]]]:
    """For a dry run: per host, per unit step that would change, the diff of the unit on the
    host against the rendered one. One read per changing unit that exists there (a unit that
    does not exist yet is named as new); hosts with nothing changing are not asked again."""
    from pyinfra.facts.files import FileContents

    from tensorless_deploy.fleet.connect import host_fact

    def one(host: Any) -> dict[str, tuple[str, ...]]:
        plan = changing[host.name]
        tool = steps[host.name]
        count = len(plan.instances)
        out: dict[str, tuple[str, ...]] = {}
        for inst in plan.instances:
            name = _step("unit", inst.ordinal, count)
            if inst.unit is None or not tool.get(name):
                continue
            path = inst.unit.path
            new = inst.unit.content.splitlines()
            old = host_fact(state, host, FileContents, path=path)
            if old is None:
                out[name] = (f"new unit {path} ({len(new)} lines)",)
                continue
            diff = difflib.unified_diff(
                list(old), new, f"{path} (on {host.name})", f"{path} (rendered)", lineterm=""
            )
            out[name] = tuple(diff)
        return out

    hosts = [by_name[n] for n in changing]
    results = on_each_host(state, hosts, one, keep_connected=True, access="checked")
    return {h.name: r for h, r in zip(hosts, results, strict=True) if not isinstance(r, str)}


def _dry_steps(metas: dict[str, Any]) -> tuple[StepResult, ...]:
    """What a real run would do, step by step. pyinfra cannot know at prepare time whether a
    follow-up guarded by ``_if=unit.did_change`` will run, so the restart is judged from its
    unit and secrets: it would run exactly when either would change."""
    out = []
    for name, meta in metas.items():
        kind, _, suffix = name.partition(" ")
        unit = metas.get(f"unit {suffix}".strip())
        keys = metas.get(f"secrets {suffix}".strip())  # a new key restarts it as well
        before = bool(unit is not None and unit.will_change) or bool(keys and keys.will_change)
        if kind == "restart" and unit is not None:
            changing = before
        elif kind == "serving" and unit is not None:
            changing = not before and bool(meta.will_change)
        else:
            changing = bool(meta.will_change)
        out.append(StepResult(name, would(changing)))
    return tuple(out)


def _step_results(
    metas: dict[str, Any], dry: bool, seconds: dict[str, float] | None = None
) -> tuple[StepResult, ...]:
    if dry:
        return _dry_steps(metas)
    took = seconds or {}
    out = [step_result(n, m, seconds=took.get(m._hash)) for n, m in metas.items()]
    return _restart_or_serving(tuple(out))


def _restart_or_serving(steps: tuple[StepResult, ...]) -> tuple[StepResult, ...]:
    """An instance's "restart" and "serving" are one wait for /health, taken one way or the
    other: where the restart ran, its twin did not run at all, and "serving: unchanged" beside
    a first deploy's restart would say the server was there before. The twin is left out."""
    restarted = {
        s.name.removeprefix("restart")
        for s in steps
        if s.name.startswith("restart") and s.outcome in ("changed", "failed")
    }
    return tuple(
        s
        for s in steps
        if not (
            s.name.startswith("serving")
            and s.name.removeprefix("serving") in restarted
            and s.outcome == "unchanged"
        )
    )


def _refused(plan: HostPlan) -> HostResult:
    e = plan.entry
    if plan.problem:  # this host's values cannot make a safe unit
        return HostResult(
            plan.host,
            "failed",
            plan.problem,
            e.path if e else None,
            e.digest if e else None,
            plan.card,
        )
    return HostResult(
        plan.host,
        "skipped",
        plan.why(),
        e.path if e else None,
        e.digest if e else None,
        plan.card,
        failed_checks=plan.failed(),
    )


def _instance_of(plan: HostPlan, step: str) -> Instance | None:
    """The instance a restart or serving step of serve_plan is for (named as _step names it)."""
    kind = step.partition(" ")[0]
    if kind not in ("restart", "serving"):
        return None
    count = len(plan.instances)
    return next((i for i in plan.instances if _step(kind, i.ordinal, count) == step), None)


def _read_steps(
    plan: HostPlan, steps: tuple[StepResult, ...]
) -> tuple[tuple[StepResult, ...], dict[int, DeviceVerdict], dict[str, str]]:
    """Each activation step's output read (fleet.unitlog): the journal cut to its first error,
    the device lines judged by the unit's label; the verdicts by instance, the failures' why."""
    out, devices, why = [], {}, {}
    for s in steps:
        inst = _instance_of(plan, s.name)
        if inst is None or not s.output:
            out.append(s)
            continue
        uuid = inst.spec.gpu_uuids[0] if inst.spec.gpu_uuids else None
        report = read_output(s.output, inst.spec.device, uuid)
        out.append(dataclasses.replace(s, output=report.lines))
        if report.device is not None:
            devices[inst.ordinal] = report.device
        if report.why and s.outcome == "failed":
            why[s.name] = report.why
    return tuple(out), devices, why


def survey_devices(plan: HostPlan, facts: HostFacts) -> dict[int, DeviceVerdict]:
    """For instances the survey found serving: what their start logs (kept by the survey) say
    they run on. A start log no longer in the journal says nothing: no verdict then."""
    tool = facts.tool
    if tool is None:
        return {}
    out = {}
    for inst in plan.instances:
        there = next((u for u in tool.units if inst.unit and u.path == inst.unit.path), None)
        if there is None or there.health != 200:
            continue
        label = there.labels.get(LABEL_DEVICE)
        if label is None:
            continue
        report = parse_device_log(there.device_log)
        if label != CPU_DEVICE and not report.said_anything:
            continue
        uuid = inst.spec.gpu_uuids[0] if inst.spec.gpu_uuids else None
        out[inst.ordinal] = device_verdict(label, report, uuid)
    return out


def _result(
    plan: HostPlan,
    steps: tuple[StepResult, ...],
    dry: bool,
    transfer: str | None,
    found: dict[int, DeviceVerdict] | None = None,
) -> HostResult:
    steps, devices, why = _read_steps(plan, steps)
    devices = {**(found or {}), **devices}
    outcome: Outcome = host_outcome([s.outcome for s in steps], dry)
    assert plan.entry is not None
    reason = None
    failed = None if dry else first_failure((s.name, s.outcome) for s in steps)
    if failed is not None:
        reason = f"{failed} failed: {why[failed]}" if failed in why else f"{failed} failed"
    elif not dry and any(not v.ok for v in devices.values()):
        # serving as the survey found it, but its own start log shows it elsewhere
        outcome = "failed"
        bad = next(v for v in devices.values() if not v.ok)
        reason = f"serving, but not on its card: {bad.why}"
    return HostResult(
        host=plan.host,
        outcome=outcome,
        reason=reason,
        recipe=plan.entry.path,
        recipe_digest=plan.entry.digest,
        card=plan.card,
        addresses=tuple(i.spec.address for i in plan.instances),
        tuning=plan.instances[0].spec.tuning if plan.instances else None,
        transfer=transfer,
        steps=steps,
        devices=tuple(
            devices[i.ordinal].device if i.ordinal in devices else "" for i in plan.instances
        ),
    )


NOTHING_TO_FETCH = "pull (nothing to fetch: the model and the image are there)"


def not_reached(error: str | None) -> Outcome:
    """The outcome of a host the run could not start on: unreachable (it passed its deadline),
    skipped (another run holds its lock, or its commands would not run as root: refused before
    any change, as a failed preflight check is), else failed."""
    if isinstance(error, Unreachable):
        return "unreachable"
    if isinstance(error, (LockHeld, Refused)):
        return "skipped"
    return "failed"


def surveyed_digest(plan: HostPlan, facts: HostFacts) -> str | None:
    """The recipe digest the plan's first unit carries on the host, as the survey read it (with
    /health 200 there): a converged host's read-back, in the survey's one round trip."""
    if facts.tool is None or not plan.instances:
        return None
    unit = facts.tool.unit(plan.instances[0].name)
    if unit is None or unit.health != 200:
        return None
    return unit.labels.get(LABEL_RECIPE_DIGEST)


Seen = Callable[[HostResult], HostResult]


def read_back(state: Any, by_name: dict[str, Any], plans: dict[str, HostPlan]) -> dict[str, Seen]:
    """After the run: what each host's units of the plan run now, read from the host (the
    running containers' recipe-digest label and /health, one round trip per host), never
    assumed from what was sent. A unit that runs another recipe, or none, fails the host."""
    from tensorless_deploy.facts.pyinfra import DeployedUnits

    hosts = [by_name[n] for n in plans]
    found = on_each_host(
        state,
        hosts,
        lambda h: DeployedUnits.typed(h.get_fact(DeployedUnits)),
        keep_connected=True,
        step="reading back what runs",
    )
    out: dict[str, Seen] = {}
    for host, units in zip(hosts, found, strict=True):
        plan = plans[host.name]
        assert plan.entry is not None
        want = plan.entry.digest
        if isinstance(units, str):
            out[host.name] = _unread(units)
            continue
        problems: list[str] = []
        digest: str | None = None
        for inst in plan.instances:
            unit = next((u for u in units if u.name == inst.name), None)
            runs = unit.container_labels.get(LABEL_RECIPE_DIGEST) if unit is not None else None
            if unit is None or runs is None:
                problems.append(f"{inst.name} runs no container")
            elif runs != want:
                problems.append(f"{inst.name} runs recipe {runs[:19]}, not this run's {want[:19]}")
            elif unit.health != 200:
                problems.append(f"{inst.name} answers /health {unit.health or 'nothing'}")
            if digest is None and runs is not None:
                digest = runs
        out[host.name] = _seen(digest, problems)
    return out


def _unread(error: str) -> Seen:
    def apply(r: HostResult) -> HostResult:
        if isinstance(error, Unreachable):
            return replace(r, outcome="unreachable", reason=error)
        return replace(r, outcome="failed", reason=f"reading back what runs: {error}")

    return apply


def _seen(digest: str | None, problems: list[str]) -> Seen:
    def apply(r: HostResult) -> HostResult:
        if problems:
            why = "read back after the run: " + "; ".join(problems)
            return replace(r, outcome="failed", reason=why, serving_digest=digest)
        return replace(r, serving_digest=digest)

    return apply


def _judged(
    plan: HostPlan, steps: dict[str, bool], dry: bool, diffs: dict[str, Any]
) -> tuple[StepResult, ...]:
    """The report's steps of a host judged from its survey, without pyinfra."""
    if not dry:
        return tuple(StepResult(name, "unchanged") for name in steps)
    return tuple(
        StepResult(name, "would change" if change else "no change", diffs.get(name, ()))
        for name, change in steps.items()
    )


@dataclass
class _Run:
    """One deploy run between its phases: the hosts still to converge (plans) and what each
    phase found out about them; a host leaves plans once its result is known."""

    request: DeployRequest
    state: Any
    by_name: dict[str, Any]
    token: _Token
    results: dict[str, HostResult] = field(default_factory=dict)
    plans: dict[str, HostPlan] = field(default_factory=dict)
    known: dict[str, dict[str, bool] | None] = field(default_factory=dict)  # survey_steps
    facts: dict[str, HostFacts] = field(default_factory=dict)
    # what is missing where, (model, image): the survey says, else (None) the transfer finds out
    missing: dict[str, tuple[bool, bool] | None] = field(default_factory=dict)
    # the hosts whose cache holds the model verified (the survey says): a relay's first senders
    holding: dict[str, HostPlan] = field(default_factory=dict)
    modes: dict[str, tuple[str, str]] = field(default_factory=dict)  # pull or push, and why
    relayed: set[str] = field(default_factory=set)  # pulling hosts the relay sent the model to
    transfers: dict[str, str] = field(default_factory=dict)  # the report's words for it
    metas: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> step -> meta
    took: dict[tuple[str, str], float] = field(default_factory=dict)  # (host, op hash) -> s
    said: dict[str, list[str]] = field(default_factory=dict)  # host -> the door's answers


def deploy(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, request: DeployRequest
) -> list[HostResult]:
    """Converge every host to serve request.model; the per-host result says what happened."""
    entries = catalog.find(request.model)
    # a run that changes hosts holds each one's lock from before its survey (fleet.lock)
    lock = None if request.dry else f"deploy {request.model}"
    state = new_state(inventory, request.flags, lock=lock)
    run = _Run(request, state, {h.name: h for h in hosts}, _Token(request))
    try:
        _survey_and_plan(run, hosts, entries)
        _converged(run)
        _transfer(run)
        if request.dry:
            _judged_dry(run)
        _apply(run)
        _report(run)
    finally:
        disconnect(hosts)
    return [run.results[h.name] for h in hosts]


def _survey_and_plan(run: _Run, hosts: Sequence[Any], entries: Sequence[Any]) -> None:
    """Every host surveyed (one round trip) and planned; a host the survey could not read or
    whose plan fails has its result now, the others keep their plan."""
    request = run.request
    surveyed, sizing = survey_and_size(
        run.state, hosts, request.flags, entries, local=request.local, keep_connected=True
    )
    for s in surveyed:
        if s.facts is None:
            run.results[s.name] = HostResult(s.name, not_reached(s.error), s.error)
            continue
        run.facts[s.name] = s.facts
        plan = plan_host(s.name, s.facts, entries, s.options, sizing=sizing)
        if not plan.ok:
            run.results[s.name] = _refused(plan)
            continue
        run.plans[s.name] = plan
        known = run.known[s.name] = survey_steps(plan, s.facts)
        run.missing[s.name] = None if known is None else (known["model"], known["image"])
        if holds_model(plan, s.facts):  # a host with a key to compare too (known: None)
            run.holding[s.name] = plan


def _converged(run: _Run) -> None:
    """Converged hosts: the survey was their one round trip; no operation, no probe."""
    dry = run.request.dry
    for name in [n for n in run.plans if converged(run.known[n])]:
        plan = run.plans.pop(name)
        steps = run.known[name]
        assert steps is not None
        facts = run.facts[name]
        result = _result(
            plan, _judged(plan, steps, dry, {}), dry, NOTHING_TO_FETCH, survey_devices(plan, facts)
        )
        if not dry:  # what the survey read there: healthy units of this recipe
            result = replace(result, serving_digest=surveyed_digest(plan, facts))
        run.results[name] = result


def _transfer(run: _Run) -> None:
    """How each host gets the model and the image (pull or push, fleet.push.choose_transfer);
    in a real run the controller then sends what the push hosts lack. A host whose push failed
    has its result now."""
    from tensorless_deploy.fleet.push import choose_transfer, push

    if not run.plans:
        return
    run.modes = choose_transfer(
        run.state, run.by_name, run.plans, run.request.transfer, run.missing
    )
    run.transfers = {n: f"{m} ({why})" if why else m for n, (m, why) in run.modes.items()}
    _relay_pulls(run)
    pushing = {n: p for n, p in run.plans.items() if run.modes[n][0] == "push"}
    if not pushing or run.request.dry:
        return
    request = run.request
    errors, sent = push(
        run.state,
        run.by_name,
        pushing,
        run.token,
        run.missing,
        request.progress,
        request.source,
        held=run.holding,
    )
    _transferred(run, sent, errors)


def _relay_pulls(run: _Run) -> None:
    """The pulling hosts that ask for the relay get the model from the run's hosts that hold it,
    one of them downloading it first where none does (fleet.seed)."""
    from tensorless_deploy.fleet.seed import relay_pulls, wanting

    asking = wanting(run.plans, run.modes)
    if not asking:
        return
    request = run.request
    done = relay_pulls(
        run.state,
        run.by_name,
        asking,
        run.missing,
        run.holding,
        run.token,
        request.progress,
        request.dry,
    )
    run.relayed = done.relayed
    _transferred(run, done.said, done.failed)


def _transferred(run: _Run, sent: dict[str, str], errors: dict[str, str]) -> None:
    """What a transfer sent where, in each host's transfer words; a host it failed has its
    result now."""
    for name, what in sent.items():
        run.transfers[name] += f"; {what}"
    for name, error in errors.items():
        run.plans.pop(name, None)
        gone = lost(run.state, name)
        run.results[name] = HostResult(
            name, "unreachable" if gone else "failed", gone or error, transfer=run.transfers[name]
        )


def _judged_dry(run: _Run) -> None:
    """A dry run's hosts the survey can judge: no pyinfra stage; the unit diff read where a unit
    would change."""
    judged = {n: p for n, p in run.plans.items() if run.known[n] is not None}
    diffs = unit_diffs(run.state, run.by_name, judged, run.known) if judged else {}
    for name in judged:
        plan = run.plans.pop(name)
        steps = run.known[name]
        assert steps is not None
        done = _judged(plan, steps, True, diffs.get(name, {}))
        found = survey_devices(plan, run.facts[name])
        run.results[name] = _result(plan, done, True, run.transfers.get(name), found)


def _apply(run: _Run) -> None:
    """Something to change: serve_plan's operations added for every host left, then run (a dry
    run only adds them, to say what would change)."""
    from tensorless_deploy.fleet.push import DownloadWatch, remote_image_path
    from tensorless_deploy.operations.deploy import serve_plan

    if not run.plans:  # a converged fleet needs no pyinfra operation
        return
    dry = run.request.dry
    calls = []
    downloading: dict[str, tuple[str, str, int]] = {}
    for name, plan in run.plans.items():
        transfer = run.modes[name][0]
        pushed = transfer == "push"
        archive = remote_image_path(plan.recipe.engine.image) if pushed and plan.recipe else None
        need = run.missing.get(name)
        model_sent = pushed or name in run.relayed
        downloads = not model_sent and (need is None or need[0])
        if downloads and plan.paths is not None and plan.recipe is not None:
            p = plan.paths
            downloading[name] = (p.partial, p.blob, plan.recipe.model.size_bytes)
        held = fleet_of(run.state).locks.get(name)
        calls.append(
            dict(
                plan=plan,
                token=run.token() if downloads and not dry else None,
                transfer=transfer,
                archive=archive,
                model_sent=model_sent,
                steps=run.metas,
                owner=held.pid if held is not None else None,
                door=run.request.door,
                said=run.said,
                host=run.by_name[name],
            )
        )
    add_deploys(run.state, serve_plan, calls)
    if dry:
        return
    names = {h: {meta._hash: step for step, meta in ms.items()} for h, ms in run.metas.items()}
    with DownloadWatch(run.by_name, downloading, run.request.progress):
        run.took = execute(run.state, [run.by_name[n] for n in run.plans], names)


def _report(run: _Run) -> None:
    """Each host that ran operations: its steps as the report says them, then (a real run) what
    its units run now, read back from the host."""
    dry = run.request.dry
    for name, plan in run.plans.items():
        seconds = seconds_of(run.took, name)
        steps = _step_results(run.metas.get(name, {}), dry, seconds)
        if run.said.get(name):  # what the door did, instance by instance
            steps += (StepResult("door", "changed", tuple(run.said[name])),)
        result = _result(plan, steps, dry, run.transfers.get(name))
        gone = lost(run.state, name)
        if gone is not None:
            result = replace(result, outcome="unreachable", reason=gone)
        run.results[name] = result
    if dry:
        return
    ran = {n: p for n, p in run.plans.items() if run.results[n].ok}
    for name, seen in read_back(run.state, run.by_name, ran).items():
        run.results[name] = seen(run.results[name])


def roll(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, request: DeployRequest, serial: int
) -> list[HostResult]:
    """deploy --serial N: at most N instances change at once. Hosts go N at a time, and within
    a host its instances go one by one (serve_plan: each restarted only once the one before is
    healthy and on its card again, after its requests in flight finished), so a host with two
    cards keeps serving through its own upgrade; the next batch starts only once this one is
    healthy. The first host that fails (restored to its previous unit by deploy itself) stops
    the roll, and the hosts after it are left untouched."""
    results: list[HostResult] = []
    stopped_by: str | None = None
    for start in range(0, len(hosts), serial):
        batch = hosts[start : start + serial]
        if stopped_by is not None:
            results += [
                HostResult(h.name, "untouched", f"the roll stopped at {stopped_by}") for h in batch
            ]
            continue
        done = deploy(inventory, batch, catalog, request)
        results += done
        bad = [r.host for r in done if not r.ok]
        if bad:
            stopped_by = ", ".join(bad)
    return results
