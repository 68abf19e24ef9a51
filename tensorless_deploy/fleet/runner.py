"""The one pyinfra runner: operations added for many hosts (pyinfra's Prepare stage, on its own
pool), run on each host on its own schedule (the Execute stage, ``run_hosts``), and each
operation's meta mapped to one report step (``step_result``) and each host's steps to one outcome
(``host_outcome``). deploy, prepare, stop, rollback, prune, maintain and gate run their
operations through it; connecting, locking and reading facts are ``fleet.connect``'s.

The rule for a step that did not run: in a real run a host with a step that did not run (an
earlier step failed, or the host stopped answering before it) is failed, never "changed" or
"unchanged": what it was asked to reach it did not reach. A dry run runs nothing: its steps say
what a real run would do, "would change" or "no change".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tensorless_deploy.fleet.connect import in_step, lost, still_there

if TYPE_CHECKING:
    from tensorless_deploy.decisions.checks import Check, Tuning

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
# a host's outcome from its steps alone (host_outcome)
StepsOutcome = Literal["changed", "unchanged", "failed", "would change", "no change"]
NOT_RUN = "not run"  # a step's outcome in a real run where its operation never ran
FAILING = ("failed", NOT_RUN)  # the step outcomes that fail their host in a real run


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


@dataclass(frozen=True)
class Step:
    """One operation for one host: its report name, the operation, its arguments."""

    name: str
    op: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    preview: tuple[str, ...] = ()  # what a dry run says under the step: what it would do


# -- the one result mapping ------------------------------------------------------------------


def would(change: bool) -> str:
    """A dry run's step: what a real run would do."""
    return "would change" if change else "no change"


def meta_lines(meta: Any) -> tuple[str, ...]:
    """What an operation's commands printed, stdout then stderr, blank lines left out."""
    return tuple(line for line in (meta.stdout + "\n" + meta.stderr).splitlines() if line)


def step_result(
    name: str,
    meta: Any,
    *,
    dry: bool = False,
    seconds: float | None = None,
    preview: tuple[str, ...] = (),
) -> StepResult:
    """One operation's meta as the report's step (meta None: no operation was added for it)."""
    if meta is None:
        return StepResult(name, NOT_RUN)
    if dry:
        return StepResult(name, would(bool(meta.will_change)), preview)
    if not meta.is_complete():
        return StepResult(name, NOT_RUN)
    if meta.did_error():
        return StepResult(name, "failed", meta_lines(meta), seconds)
    if not meta.executed:  # a noop, or a follow-up whose condition did not hold
        return StepResult(name, "unchanged")
    return StepResult(
        name, "changed" if meta.did_change() else "unchanged", meta_lines(meta), seconds
    )


def first_failure(outcomes: Iterable[tuple[str, str]]) -> str | None:
    """The name of the first step that failed its host (failed, or not run), of (name, outcome)
    pairs in order; None: none did."""
    return next((name for name, outcome in outcomes if outcome in FAILING), None)


def host_outcome(outcomes: Sequence[str], dry: bool) -> StepsOutcome:
    """A host's outcome from its steps' (the one rule): a dry run would change or not; a real
    run failed where a step failed or did not run, else changed or unchanged."""
    if dry:
        return "would change" if "would change" in outcomes else "no change"
    if any(o in FAILING for o in outcomes):
        return "failed"
    return "changed" if "changed" in outcomes else "unchanged"


# -- stages and the run ----------------------------------------------------------------------


def add_steps(
    state: Any, hosts: Sequence[Any], steps: Mapping[str, Sequence[Step]]
) -> dict[str, list[tuple[Step, Any]]]:
    """Every host's steps added as pyinfra operations (the Prepare stage): per host, each step
    with its operation's meta."""
    from pyinfra.api.operation import add_op
    from pyinfra.api.state import StateStage

    metas: dict[str, list[tuple[Step, Any]]] = {h.name: [] for h in hosts}
    state.set_stage(StateStage.Prepare)
    for h in hosts:
        for s in steps.get(h.name, ()):
            res = add_op(state, s.op, name=s.name, host=h, **s.kwargs)
            metas[h.name].append((s, res[h]))
    return metas


def add_deploys(state: Any, deploy: Callable[..., Any], calls: Sequence[Mapping[str, Any]]) -> None:
    """A pyinfra @deploy added once per call (each call's keywords name its host): all hosts at
    once on pyinfra's own pool, since every host's operations read their facts while they are
    added (in API mode an operation's hash is its ordinal on its host, so the order hosts are
    prepared in changes nothing). An error while preparing is raised as it was."""
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.state import StateStage
    from pyinfra.context import ctx_state

    state.set_stage(StateStage.Prepare)
    # the state context is one for all greenlets: set once, around all of them
    with ctx_state.use(state):
        jobs = [state.pool.spawn(add_deploy, state, deploy, **kw) for kw in calls]
        state.pool.join()
    for job in jobs:
        job.get()


def execute(
    state: Any, hosts: Sequence[Any], steps: Mapping[str, Mapping[str, str]] | None = None
) -> dict[tuple[str, str], float]:
    """The Execute stage: run_hosts, timed. Returns the seconds each operation ran on each host,
    (host, op hash) -> s."""
    from pyinfra.api.state import StateStage

    state.set_stage(StateStage.Execute)
    took = _op_timer(state)
    run_hosts(state, hosts, steps)
    return took


def run_hosts(
    state: Any, hosts: Sequence[Any], steps: Mapping[str, Mapping[str, str]] | None = None
) -> None:
    """Run the operations added for hosts: each host its own, in the order they were added, all
    hosts at once and none waiting for another (pyinfra's run_ops waits for every host at every
    operation: one slow or cut host would hold the others' restarts). A host stops at its first
    failed operation; the rest of its operations stay not run. steps: host -> operation hash ->
    the step's name in the report (what an unreachable host was doing)."""
    import gevent
    from pyinfra.api.operations import run_host_op
    from pyinfra.context import ctx_host, ctx_state

    state.is_executing = True
    names = steps or {}

    def one(host: Any) -> None:
        with ctx_host.use(host):
            for op_hash in list(host.op_hash_order):
                if op_hash not in state.ops[host]:
                    continue
                if lost(state, host.name) is not None:
                    return
                step = names.get(host.name, {}).get(op_hash)
                if step is None:
                    step = ", ".join(sorted(state.get_op_meta(op_hash).names)) or "an operation"
                in_step(state, host, f"the {step} step")
                if not run_host_op(state, host, op_hash):
                    still_there(state, host)  # a cut link is the host's, not the step's
                    return

    with ctx_state.use(state):
        jobs = [state.pool.spawn(one, h) for h in hosts]
        gevent.joinall(jobs)
    for j in jobs:
        j.get()  # an error of this tool's own (not a failed command) is raised as it was


def _op_timer(state: Any) -> dict[tuple[str, str], float]:
    """Seconds each operation ran on each host, (host, op hash) -> s, filled while the hosts run
    (the per-phase times the deploy bench prints)."""
    from pyinfra.api.state import BaseStateCallback

    took: dict[tuple[str, str], float] = {}
    started: dict[tuple[str, str], float] = {}

    def stop(host: Any, op_hash: Any) -> None:
        key = (host.name, op_hash)
        took[key] = time.monotonic() - started.get(key, time.monotonic())

    class Timer(BaseStateCallback):
        @staticmethod
        def operation_host_start(state: Any, host: Any, op_hash: Any) -> None:
            started[(host.name, op_hash)] = time.monotonic()

        @staticmethod
        def operation_host_success(
            state: Any, host: Any, op_hash: Any, retry_count: int = 0
        ) -> None:
            stop(host, op_hash)

        @staticmethod
        def operation_host_error(state: Any, host: Any, op_hash: Any, *args: Any) -> None:
            stop(host, op_hash)

    state.add_callback_handler(Timer())
    return took


def seconds_of(took: Mapping[tuple[str, str], float], host: str) -> dict[str, float]:
    """One host's operation times, op hash -> s."""
    return {h: t for (n, h), t in took.items() if n == host}


def apply_steps(
    state: Any,
    hosts: Sequence[Any],
    steps: Mapping[str, Sequence[Step]],
    *,
    dry: bool = False,
    nothing: str = "nothing to do",
) -> dict[str, HostResult]:
    """Add every host's steps, run them all in parallel (unless dry), and say per host what
    happened: changed, unchanged, failed (a step failed or did not run), unreachable; with dry,
    would change or no change. No hosts: nothing is added or run."""
    if not hosts:
        return {}
    metas = add_steps(state, hosts, steps)
    if not dry:
        names = {h.name: {m._hash: st.name for st, m in metas[h.name]} for h in hosts}
        execute(state, [h for h in hosts if metas[h.name]], names)
    out: dict[str, HostResult] = {}
    for h in hosts:
        ms = metas[h.name]
        rows = tuple(step_result(st.name, m, dry=dry, preview=st.preview) for st, m in ms)
        outcome: Outcome = host_outcome([r.outcome for r in rows], dry)
        failed = None if dry else first_failure((r.name, r.outcome) for r in rows)
        reason = f"{failed} failed" if failed else (None if ms else nothing)
        gone = None if dry else lost(state, h.name)
        if gone is not None:
            outcome, reason = "unreachable", gone
        out[h.name] = HostResult(h.name, outcome, reason, steps=rows)
    return out
