"""Running a list of pyinfra operations per host and reporting each host's outcome: what stop,
rollback and prune share (deploy drives its @deploy itself)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensorless_deploy.fleet.deploy import HostResult, Outcome, StepResult, _meta_lines


@dataclass(frozen=True)
class Step:
    """One operation for one host: its report name, the operation, its arguments."""

    name: str
    op: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    preview: tuple[str, ...] = ()  # what a dry run says under the step: what it would do


def apply_steps(
    state: Any,
    hosts: Sequence[Any],
    steps: Mapping[str, Sequence[Step]],
    *,
    dry: bool = False,
    nothing: str = "nothing to do",
) -> dict[str, HostResult]:
    """Add every host's steps, run them all in parallel (unless dry), and say per host what
    happened: changed, unchanged, failed; with dry, would change or no change."""
    from pyinfra.api.operation import add_op
    from pyinfra.api.state import StateStage

    from tensorless_deploy.fleet.connect import lost, run_hosts

    metas: dict[str, list[tuple[Step, Any]]] = {h.name: [] for h in hosts}
    state.set_stage(StateStage.Prepare)
    for h in hosts:
        for s in steps.get(h.name, ()):
            res = add_op(state, s.op, name=s.name, host=h, **s.kwargs)
            metas[h.name].append((s, res[h]))
    if not dry:
        state.set_stage(StateStage.Execute)
        names = {h.name: {m._hash: st.name for st, m in metas[h.name]} for h in hosts}
        run_hosts(state, [h for h in hosts if metas[h.name]], names)
    out: dict[str, HostResult] = {}
    for h in hosts:
        ms = metas[h.name]
        if dry:
            rows = [
                StepResult(st.name, "would change" if m.will_change else "no change", st.preview)
                for st, m in ms
            ]
            changing = any(r.outcome == "would change" for r in rows)
            outcome: Outcome = "would change" if changing else "no change"
            out[h.name] = HostResult(h.name, outcome, None if ms else nothing, steps=tuple(rows))
            continue
        rows = []
        for st, m in ms:
            n = st.name
            if not m.is_complete():
                rows.append(StepResult(n, "not run"))
            elif m.did_error():
                rows.append(StepResult(n, "failed", _meta_lines(m)))
            else:
                done = "changed" if m.executed and m.did_change() else "unchanged"
                rows.append(StepResult(n, done, _meta_lines(m)))
        failed = [r for r in rows if r.outcome in ("failed", "not run")]
        changed = any(r.outcome == "changed" for r in rows)
        outcome = "failed" if failed else ("changed" if changed else "unchanged")
        reason = f"{failed[0].name} failed" if failed else (None if ms else nothing)
        gone = lost(state, h.name)
        if gone is not None:
            outcome, reason = "unreachable", gone
        out[h.name] = HostResult(h.name, outcome, reason, steps=tuple(rows))
    return out
