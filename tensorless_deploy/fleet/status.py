"""status and stop over an inventory: what every host serves (read-only, in parallel), and
taking a model's units down."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.facts.values import LABEL_MODEL, DeployedUnit
from tensorless_deploy.fleet.connect import disconnect, new_state, on_each_host
from tensorless_deploy.fleet.deploy import HostResult, Outcome, StepResult, _meta_lines
from tensorless_deploy.fleet.inventory import options_for
from tensorless_deploy.hostplan.status import UnitStatus, unit_status
from tensorless_deploy.launch.render import QUADLET_DIR, SYSTEMD_DIR
from tensorless_deploy.launch.spec import unit_name
from tensorless_deploy.recipe.catalog import Catalog, Entry


@dataclass(frozen=True)
class HostStatus:
    host: str
    error: str | None
    units: tuple[UnitStatus, ...] = ()


def fleet_status(inventory: Any, hosts: Sequence[Any], catalog: Catalog) -> list[HostStatus]:
    """What every host serves: read-only, in parallel."""
    from tensorless_deploy.facts.pyinfra import DeployedUnits

    state = new_state(inventory)
    results = on_each_host(state, hosts, lambda h: h.get_fact(DeployedUnits))
    out = []
    for host, r in zip(hosts, results, strict=True):
        if isinstance(r, str):
            out.append(HostStatus(host.name, r))
        else:
            out.append(HostStatus(host.name, None, tuple(unit_status(u, catalog) for u in r)))
    return out


def serving_digests(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, model: str
) -> dict[str, str | None]:
    """Which recipe digest each host's unit for MODEL serves now (None: none, or unreachable)."""
    names = {unit_name(e.recipe) for e in catalog.find(model)}
    out: dict[str, str | None] = {}
    for h in fleet_status(inventory, hosts, catalog):
        unit = next((u for u in h.units if u.unit in names), None)
        out[h.host] = unit.recipe_digest if unit is not None and unit.healthy else None
    return out


def model_units(units: Sequence[DeployedUnit], entries: Sequence[Entry]) -> list[DeployedUnit]:
    """The units of a model on a host, every card's and every instance's: by the model label
    the unit carries, or by name (base, base-1, ...) for a unit without labels."""
    repos = {e.recipe.model.hf_repo.casefold() for e in entries}
    names = re.compile("|".join(re.escape(unit_name(e.recipe)) + r"(-[0-9]+)?" for e in entries))
    return [
        u
        for u in units
        if u.unit_labels.get(LABEL_MODEL, "").casefold() in repos or names.fullmatch(u.name)
    ]


def unit_paths(name: str) -> tuple[str, str]:
    """Where a unit of this tool may be: quadlet first, then the plain .service."""
    return (f"{QUADLET_DIR}/{name}.container", f"{SYSTEMD_DIR}/{name}.service")


def stop(
    inventory: Any,
    hosts: Sequence[Any],
    catalog: Catalog,
    model: str,
    purge: bool,
    flags: Flags | None = None,
) -> list[HostResult]:
    """Stop and remove the model's units on every host (every card's, every instance's);
    --purge: its model file too."""
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operation import add_op
    from pyinfra.api.operations import run_ops
    from pyinfra.api.state import StateStage

    from tensorless_deploy.facts.pyinfra import DeployedUnits
    from tensorless_deploy.operations.unit import removed

    entries = catalog.find(model)
    state = new_state(inventory)
    options = {h.name: options_for(h, flags or Flags()) for h in hosts}
    found = dict(
        zip(
            [h.name for h in hosts],
            on_each_host(state, hosts, lambda h: h.get_fact(DeployedUnits), keep_connected=True),
            strict=True,
        )
    )
    live = [h for h in hosts if not isinstance(found[h.name], str)]
    metas: dict[str, list[Any]] = {h.name: [] for h in live}
    try:
        state.set_stage(StateStage.Prepare)
        for h in live:
            units = found[h.name]
            assert not isinstance(units, str)
            bases = {unit_name(e.recipe) for e in entries}
            for u in model_units(units, entries):
                if u.name in bases:
                    continue  # with its recipe below (and its model file when purging)
                res = add_op(
                    state,
                    removed,
                    name=f"remove {u.name}",
                    host=h,
                    service=u.name,
                    paths=unit_paths(u.name),
                )
                metas[h.name].append(res[h])
            for e in entries:
                name = unit_name(e.recipe)
                m = e.recipe.model
                model_args: dict[str, Any] = (
                    dict(
                        models_dir=options[h.name].models_dir,
                        repo=m.hf_repo,
                        revision=m.revision,
                        filename=m.file,
                        sha256=m.sha256,
                    )
                    if purge
                    else {}
                )
                res = add_op(
                    state,
                    removed,
                    name=f"remove {name}",
                    host=h,
                    service=name,
                    paths=unit_paths(name),
                    **model_args,
                )
                metas[h.name].append(res[h])
        state.set_stage(StateStage.Execute)
        try:
            run_ops(state)
        except PyinfraError as exc:
            if "No hosts remaining" not in str(exc):
                raise
    finally:
        disconnect(hosts)
    results = []
    for h in hosts:
        err = found[h.name]
        if isinstance(err, str):
            results.append(HostResult(h.name, "failed", err))
            continue
        ms = metas[h.name]
        failed = [m for m in ms if m.is_complete() and m.did_error()]
        changed = any(m.is_complete() and m.executed and m.did_change() for m in ms)
        lines = tuple(line for m in ms if m.is_complete() for line in _meta_lines(m))
        outcome: Outcome = "failed" if failed else ("changed" if changed else "unchanged")
        results.append(
            HostResult(h.name, outcome, None, steps=(StepResult("stop", outcome, lines),))
        )
    return results
