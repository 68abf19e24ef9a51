"""prepare: survey every host, plan each one (hostplan.plan: readiness, or a model's plan), map
its failed checks to the operations keyed by the same ids (hostplan.prepare), run them on all
hosts in parallel with pyinfra, and report per host. A host that cannot be prepared fails alone,
with one line and the log to read; the others go on."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.fleet.connect import disconnect, gpu_images, new_state, survey_hosts
from tensorless_deploy.fleet.runner import (
    add_deploys,
    execute,
    first_failure,
    host_outcome,
    step_result,
)
from tensorless_deploy.hostplan.plan import plan_host, readiness
from tensorless_deploy.hostplan.prepare import (
    TOOLKIT_DATA_KEYS,
    HostPrep,
    Left,
    Step,
    driver_need,
    prepare_host,
    toolkit_source,
)
from tensorless_deploy.recipe.catalog import Catalog

Outcome = Literal[
    "changed", "unchanged", "failed", "skipped", "unreachable", "would change", "no change"
]
LOG_DIR_ENV = "TENSORLESS_LOG_DIR"


@dataclass(frozen=True)
class StepResult:
    check: str
    action: str
    outcome: str  # changed, unchanged, failed, not run, would change, no change
    output: tuple[str, ...] = ()


@dataclass(frozen=True)
class PrepareResult:
    host: str
    outcome: Outcome
    reason: str | None = None  # one line: why it failed or was skipped
    log: str | None = None  # the full output of every step (a run that changed or failed)
    steps: tuple[StepResult, ...] = ()
    left: tuple[Left, ...] = ()  # checks prepare does not fix: the operator's

    @property
    def ok(self) -> bool:
        return self.outcome not in ("failed", "skipped", "unreachable")


@dataclass(frozen=True)
class PrepareRequest:
    model: str | None = None  # None: readiness (what every model needs)
    flags: Flags = field(default_factory=Flags)
    toolkit: Mapping[str, str | None] = field(default_factory=dict)  # version, repo, key
    dry: bool = False
    gateway: bool = False  # also HAProxy, for a front door (prepare --gateway)


def log_dir() -> Path:
    """Where prepare writes each host's log: $TENSORLESS_LOG_DIR, else the XDG state dir."""
    given = os.environ.get(LOG_DIR_ENV)
    if given:
        return Path(given)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "tensorless-deploy"


def _step_results(prep: HostPrep, metas: Mapping[str, Any], dry: bool) -> tuple[StepResult, ...]:
    """Each step of the host's prepare with its operation's outcome (fleet.runner.step_result)."""
    out = []
    for step in prep.steps:
        r = step_result(step.check, metas.get(step.check), dry=dry)
        out.append(StepResult(step.check, step.action, r.outcome, r.output))
    return tuple(out)


def _write_log(host: str, steps: Sequence[StepResult]) -> str:
    directory = log_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"prepare-{host}.log"
    text = [f"tensorless-deploy prepare {host} {time.strftime('%Y-%m-%dT%H:%M:%S%z')}"]
    for s in steps:
        text.append(f"== {s.check}: {s.outcome}: {s.action}")
        text += [f"  {line}" for line in s.output]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return str(path)


def _result(prep: HostPrep, steps: tuple[StepResult, ...], dry: bool) -> PrepareResult:
    outcome = host_outcome([s.outcome for s in steps], dry)
    if dry:
        return PrepareResult(prep.host, outcome, steps=steps, left=prep.left)
    log = _write_log(prep.host, steps) if outcome != "unchanged" else None
    failed = first_failure((s.check, s.outcome) for s in steps)
    if failed is not None:
        bad = next(s for s in steps if s.check == failed)
        last = bad.output[-1] if bad.output else "no output"
        reason = f"{failed} failed: {last}; read {log}"
        return PrepareResult(prep.host, "failed", reason, log, steps, prep.left)
    return PrepareResult(prep.host, outcome, None, log, steps, prep.left)


def prepare(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, request: PrepareRequest
) -> list[PrepareResult]:
    """Make every host ready (for request.model, or for any model): the fixes doctor knows how to
    apply safely, each once; the per-host result says what changed and what is left."""
    from tensorless_deploy.fleet.connect import Unreachable, lost
    from tensorless_deploy.fleet.lock import LockHeld
    from tensorless_deploy.operations.prepare import prepare_plan

    entries = catalog.find(request.model) if request.model else []
    need = driver_need([e.recipe for e in (entries or catalog.entries)])
    sources = {
        h.name: toolkit_source(
            request.toolkit, {k: h.data.get(k) for k in TOOLKIT_DATA_KEYS}, h.name
        )
        for h in hosts
    }
    lock = None if request.dry else "prepare" + (f" {request.model}" if request.model else "")
    state = new_state(inventory, request.flags, lock=lock)
    surveyed = survey_hosts(
        state, hosts, request.flags, keep_connected=True, images=gpu_images(entries)
    )
    by_name = {h.name: h for h in hosts}
    results: dict[str, PrepareResult] = {}
    preps: dict[str, HostPrep] = {}
    try:
        for s in surveyed:
            if s.facts is None:
                word: Outcome = "failed"
                if isinstance(s.error, Unreachable):
                    word = "unreachable"
                elif isinstance(s.error, LockHeld):
                    word = "skipped"  # another run holds its lock: not touched
                results[s.name] = PrepareResult(s.name, word, s.error)
                continue
            if request.model:
                plan = plan_host(s.name, s.facts, entries, s.options, sizing=None)
            else:
                plan = readiness(s.name, s.facts, catalog, s.options)
            prep = prepare_host(plan, s.facts, sources[s.name], need, request.gateway)
            if prep.stop is not None:
                results[s.name] = PrepareResult(s.name, "skipped", prep.stop, left=prep.left)
            else:
                preps[s.name] = prep
        metas: dict[str, dict[str, Any]] = {}
        if preps:
            calls = [dict(prep=p, steps=metas, host=by_name[n]) for n, p in preps.items()]
            add_deploys(state, prepare_plan, calls)
            if not request.dry:
                names = {n: {m._hash: c for c, m in ms.items()} for n, ms in metas.items()}
                execute(state, [by_name[n] for n in preps], names)
        for name, prep in preps.items():
            steps = _step_results(prep, metas.get(name, {}), request.dry)
            result = _result(prep, steps, request.dry)
            gone = lost(state, name)
            if gone is not None:
                result = PrepareResult(name, "unreachable", gone, result.log, steps, prep.left)
            results[name] = result
    finally:
        disconnect(hosts)
    return [results[h.name] for h in hosts]


def step_json(s: StepResult) -> dict[str, Any]:
    return {"check": s.check, "action": s.action, "outcome": s.outcome, "output": list(s.output)}


def result_json(r: PrepareResult) -> dict[str, Any]:
    return {
        "host": r.host,
        "outcome": r.outcome,
        "ok": r.ok,
        "reason": r.reason,
        "log": r.log,
        "steps": [step_json(s) for s in r.steps],
        "left": [
            {
                "id": x.check.id,
                "status": x.check.status,
                "evidence": x.check.evidence,
                "fix": x.check.fix,
                "why": x.why,
            }
            for x in r.left
        ],
    }


__all__ = ["PrepareRequest", "PrepareResult", "Step", "StepResult", "prepare", "result_json"]
