"""status and stop: what each host serves, and taking a model down."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from tensorless_deploy.cli.common import (
    catalog_from,
    flags_from,
    hosts_flags,
    print_results,
    recipes_flag,
    result_json,
)
from tensorless_deploy.cli.output import emit_json, paint, table

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command


def cmd_status(args: argparse.Namespace) -> int:
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.fleet.status import fleet_status

    catalog = catalog_from(args)
    inventory = load_inventory(args.inventory, args.local)
    hosts = select_hosts(inventory, args.limit or [])
    report = fleet_status(inventory, hosts, catalog)
    if args.json:
        emit_json(
            {
                "hosts": [
                    {"host": h.host, "error": h.error, "units": [u.json() for u in h.units]}
                    for h in report
                ]
            }
        )
        return 1 if any(h.error for h in report) else 0
    rows = []
    for h in report:
        if h.error:
            rows.append([h.host, paint("unreachable", "1;31"), "-", "-", "-", "-", h.error])
            continue
        if not h.units:
            rows.append([h.host, "nothing deployed", "", "", "", "", ""])
        for u in h.units:
            health = paint("healthy", "32") if u.healthy else paint(u.active, "1;31")
            tuned = {True: "tuned", False: paint("untuned", "33"), None: "-"}[u.tuned]
            rows.append(
                [
                    h.host,
                    f"{u.model or u.unit} on {u.card or '?'}",
                    u.address or "-",
                    health,
                    tuned,
                    (u.recipe_digest or "-")[:19],
                    "; ".join(u.drift) or "no drift",
                ]
            )
    print(table(rows, ["HOST", "SERVES", "ADDRESS", "STATE", "TUNING", "RECIPE", "DRIFT"]))
    return 1 if any(h.error for h in report) else 0


def cmd_stop(args: argparse.Namespace) -> int:
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.fleet.status import stop

    catalog = catalog_from(args)
    catalog.find(args.model)
    inventory = load_inventory(args.inventory, args.inventory is None)
    hosts = select_hosts(inventory, args.limit or [])
    results = stop(inventory, hosts, catalog, args.model, args.purge, flags_from(args))
    if args.json:
        emit_json({"ok": all(r.ok for r in results), "hosts": [result_json(r) for r in results]})
    else:
        print_results(results, max(args.verbose, 2))
        bad = [r.host for r in results if not r.ok]
        if bad:
            print(f"failed: {', '.join(bad)}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1


def register(command: Command) -> None:
    p = command("status", "what each host serves: model, port, health, tuning, drift", cmd_status)
    hosts_flags(p)
    recipes_flag(p)
    p = command("stop", "stop and remove a model's unit (on this machine without -i)", cmd_stop)
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    p.add_argument(
        "-i", "--inventory", metavar="INVENTORY", help="pyinfra inventory file (default: here)"
    )
    p.add_argument("--limit", action="append", metavar="HOST", help="only this host (repeatable)")
    p.add_argument("--purge", action="store_true", help="also remove the model file")
    recipes_flag(p)
