"""doctor: read-only checks of hosts, with the command that fixes each problem."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from tensorless_deploy.cli.catalog import catalog_from
from tensorless_deploy.cli.output import emit_json, paint, table
from tensorless_deploy.decisions.checks import Existing, Options
from tensorless_deploy.fleet.hosts import (
    HostOutcome,
    disconnect,
    load_inventory,
    new_state,
    select_hosts,
    survey_hosts,
)
from tensorless_deploy.hostplan.doctor import HostReport, host_report, report_json
from tensorless_deploy.recipe.catalog import Catalog, Entry

MARK = {"ok": ("ok", "32"), "warn": ("warn", "33"), "fail": ("FAIL", "1;31")}
DETAIL_ALL_UP_TO = 4  # hosts; beyond this, one line per host and details for failures only


def _host_text(r: HostReport, details: bool) -> list[str]:
    head = f"{r.host}: " + (paint("ready", "32") if r.ok else paint("NOT READY", "1;31"))
    if r.error:
        return [f"{head}  {r.error}"]
    lines = [head]
    for m in r.results:
        v = m.verdict
        if m.model:
            card = f" on {m.entry.recipe.card.id}" if m.entry else ""
            lines.append(f"  {m.model}{card}: " + ("ok" if v.ok else "refused"))
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


def _reports(
    state: Any,
    hosts: Sequence[Any],
    outcomes: Sequence[HostOutcome],
    catalog: Catalog,
    models: Sequence[str],
) -> list[HostReport]:
    """Each host's report, all hosts in parallel. With MODEL, what deploy already put on the
    host (its unit, the model file) is read as deploy reads it: read-only."""
    import gevent
    from pyinfra.api.exceptions import PyinfraError

    from tensorless_deploy.fleet.deploy import existing_on_host

    by_name = {h.name: h for h in hosts}

    def one(o: HostOutcome) -> HostReport:
        if o.facts is None or not models:
            return host_report(o, catalog, models)

        def existing(entry: Entry) -> Existing:
            return existing_on_host(state, by_name[o.name], entry, o.options)

        try:
            return host_report(o, catalog, models, existing)
        except PyinfraError as exc:
            return HostReport(o.name, f"cannot read facts: {exc}", ())

    jobs = [gevent.spawn(one, o) for o in outcomes]
    gevent.joinall(jobs, raise_error=True)
    return [job.get() for job in jobs]


def cmd_doctor(args: argparse.Namespace) -> int:
    catalog = catalog_from(args)
    for model in args.models:
        catalog.find(model)  # an unknown model is a usage problem before any host is touched
    base = Options(port=args.port, bind=args.bind, allow_draft=args.allow_draft, local=args.local)
    inventory = load_inventory(args.inventory, args.local)
    hosts = select_hosts(inventory, args.limit or [])
    state = new_state(inventory)
    outcomes = survey_hosts(state, hosts, base, keep_connected=True)
    try:
        reports = _reports(state, hosts, outcomes, catalog, args.models)
    finally:
        disconnect(hosts)
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
