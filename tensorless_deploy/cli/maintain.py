"""maintain: a maintenance window on named hosts, in two phases (docs/maintain.md).

``maintain begin`` stops the hosts' units and keeps them from starting; the operator updates the
driver within its branch and reboots; ``maintain end`` regenerates the CDI spec, reruns doctor,
starts the units again where it passes, and benches them against their recipes' receipts.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from tensorless_deploy.cli.common import (
    catalog_from,
    drain_timeout_flag,
    flags_from,
    inventory_flags,
    recipes_flag,
    wait_lock_flag,
)
from tensorless_deploy.cli.output import emit_json, paint
from tensorless_deploy.errors import UsageError

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.fleet.maintain import MaintainResult

COLOURS = {"begun": "33", "already open": "33", "ended": "32", "refused": "1;31", "failed": "1;31"}


def _result_json(r: MaintainResult) -> dict[str, Any]:
    from tensorless_deploy.hostplan.doctor import check_json

    rec = r.record
    doc: dict[str, Any] = {
        "host": r.host,
        "outcome": r.outcome,
        "ok": r.ok,
        "reason": r.reason,
        "began": rec.began if rec else None,
        "by": rec.by if rec else None,
        "units": [u.name for u in rec.units] if rec else [],
        "steps": [
            {"name": s.name, "outcome": s.outcome, "output": list(s.output)} for s in r.steps
        ],
    }
    if r.next is not None or r.outcome in ("begun", "already open"):
        doc["driver"] = {"before": rec.driver if rec else None}
        doc["drained"] = list(r.drained)
        doc["next"] = r.next
    if r.ending is not None:
        e = r.ending
        doc["driver"] = {
            "before": e.driver_before,
            "after": e.driver_after,
            "branch_before": e.branch_before,
            "branch_after": e.branch_after,
            "branch_changed": e.branch_changed,
        }
        doc["failed_checks"] = [check_json(c) for c in e.blocking]
        doc["started"] = list(r.started)
    return doc


def _print(r: MaintainResult, verbose: int) -> None:
    rec = r.record
    head = f"{r.host}: {paint(r.outcome, COLOURS.get(r.outcome, '0'))}"
    if rec is not None and r.outcome in ("begun", "already open"):
        head += f"  window open since {rec.began} (by {rec.by})"
    print(head)
    if r.reason:
        print(f"  {r.reason}")
    if r.outcome in ("begun", "already open") and rec is not None:
        print(f"  driver: {rec.driver or 'unknown'} ({rec.flavour or 'module unknown'})")
        held = ", ".join(u.name for u in rec.units) or "none (no unit of this tool here)"
        print(f"  stopped and kept from starting: {held}")
        drained = (
            "; ".join(r.drained)
            or "nothing at a door (none fronts this host): each unit stopped once idle"
        )
        print(f"  drained: {drained}")
        print(f"  now: {r.next}")
    if r.ending is not None:
        print(f"  driver: {r.ending.driver_line()}")
        for c in r.ending.blocking:
            print(f"  {paint('FAIL', '1;31')} {c.id}: {c.evidence}")
            if c.fix:
                print(f"       fix: {c.fix}")
        if r.outcome == "refused":
            print("  fix what doctor names, then: tensorless-deploy maintain end again")
    for s in r.steps:
        if s.name == "toolkit.cdi" and r.ending is not None:
            print(f"  toolkit.cdi: {s.outcome}")
        elif s.outcome == "failed" or verbose:
            print(f"  {s.name}: {s.outcome}")
        for line in s.output if (s.outcome == "failed" or verbose > 1) else ():
            print(f"    {line}")
    if r.started:
        print(f"  serving again: {', '.join(r.started)}")


def _bench(
    args: argparse.Namespace, results: list[MaintainResult], catalog: Any
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every unit started again, measured against its recipe's receipt (bench -i's way)."""
    from tensorless_deploy.cli.bench import bench_result
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.fleet.status import bench_targets
    from tensorless_deploy.local.bench import BenchError, measure, summarise

    wanted: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if r.outcome != "ended" or r.record is None:
            continue
        for u in r.record.units:
            if u.name in r.started and u.model and u.card:
                hosts = wanted.setdefault((u.model, u.card), [])
                if r.host not in hosts:
                    hosts.append(r.host)
    benched: list[dict[str, Any]] = []
    failed: list[str] = []
    for (model, card), hosts in wanted.items():
        entries = catalog.find_or_none(model)
        if not any(e.recipe.card.id == card for e in entries):
            failed.append(f"{', '.join(hosts)}: {model} ({card}) is not in the catalog: no receipt")
            continue
        # the card's own units, each judged by its card's recipe (bench -i's targets)
        inventory = load_inventory(args.inventory, False)
        chosen = select_hosts(inventory, hosts)
        with bench_targets(inventory, chosen, entries, card) as (targets, refused):
            failed += refused
            for name, connect, tuned, key, entry in targets:
                try:
                    summary = summarise(measure(connect, args.runs, api_key=key))
                except BenchError as exc:
                    failed.append(f"{name}: {exc.lines()[0]}")
                    continue
                benched.append(bench_result(name, entry, summary, tuned, args))
    return benched, failed


def cmd_maintain(args: argparse.Namespace) -> int:
    from tensorless_deploy.cli.bench import print_bench_result
    from tensorless_deploy.fleet.deploy import door_of
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.fleet.maintain import begin, end

    if not args.limit:
        raise UsageError(
            "maintain: name the host(s) with --limit HOST: a maintenance window stops what "
            "they serve",
            fix="tensorless-deploy maintain begin -i INVENTORY --limit HOST",
        )
    if args.runs < 0:
        raise UsageError(f"maintain: --runs {args.runs}: 0 or more")
    catalog = catalog_from(args)
    flags = flags_from(args)
    inventory = load_inventory(args.inventory, False, offers_local=False)
    hosts = select_hosts(inventory, args.limit)
    with door_of(inventory) as door:
        if args.phase == "begin":
            results = begin(inventory, hosts, flags, door=door)
        else:
            results = end(inventory, hosts, catalog, flags, door=door)
    benched: list[dict[str, Any]] = []
    bench_failed: list[str] = []
    if args.phase == "end" and args.runs > 0:
        benched, bench_failed = _bench(args, results, catalog)
    below = [c for b in benched for c in b["comparisons"] if not c["meets"]]
    ok = all(r.ok for r in results) and not bench_failed and not below
    if args.json:
        doc: dict[str, Any] = {
            "ok": ok,
            "phase": args.phase,
            "hosts": [_result_json(r) for r in results],
        }
        if args.phase == "end":
            doc["bench"] = {"results": benched, "errors": bench_failed}
        emit_json(doc)
        return 0 if ok else 1
    for r in results:
        _print(r, args.verbose)
    for res in benched:
        print_bench_result(res)
    for line in bench_failed:
        print(f"bench: {line}", file=sys.stderr)
    bad = [r.host for r in results if not r.ok]
    if bad:
        print(f"maintain {args.phase} failed on: {', '.join(bad)}", file=sys.stderr)
    elif below:
        print("maintain end: serving again, below the receipt (see bench above)", file=sys.stderr)
    return 0 if ok else 1


def register(command: Command) -> None:
    p = command(
        "maintain",
        "a maintenance window on named hosts: begin stops their units and keeps them stopped "
        "while the operator updates the driver within its branch and reboots; end regenerates "
        "the CDI spec, reruns doctor, starts the units again and benches them",
        cmd_maintain,
    )
    p.add_argument("phase", choices=("begin", "end"), help="open the window, or close it")
    inventory_flags(p)
    wait_lock_flag(p)
    drain_timeout_flag(p)
    p.add_argument(
        "--runs",
        type=int,
        default=3,
        metavar="N",
        help="end: measured bench runs per unit against its receipt (default 3; 0: no bench)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.10,
        metavar="F",
        help="end: how far below the receipt still meets it (default 0.10)",
    )
    recipes_flag(p)
