"""deploy: survey every host, plan each one (hostplan.plan_host), refuse those whose plan fails,
converge the rest in parallel with pyinfra, and report per host. Also the rolling form.

A host the survey shows converged (every step of ``operations.deploy.serve_plan`` a no-op: the
image held, the model blob stamped and linked, each unit's sha256 the rendered unit's, /health
200 for every instance, no surplus instance) gets no pyinfra operation at all: its one round
trip was the survey. A dry run is judged from the survey the same way, and shows the unit diff
where a unit would change.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from tensorless_deploy.decisions.checks import Check, Tuning
from tensorless_deploy.decisions.device import CPU_DEVICE, DeviceVerdict, device_verdict
from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.facts.device import parse_device_log
from tensorless_deploy.facts.values import LABEL_DEVICE, LABEL_RECIPE_DIGEST, HostFacts
from tensorless_deploy.fleet.connect import (
    Refused,
    Unreachable,
    disconnect,
    lost,
    new_state,
    on_each_host,
    run_hosts,
    survey_and_size,
)
from tensorless_deploy.fleet.lock import LockHeld
from tensorless_deploy.fleet.unitlog import read_output
from tensorless_deploy.hostplan.plan import HostPlan, Instance, plan_host
from tensorless_deploy.recipe.catalog import Catalog

if TYPE_CHECKING:
    from tensorless_deploy.fleet.push import Progress

Outcome = Literal[
    "changed",
    "unchanged",
    "failed",
    "skipped",
    "unreachable",
    "would change",
    "no change",
    "untouched",
]


@dataclass(frozen=True)
class StepResult:
    name: str
    outcome: str  # changed, unchanged, failed, not run, would change, no change
    output: tuple[str, ...] = ()
    seconds: float | None = None  # how long the step ran on the host (None: it did not run)


@dataclass(frozen=True)
class HostResult:
    host: str
    outcome: Outcome
    reason: str | None = None
    recipe: str | None = None
    recipe_digest: str | None = None
    card: str | None = None
    addresses: tuple[str, ...] = ()  # one per instance, from the launch spec
    tuning: Tuning | None = None
    transfer: str | None = None  # how model and image got there: pull or push, and why
    failed_checks: tuple[Check, ...] = ()
    steps: tuple[StepResult, ...] = field(default_factory=tuple)
    # per instance, what it runs on as its own start log says (decisions.device), "" not known
    devices: tuple[str, ...] = ()
    # the recipe digest the host's units of the model run after the run, read back from the
    # host (the running containers' labels, or the survey's for a host that needed nothing)
    serving_digest: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome not in ("failed", "skipped", "unreachable", "untouched")

    @property
    def address(self) -> str | None:
        return ", ".join(self.addresses) or None


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
    paths = plan.paths
    steps = {
        "image": not held,
        "model": not tool.verified(paths.blob, paths.snapshot, paths.link_target),
    }
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


def _meta_lines(meta: Any) -> tuple[str, ...]:
    return tuple(line for line in (meta.stdout + "\n" + meta.stderr).splitlines() if line)


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
        out.append(StepResult(name, "would change" if changing else "no change"))
    return tuple(out)


def _step_results(
    metas: dict[str, Any], dry: bool, seconds: dict[str, float] | None = None
) -> tuple[StepResult, ...]:
    if dry:
        return _dry_steps(metas)
    took = seconds or {}
    out = []
    for name, meta in metas.items():
        t = took.get(meta._hash)
        if not meta.is_complete():
            out.append(StepResult(name, "not run"))
        elif meta.did_error():
            out.append(StepResult(name, "failed", _meta_lines(meta), t))
        elif not meta.executed:  # a noop, or a follow-up whose condition did not hold
            out.append(StepResult(name, "unchanged"))
        else:
            outcome = "changed" if meta.did_change() else "unchanged"
            out.append(StepResult(name, outcome, _meta_lines(meta), t))
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


def _op_timer(state: Any) -> dict[tuple[str, str], float]:
    """Seconds each operation ran on each host, (host, op hash) -> s, filled while run_ops runs
    (the per-phase times the deploy bench prints)."""
    import time

    from pyinfra.api.state import BaseStateCallback

    took: dict[tuple[str, str], float] = {}
    started: dict[tuple[str, str], float] = {}

    class Timer(BaseStateCallback):
        @staticmethod
        def operation_host_start(state: Any, host: Any, op_hash: Any) -> None:
            started[(host.name, op_hash)] = time.monotonic()

        @staticmethod
        def operation_host_success(
            state: Any, host: Any, op_hash: Any, retry_count: int = 0
        ) -> None:
            key = (host.name, op_hash)
            took[key] = time.monotonic() - started.get(key, time.monotonic())

        @staticmethod
        def operation_host_error(state: Any, host: Any, op_hash: Any, *args: Any) -> None:
            key = (host.name, op_hash)
            took[key] = time.monotonic() - started.get(key, time.monotonic())

    state.add_callback_handler(Timer())
    return took


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
    failed = [s for s in steps if s.outcome == "failed"]
    outcome: Outcome
    if dry:
        outcome = "would change" if any(s.outcome == "would change" for s in steps) else "no change"
    elif failed:
        outcome = "failed"
    else:
        outcome = "changed" if any(s.outcome == "changed" for s in steps) else "unchanged"
    assert plan.entry is not None
    reason = None
    if failed:
        name = failed[0].name
        reason = f"{name} failed: {why[name]}" if name in why else f"{name} failed"
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


def deploy(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, request: DeployRequest
) -> list[HostResult]:
    """Converge every host to serve request.model; the per-host result says what happened."""
    from tensorless_deploy.fleet.connect import fleet_of
    from tensorless_deploy.fleet.push import (
        DownloadWatch,
        choose_transfer,
        push,
        remote_image_path,
    )

    entries = catalog.find(request.model)
    # a run that changes hosts holds each one's lock from before its survey (fleet.lock)
    lock = None if request.dry else f"deploy {request.model}"
    state = new_state(inventory, request.flags, lock=lock)
    surveyed, sizing = survey_and_size(
        state, hosts, request.flags, entries, local=request.local, keep_connected=True
    )
    by_name = {h.name: h for h in hosts}
    results: dict[str, HostResult] = {}
    plans: dict[str, HostPlan] = {}
    known: dict[str, dict[str, bool] | None] = {}
    by_facts: dict[str, HostFacts] = {}
    token = _Token(request)
    try:
        for s in surveyed:
            if s.facts is None:
                results[s.name] = HostResult(s.name, not_reached(s.error), s.error)
                continue
            by_facts[s.name] = s.facts
            plan = plan_host(s.name, s.facts, entries, s.options, sizing=sizing)
            if plan.ok:
                plans[s.name] = plan
                known[s.name] = survey_steps(plan, s.facts)
            else:
                results[s.name] = _refused(plan)

        # Converged hosts: the survey was their one round trip; no operation, no probe.
        for name in [n for n in plans if converged(known[n])]:
            plan = plans.pop(name)
            steps = known[name]
            assert steps is not None
            done = _judged(plan, steps, request.dry, {})
            found = survey_devices(plan, by_facts[name])
            result = _result(plan, done, request.dry, NOTHING_TO_FETCH, found)
            if not request.dry:  # what the survey read there: healthy units of this recipe
                result = replace(result, serving_digest=surveyed_digest(plan, by_facts[name]))
            results[name] = result

        # What is missing where: the survey says, else (None) the transfer checks find out.
        missing = {
            n: (None if k is None else (k["model"], k["image"]))
            for n, k in known.items()
            if n in plans
        }
        modes: dict[str, tuple[str, str]] = {}
        transfers: dict[str, str] = {}
        if plans:
            modes = choose_transfer(state, by_name, plans, request.transfer, missing)
            transfers = {n: f"{m} ({why})" if why else m for n, (m, why) in modes.items()}

        if request.dry:
            # judged from the survey: no pyinfra stage; the unit diff read where a unit changes
            judged = {n: p for n, p in plans.items() if known[n] is not None}
            diffs = unit_diffs(state, by_name, judged, known) if judged else {}
            for name in judged:
                plan = plans.pop(name)
                steps = known[name]
                assert steps is not None
                judged_steps = _judged(plan, steps, True, diffs.get(name, {}))
                found = survey_devices(plan, by_facts[name])
                results[name] = _result(plan, judged_steps, True, transfers.get(name), found)

        steps_meta: dict[str, dict[str, Any]] = {}
        took: dict[tuple[str, str], float] = {}
        pushing = {n: p for n, p in plans.items() if modes[n][0] == "push"}
        if pushing and not request.dry:
            errors, sent = push(state, by_name, pushing, token, missing, request.progress)
            for name, what in sent.items():
                transfers[name] += f"; {what}"
            for name, error in errors.items():
                plans.pop(name)
                gone = lost(state, name)
                results[name] = HostResult(
                    name,
                    "unreachable" if gone else "failed",
                    gone or error,
                    transfer=transfers[name],
                )
        if plans:  # something to change: pyinfra's operations (a converged fleet needs none)
            from pyinfra.api.deploy import add_deploy
            from pyinfra.api.state import StateStage
            from pyinfra.context import ctx_state

            from tensorless_deploy.operations.deploy import serve_plan

            state.set_stage(StateStage.Prepare)
            prepare: dict[str, dict[str, Any]] = {}
            downloading: dict[str, tuple[str, str, int]] = {}
            for name, plan in plans.items():
                pushed = modes[name][0] == "push"
                archive = (
                    remote_image_path(plan.recipe.engine.image) if pushed and plan.recipe else None
                )
                need = missing.get(name)
                downloads = not pushed and (need is None or need[0])
                if downloads and plan.paths is not None and plan.recipe is not None:
                    p = plan.paths
                    downloading[name] = (p.partial, p.blob, plan.recipe.model.size_bytes)
                held = fleet_of(state).locks.get(name)
                prepare[name] = dict(
                    plan=plan,
                    token=token() if downloads and not request.dry else None,
                    transfer=modes[name][0],
                    archive=archive,
                    steps=steps_meta,
                    owner=held.pid if held is not None else None,
                    host=by_name[name],
                )

            # Every host's operations read their facts while they are added: all hosts at
            # once, on pyinfra's own pool (in API mode an operation's hash is its ordinal on
            # its host, so the order hosts are prepared in changes nothing).
            # (the state context is one for all greenlets: set once, around all of them)
            with ctx_state.use(state):
                jobs = [
                    state.pool.spawn(add_deploy, state, serve_plan, **kw) for kw in prepare.values()
                ]
                state.pool.join()
            for job in jobs:
                job.get()  # an error while preparing is raised as it was when done in turn
            if not request.dry:
                state.set_stage(StateStage.Execute)
                took = _op_timer(state)
                names = {
                    host: {meta._hash: step for step, meta in metas.items()}
                    for host, metas in steps_meta.items()
                }
                with DownloadWatch(by_name, downloading, request.progress):
                    run_hosts(state, [by_name[n] for n in plans], names)

        for name, plan in plans.items():
            seconds = {h: t for (n, h), t in took.items() if n == name}
            step_results = _step_results(steps_meta.get(name, {}), request.dry, seconds)
            result = _result(plan, step_results, request.dry, transfers.get(name))
            gone = lost(state, name)
            if gone is not None:
                result = replace(result, outcome="unreachable", reason=gone)
            results[name] = result
        if not request.dry:
            ran = [n for n in plans if results[n].ok]
            for name, seen in read_back(state, by_name, {n: plans[n] for n in ran}).items():
                results[name] = seen(results[name])
    finally:
        disconnect(hosts)
    return [results[h.name] for h in hosts]


def roll(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, request: DeployRequest, serial: int
) -> list[HostResult]:
    """deploy --serial N: N hosts at a time, the next batch only once this one is healthy; the
    first host that fails (restored to its previous unit by deploy itself) stops the roll, and
    the hosts after it are left untouched."""
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
