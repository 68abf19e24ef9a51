"""doctor: read-only checks of hosts, with the command that fixes each problem."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from tensorless_deploy.cli.common import (
    catalog_from,
    flags_from,
    hosts_flags,
    instances_flag,
    recipes_flag,
    serving_flags,
)
from tensorless_deploy.cli.output import emit_json, paint, table

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.hostplan.doctor import HostReport

MARK = {"ok": ("ok", "32"), "warn": ("warn", "33"), "fail": ("FAIL", "1;31")}
DETAIL_ALL_UP_TO = 4  # hosts; beyond this, one line per host and details for failures only


def _host_text(r: HostReport, details: bool) -> list[str]:
    head = f"{r.host}: " + (paint("ready", "32") if r.ok else paint("NOT READY", "1;31"))
    if r.error:
        return [f"{head}  {r.error}"]
    lines = [head]
    for p in r.plans:
        v = p.verdict
        if p.model:
            card = f" on {p.card}" if p.card else ""
            ok = v.ok and not p.problem and bool(p.instances)
            where = ", ".join(i.spec.address for i in p.instances)
            lines.append(
                f"  {p.model}{card}: " + (f"ok, would serve on {where}" if ok else "refused")
            )
            if p.problem:
                lines.append(f"    {p.problem}")
        elif v.servable:
            lines.append("  can serve: " + ", ".join(v.servable))
        else:
            lines.append("  can serve: no recipe in the catalog fits this host's GPUs")
        shown = v.checks if details else tuple(c for c in v.checks if c.status != "ok")
        rows = []
        for c in shown:
            word, colour = MARK[c.status]
            rows.append([paint(word, colour), c.id, c.evidence])
            if c.fix and c.status != "ok":
                rows.append(["", "", "fix: " + c.fix])
        if rows:
            lines += ["    " + line for line in table(rows, ["", "CHECK", "SEEN"]).splitlines()[1:]]
    return lines


def cmd_doctor(args: argparse.Namespace) -> int:
    from tensorless_deploy.fleet.connect import new_state, survey_and_size
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.hostplan.doctor import host_report, report_json

    catalog = catalog_from(args)
    # an unknown model is a usage problem before any host is touched
    entries = [e for model in args.models for e in catalog.find(model)]
    flags = flags_from(args)
    inventory = load_inventory(args.inventory, args.local)
    hosts = select_hosts(inventory, args.limit or [])
    state = new_state(inventory)
    surveyed, sizing = survey_and_size(state, hosts, flags, entries, local=args.local)
    reports = [host_report(s, catalog, args.models, sizing) for s in surveyed]
    if args.json:
        emit_json(report_json(reports))
    else:
        details = len(reports) <= DETAIL_ALL_UP_TO or args.verbose > 0
        for r in reports:
            print("\n".join(_host_text(r, details)))
        bad = [r.host for r in reports if not r.ok]
        summary = f"{len(reports) - len(bad)} of {len(reports)} host(s) ready"
        print(summary + (f"; not ready: {', '.join(bad)}" if bad else ""), file=sys.stderr)
    return 0 if all(r.ok for r in reports) else 1


def register(command: Command) -> None:
    p = command(
        "doctor", "check hosts read-only, with the command that fixes each problem", cmd_doctor
    )
    hosts_flags(p)
    p.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="repo ids or short names (default: readiness, and what each host can serve)",
    )
    p.add_argument("--allow-draft", action="store_true", help="accept draft recipes")
    serving_flags(p)
    instances_flag(p)
    recipes_flag(p)
