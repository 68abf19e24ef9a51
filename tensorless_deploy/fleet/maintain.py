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
from typing import TYPE_CHECKING, Any

from tensorless_deploy.decisions.cards import branch_of
from tensorless_deploy.decisions.checks import Check
from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.facts.maintain import MAINTENANCE_RECORD
from tensorless_deploy.facts.values import DeployedUnit, HostFacts, MaintenanceRecord
from tensorless_deploy.fleet.connect import disconnect, new_state, on_each_host, survey_and_size
from tensorless_deploy.fleet.deploy import take_out_units, unit_port
from tensorless_deploy.fleet.inventory import options_for
from tensorless_deploy.fleet.runner import HostResult, Step, StepResult, apply_steps
from tensorless_deploy.fleet.status import drain_args, start_timeout
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

if TYPE_CHECKING:
    from tensorless_deploy.operations.deploy import Door

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


def drain(
    host: str, units: Sequence[DeployedUnit], door: Door | None = None, timeout_s: float = 0
) -> tuple[str, ...]:
    """The hook where a front door takes HOST's units out of rotation before they stop, and
    says what it did, a line per unit (fleet.deploy.take_out_units). Without a door nothing is
    drained at the door: each unit's hold still waits for its requests in flight (its /slots
    idle, bounded by the host's drain_timeout), then it stops."""
    return take_out_units(door, host, units, timeout_s)


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
    inventory: Any,
    hosts: Sequence[Any],
    flags: Flags,
    by: str | None = None,
    door: Door | None = None,
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
        drained = drain(h.name, units, door, options_for(h, flags).drain_timeout)
        todo += [
            Step(
                f"hold {u.name}",
                ops.held,
                {
                    "service": f"{u.name}.service",
                    "active": u.active,
                    "path": u.path,
                    **drain_args(u, options_for(h, flags)),
                },
            )
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
    inventory: Any,
    hosts: Sequence[Any],
    catalog: Catalog,
    flags: Flags,
    door: Door | None = None,
) -> list[MaintainResult]:
    """Close the window on every host: the CDI spec for the driver loaded now, doctor (the
    readiness checks, and the plan of every held unit's model), then, only where doctor passes,
    the units started again health-gated and the record removed; with a door, the units that
    serve again are put back in it."""
    out: dict[str, MaintainResult] = {}
    ends = _end_cdi(inventory, hosts, flags, out)
    live = [h for h in hosts if h.name in ends]
    if live:
        state = new_state(inventory, flags, lock="maintain end")
        starts = _end_doctor(state, live, catalog, flags, ends, out)
        ready = [h for h in live if h.name in starts]
        try:
            done = apply_steps(state, ready, starts)
        finally:
            disconnect(hosts)
        for h in ready:
            out[h.name] = ends[h.name].result(done[h.name])
            if out[h.name].ok:
                _put_back(door, ends[h.name], out[h.name].started)
    return [out[h.name] for h in hosts]


def _put_back(door: Door | None, e: _End, started: Sequence[str]) -> None:
    """The units that serve again after the window put back in the door."""
    if door is None or not door.fronts(e.host):
        return
    for u in e.units:
        port = unit_port(u)
        if u.name in started and port is not None:
            door.put_back(e.host, port)


@dataclass
class _End:
    """One host's end of its window between the phases: its record, its units as read, the CDI
    step's result and doctor's ending."""

    host: str
    record: MaintenanceRecord
    units: tuple[DeployedUnit, ...]
    cdi: HostResult | None = None
    ending: Ending | None = None

    def result(self, started: HostResult) -> MaintainResult:
        """The host's result once its units were released and started (or failed to)."""
        assert self.cdi is not None
        rows = _steps(self.cdi) + _steps(started)
        if not started.ok:
            return MaintainResult(
                self.host, "failed", started.reason, self.record, rows, ending=self.ending
            )
        names = tuple(u.name for u in to_start(self.record))
        return MaintainResult(
            self.host, "ended", None, self.record, rows, ending=self.ending, started=names
        )


def _end_cdi(
    inventory: Any, hosts: Sequence[Any], flags: Flags, out: dict[str, MaintainResult]
) -> dict[str, _End]:
    """Each host's window read, and its CDI spec regenerated for the driver loaded now; the
    hosts that passed, by name (the others have their result in out)."""
    from tensorless_deploy.operations.prepare import cdi_spec

    state = new_state(inventory, flags, lock="maintain end")
    found = _read(state, hosts, flags)
    ends: dict[str, _End] = {}
    cdi: dict[str, list[Step]] = {}
    for h, r in zip(hosts, found, strict=True):
        if isinstance(r, str):
            out[h.name] = MaintainResult(h.name, "failed", r)
            continue
        facts, units = r
        if facts.maintenance is None:
            out[h.name] = MaintainResult(h.name, "failed", NOT_OPEN)
            continue
        ends[h.name] = _End(h.name, facts.maintenance, units)
        gpus = facts.gpus
        cdi[h.name] = []
        if facts.toolkit is not None and facts.toolkit.present and gpus.state == "ok":
            uuids = tuple(g.uuid for g in gpus.gpus if g.uuid)
            args = {"driver_version": facts.driver_version, "gpu_uuids": uuids}
            cdi[h.name] = [Step("toolkit.cdi", cdi_spec, args)]
    live = [h for h in hosts if h.name in ends]
    try:
        cdi_done = apply_steps(state, live, cdi)
    finally:
        disconnect(hosts)
    for h in live:
        e = ends[h.name]
        e.cdi = res = cdi_done[h.name]
        if not res.ok:
            out[h.name] = MaintainResult(h.name, "refused", res.reason, e.record, _steps(res))
            del ends[h.name]
    return ends


def _end_doctor(
    state: Any,
    live: Sequence[Any],
    catalog: Catalog,
    flags: Flags,
    ends: dict[str, _End],
    out: dict[str, MaintainResult],
) -> dict[str, list[Step]]:
    """Doctor, as doctor runs it, on each host as it is now (the window itself left out); where
    it passes, the steps that start the units again and close the window, by host."""
    held = {h.name: _models(ends[h.name].record, catalog) for h in live}
    entries = [e for _, found in held.values() for e in found]
    surveyed, sizing = survey_and_size(state, live, flags, entries, keep_connected=True)
    starts: dict[str, list[Step]] = {}
    for h, s in zip(live, surveyed, strict=True):
        e = ends[h.name]
        if s.facts is None:
            out[h.name] = MaintainResult(h.name, "failed", s.error, e.record)
            continue
        facts = s.facts.model_copy(update={"maintenance": None})
        models = held[h.name][0]
        report = host_report(SurveyedHost(s.name, s.options, facts), catalog, models, sizing)
        checks: list[Check] = [c for p in report.plans for c in p.verdict.checks]
        problems = [p.problem for p in report.plans if p.problem]
        e.ending = ending(e.record, facts, checks)
        if e.ending.blocking or problems:
            why = ", ".join(c.id for c in e.ending.blocking) or "; ".join(problems)
            assert e.cdi is not None
            out[h.name] = MaintainResult(
                h.name,
                "refused",
                f"doctor fails {why}: the units stay stopped and the window open",
                e.record,
                _steps(e.cdi),
                ending=e.ending,
            )
            continue
        starts[h.name] = _start_steps(e)
    return starts


def _start_steps(e: _End) -> list[Step]:
    """The units released and started again, health-gated, then the record removed."""
    from tensorless_deploy.operations import maintain as ops
    from tensorless_deploy.operations.unit import serving

    texts = {u.name: u.text for u in e.units}
    todo = [
        Step(f"release {u.name}", ops.released, {"service": f"{u.name}.service"})
        for u in e.record.units
    ]
    for u in to_start(e.record):
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
    return todo
