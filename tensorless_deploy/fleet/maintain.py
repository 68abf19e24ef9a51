"""maintain over an inventory: a maintenance window on each host asked for, in two phases.

``begin``: the host's units are stopped and kept from starting (a record on the host and a
systemd drop-in per unit: they survive the reboot a driver update needs), after the drain hook.
The operator then updates the driver within its branch and reboots; this tool never runs the
package manager on the driver. ``end``: the CDI spec is regenerated for the driver now loaded,
doctor runs again, and only when it passes are the units started, health-gated, and the record
removed. The bench against the receipt is the command line's (cli/maintain.py).
"""

from __future__ import annotations

import datetime
import getpass
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tensorless_deploy.decisions.cards import branch_of
from tensorless_deploy.decisions.checks import Check
from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.facts.maintain import MAINTENANCE_RECORD
from tensorless_deploy.facts.values import DeployedUnit, HostFacts, MaintenanceRecord
from tensorless_deploy.fleet.connect import disconnect, new_state, on_each_host, survey_and_size
from tensorless_deploy.fleet.inventory import options_for
from tensorless_deploy.fleet.runner import Step, StepResult, apply_steps
from tensorless_deploy.fleet.status import start_timeout
from tensorless_deploy.hostplan.doctor import host_report
from tensorless_deploy.hostplan.maintain import (
    Ending,
    ending,
    new_record,
    record_text,
    to_start,
    update_hint,
)
from tensorless_deploy.hostplan.plan import SurveyedHost
from tensorless_deploy.recipe.catalog import Catalog, Entry

NOT_OPEN = "not in a maintenance window (nothing to end): tensorless-deploy maintain begin first"


@dataclass(frozen=True)
class MaintainResult:
    """One host's phase: ``begun``, ``already open``, ``ended``, ``refused`` (doctor failed at
    the end: the units stay stopped, the window open) or ``failed``."""

    host: str
    outcome: str
    reason: str | None = None
    record: MaintenanceRecord | None = None
    steps: tuple[StepResult, ...] = ()
    drained: tuple[str, ...] = ()
    next: str | None = None  # begin: what the operator does in the window
    ending: Ending | None = None  # end: the driver before and after, doctor's failed checks
    started: tuple[str, ...] = ()  # end: the units started again, healthy

    @property
    def ok(self) -> bool:
        return self.outcome in ("begun", "already open", "ended")


def drain(host: str, units: Sequence[DeployedUnit]) -> tuple[str, ...]:
    """The hook where a front door takes HOST's units out of rotation before they stop, and
    says what it did. There is no front door yet (a later issue): nothing is drained, the units
    stop at once and their callers see the connection refused."""
    del host, units
    return ()


def operator() -> str:
    """Who begins a window: user@machine of this controller."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read(
    state: Any, hosts: Sequence[Any], flags: Flags
) -> list[tuple[HostFacts, tuple[DeployedUnit, ...]] | str]:
    from tensorless_deploy.facts.pyinfra import DeployedUnits, HostSurvey

    dirs = {h.name: options_for(h, flags).models_dir for h in hosts}

    def read(h: Any) -> tuple[HostFacts, tuple[DeployedUnit, ...]]:
        facts = HostSurvey.typed(h.get_fact(HostSurvey, models_dir=dirs[h.name]))
        return facts, DeployedUnits.typed(h.get_fact(DeployedUnits))

    return on_each_host(state, hosts, read, keep_connected=True)


def _steps(result: Any) -> tuple[StepResult, ...]:
    return tuple(result.steps) if result is not None else ()


def begin(
    inventory: Any, hosts: Sequence[Any], flags: Flags, by: str | None = None
) -> list[MaintainResult]:
    """Open a window on every host: record what it serves and which driver it runs, drain
    (the hook), stop and hold its units. A host already in a window keeps its record (the
    driver it ran before) and has its units held again."""
    from tensorless_deploy.operations import maintain as ops

    by = by or operator()
    state = new_state(inventory, flags, lock="maintain begin")
    found = _read(state, hosts, flags)
    out: dict[str, MaintainResult] = {}
    plans: dict[str, tuple[MaintenanceRecord, bool, tuple[str, ...], str]] = {}
    steps: dict[str, list[Step]] = {}
    for h, r in zip(hosts, found, strict=True):
        if isinstance(r, str):
            out[h.name] = MaintainResult(h.name, "failed", r)
            continue
        facts, units = r
        fresh = facts.maintenance is None
        record = facts.maintenance or new_record(facts, units, _now(), by)
        todo = [Step("record", ops.record, {"text": record_text(record)})] if fresh else []
        drained = drain(h.name, units)
        todo += [
            Step(f"hold {u.name}", ops.held, {"service": f"{u.name}.service", "active": u.active})
            for u in units
        ]
        steps[h.name] = todo
        branch = branch_of(record.driver) if record.driver else None
        plans[h.name] = (record, fresh, drained, update_hint(facts, branch))
    live = [h for h in hosts if h.name in steps]
    try:
        done = apply_steps(state, live, steps, nothing="no unit of this tool here")
    finally:
        disconnect(hosts)
    for h in live:
        record, fresh, drained, hint = plans[h.name]
        res = done[h.name]
        if not res.ok:
            out[h.name] = MaintainResult(h.name, "failed", res.reason, record, _steps(res))
            continue
        nxt = f"{hint}, then: tensorless-deploy maintain end -i INVENTORY --limit {h.name}"
        out[h.name] = MaintainResult(
            h.name,
            "begun" if fresh else "already open",
            None,
            record,
            _steps(res),
            drained,
            nxt,
        )
    return [out[h.name] for h in hosts]


def _models(record: MaintenanceRecord, catalog: Catalog) -> tuple[list[str], list[Entry]]:
    """The models of the held units that the catalog knows: doctor plans each of them."""
    models: list[str] = []
    entries: list[Entry] = []
    for u in record.units:
        if u.model and u.model not in models:
            found = catalog.find_or_none(u.model)
            if found:
                models.append(u.model)
                entries += found
    return models, entries


def end(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, flags: Flags
) -> list[MaintainResult]:
    """Close the window on every host: the CDI spec for the driver loaded now, doctor (the
    readiness checks, and the plan of every held unit's model), then, only where doctor passes,
    the units started again health-gated and the record removed."""
    from tensorless_deploy.operations import maintain as ops
    from tensorless_deploy.operations.prepare import cdi_spec
    from tensorless_deploy.operations.unit import serving

    out: dict[str, MaintainResult] = {}
    state = new_state(inventory, flags, lock="maintain end")
    found = _read(state, hosts, flags)
    records: dict[str, MaintenanceRecord] = {}
    units_now: dict[str, tuple[DeployedUnit, ...]] = {}
    cdi: dict[str, list[Step]] = {}
    for h, r in zip(hosts, found, strict=True):
        if isinstance(r, str):
            out[h.name] = MaintainResult(h.name, "failed", r)
            continue
        facts, units = r
        if facts.maintenance is None:
            out[h.name] = MaintainResult(h.name, "failed", NOT_OPEN)
            continue
        records[h.name] = facts.maintenance
        units_now[h.name] = units
        gpus = facts.gpus
        if facts.toolkit is not None and facts.toolkit.present and gpus.state == "ok":
            uuids = tuple(g.uuid for g in gpus.gpus if g.uuid)
            args = {"driver_version": facts.driver_version, "gpu_uuids": uuids}
            cdi[h.name] = [Step("toolkit.cdi", cdi_spec, args)]
        else:
            cdi[h.name] = []
    live = [h for h in hosts if h.name in records]
    try:
        cdi_done = apply_steps(state, live, cdi) if live else {}
    finally:
        disconnect(hosts)
    for h in live:
        if not cdi_done[h.name].ok:
            res = cdi_done[h.name]
            out[h.name] = MaintainResult(
                h.name, "refused", res.reason, records[h.name], _steps(res)
            )
    live = [h for h in live if h.name not in out]
    if not live:
        return [out[h.name] for h in hosts]

    # doctor, as doctor runs it, on the host as it is now (the window itself left out)
    entries = [e for h in live for e in _models(records[h.name], catalog)[1]]
    state = new_state(inventory, flags, lock="maintain end")
    surveyed, sizing = survey_and_size(state, live, flags, entries, keep_connected=True)
    starts: dict[str, list[Step]] = {}
    endings: dict[str, Ending] = {}
    for h, s in zip(live, surveyed, strict=True):
        record = records[h.name]
        if s.facts is None:
            out[h.name] = MaintainResult(h.name, "failed", s.error, record)
            continue
        facts = s.facts.model_copy(update={"maintenance": None})
        models, _ = _models(record, catalog)
        report = host_report(SurveyedHost(s.name, s.options, facts), catalog, models, sizing)
        checks: list[Check] = [c for p in report.plans for c in p.verdict.checks]
        problems = [p.problem for p in report.plans if p.problem]
        endings[h.name] = ending(record, facts, checks)
        if endings[h.name].blocking or problems:
            why = ", ".join(c.id for c in endings[h.name].blocking) or "; ".join(problems)
            out[h.name] = MaintainResult(
                h.name,
                "refused",
                f"doctor fails {why}: the units stay stopped and the window open",
                record,
                _steps(cdi_done[h.name]),
                ending=endings[h.name],
            )
            continue
        texts = {u.name: u.text for u in units_now[h.name]}
        todo = [
            Step(f"release {u.name}", ops.released, {"service": f"{u.name}.service"})
            for u in record.units
        ]
        for u in to_start(record):
            if not u.health_url:
                continue  # a unit without its health label: released, started by systemd
            todo.append(
                Step(
                    f"start {u.name}",
                    serving,
                    {
                        "path": u.path,
                        "health_url": u.health_url,
                        "timeout_s": start_timeout(texts.get(u.name, "")),
                    },
                )
            )
        todo.append(Step("close the window", ops.record_removed, {"path": MAINTENANCE_RECORD}))
        starts[h.name] = todo
    ready = [h for h in live if h.name in starts]
    try:
        done = apply_steps(state, ready, starts) if ready else {}
    finally:
        disconnect(hosts)
    for h in ready:
        res = done[h.name]
        record = records[h.name]
        rows = _steps(cdi_done[h.name]) + _steps(res)
        if not res.ok:
            out[h.name] = MaintainResult(
                h.name, "failed", res.reason, record, rows, ending=endings[h.name]
            )
            continue
        started = tuple(u.name for u in to_start(record))
        out[h.name] = MaintainResult(
            h.name, "ended", None, record, rows, ending=endings[h.name], started=started
        )
    return [out[h.name] for h in hosts]
