"""deploy: survey every host, plan each one (hostplan.plan_host), refuse those whose plan fails,
converge the rest in parallel with pyinfra, and report per host. Also the rolling form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tensorless_deploy.decisions.checks import Check, Tuning
from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.fleet.connect import disconnect, new_state, survey_hosts
from tensorless_deploy.hostplan.plan import HostPlan, plan_host
from tensorless_deploy.recipe.catalog import Catalog

Outcome = Literal[
    "changed", "unchanged", "failed", "skipped", "would change", "no change", "untouched"
]


@dataclass(frozen=True)
class StepResult:
    name: str
    outcome: str  # changed, unchanged, failed, not run, would change, no change
    output: tuple[str, ...] = ()


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

    @property
    def ok(self) -> bool:
        return self.outcome not in ("failed", "skipped", "untouched")

    @property
    def address(self) -> str | None:
        return ", ".join(self.addresses) or None


@dataclass(frozen=True)
class DeployRequest:
    model: str
    flags: Flags = field(default_factory=Flags)
    dry: bool = False
    token: str | None = None
    transfer: str = "auto"  # pull: hosts fetch; push: the controller sends; auto: per host
    local: bool = False  # this machine through the deploy path (serve)


def _meta_lines(meta: Any) -> tuple[str, ...]:
    return tuple(line for line in (meta.stdout + "\n" + meta.stderr).splitlines() if line)


def _dry_steps(metas: dict[str, Any]) -> tuple[StepResult, ...]:
    """What a real run would do, step by step. pyinfra cannot know at prepare time whether a
    follow-up guarded by ``_if=unit.did_change`` will run, so the restart is judged from its
    unit: it would run exactly when the unit would change."""
    out = []
    for name, meta in metas.items():
        kind, _, suffix = name.partition(" ")
        unit = metas.get(f"unit {suffix}".strip())
        if kind == "restart" and unit is not None:
            changing = bool(unit.will_change)
        elif kind == "serving" and unit is not None:
            changing = not unit.will_change and bool(meta.will_change)
        else:
            changing = bool(meta.will_change)
        out.append(StepResult(name, "would change" if changing else "no change"))
    return tuple(out)


def _step_results(metas: dict[str, Any], dry: bool) -> tuple[StepResult, ...]:
    if dry:
        return _dry_steps(metas)
    out = []
    for name, meta in metas.items():
        if not meta.is_complete():
            out.append(StepResult(name, "not run"))
        elif meta.did_error():
            out.append(StepResult(name, "failed", _meta_lines(meta)))
        elif not meta.executed:  # a noop, or a follow-up whose condition did not hold
            out.append(StepResult(name, "unchanged"))
        else:
            outcome = "changed" if meta.did_change() else "unchanged"
            out.append(StepResult(name, outcome, _meta_lines(meta)))
    return tuple(out)


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


def _result(
    plan: HostPlan, steps: tuple[StepResult, ...], dry: bool, transfer: str | None
) -> HostResult:
    failed = [s for s in steps if s.outcome == "failed"]
    outcome: Outcome
    if dry:
        outcome = "would change" if any(s.outcome == "would change" for s in steps) else "no change"
    elif failed:
        outcome = "failed"
    else:
        outcome = "changed" if any(s.outcome == "changed" for s in steps) else "unchanged"
    assert plan.entry is not None
    return HostResult(
        host=plan.host,
        outcome=outcome,
        reason=f"{failed[0].name} failed" if failed else None,
        recipe=plan.entry.path,
        recipe_digest=plan.entry.digest,
        card=plan.card,
        addresses=tuple(i.spec.address for i in plan.instances),
        tuning=plan.instances[0].spec.tuning if plan.instances else None,
        transfer=transfer,
        steps=steps,
    )


def deploy(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, request: DeployRequest
) -> list[HostResult]:
    """Converge every host to serve request.model; the per-host result says what happened."""
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operations import run_ops
    from pyinfra.api.state import StateStage

    from tensorless_deploy.fleet.push import choose_transfer, push, remote_image_path
    from tensorless_deploy.operations.deploy import serve_plan

    entries = catalog.find(request.model)
    state = new_state(inventory)
    surveyed = survey_hosts(state, hosts, request.flags, local=request.local, keep_connected=True)
    by_name = {h.name: h for h in hosts}
    results: dict[str, HostResult] = {}
    plans: dict[str, HostPlan] = {}
    try:
        for s in surveyed:
            if s.facts is None:
                results[s.name] = HostResult(s.name, "failed", s.error)
                continue
            plan = plan_host(s.name, s.facts, entries, s.options)
            if plan.ok:
                plans[s.name] = plan
            else:
                results[s.name] = _refused(plan)

        steps: dict[str, dict[str, Any]] = {}
        transfers: dict[str, str] = {}
        modes: dict[str, tuple[str, str]] = {}
        if plans:
            modes = choose_transfer(state, by_name, plans, request.transfer)
            transfers = {n: f"{m} ({why})" for n, (m, why) in modes.items()}
            pushing = {n: p for n, p in plans.items() if modes[n][0] == "push"}
            if pushing and not request.dry:
                errors, sent = push(state, by_name, pushing, request.token)
                for name, what in sent.items():
                    transfers[name] += f"; {what}"
                for name, error in errors.items():
                    plans.pop(name)
                    results[name] = HostResult(name, "failed", error, transfer=transfers[name])
        if plans:
            state.set_stage(StateStage.Prepare)
            for name, plan in plans.items():
                pushed = modes[name][0] == "push"
                archive = (
                    remote_image_path(plan.recipe.engine.image) if pushed and plan.recipe else None
                )
                add_deploy(
                    state,
                    serve_plan,
                    plan=plan,
                    token=request.token,
                    transfer=modes[name][0],
                    archive=archive,
                    steps=steps,
                    host=by_name[name],
                )
            if not request.dry:
                state.set_stage(StateStage.Execute)
                try:
                    run_ops(state)
                except PyinfraError as exc:
                    if "No hosts remaining" not in str(exc):
                        raise  # pyinfra stops when every host failed: the report says why

        for name, plan in plans.items():
            step_results = _step_results(steps.get(name, {}), request.dry)
            results[name] = _result(plan, step_results, request.dry, transfers.get(name))
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
