"""status and stop: what each host serves, and taking a model down."""

from __future__ import annotations

import argparse
import sys

from tensorless_deploy.cli.catalog import catalog_from
from tensorless_deploy.cli.deploy import print_results, result_json
from tensorless_deploy.cli.output import emit_json, paint, table
from tensorless_deploy.decisions.checks import Options
from tensorless_deploy.fleet.deploy import fleet_status, stop
from tensorless_deploy.fleet.hosts import load_inventory, select_hosts


def cmd_status(args: argparse.Namespace) -> int:
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
    catalog = catalog_from(args)
    catalog.find(args.model)
    inventory = load_inventory(args.inventory, args.inventory is None)
    hosts = select_hosts(inventory, args.limit or [])
    results = stop(inventory, hosts, catalog, args.model, args.purge, Options())
    if args.json:
        emit_json({"ok": all(r.ok for r in results), "hosts": [result_json(r) for r in results]})
    else:
        print_results(results, max(args.verbose, 2))
        bad = [r.host for r in results if not r.ok]
        if bad:
            print(f"failed: {', '.join(bad)}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1
