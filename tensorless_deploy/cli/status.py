"""The operator's day two: status (for people and scripts), logs, stop, rollback, prune."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from tensorless_deploy.cli.common import (
    catalog_from,
    drain_timeout_flag,
    dry_run_flag,
    flags_from,
    hosts_flags,
    inventory_flags,
    print_results,
    recipes_flag,
    result_json,
    wait_lock_flag,
)
from tensorless_deploy.cli.output import emit_json, paint, table

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.fleet.gateway import Refreshed
    from tensorless_deploy.fleet.runner import HostResult
    from tensorless_deploy.fleet.status import HostStatus
    from tensorless_deploy.hostplan.status import UnitStatus

STATE_COLOURS = {"serving": "32", "loading": "33"}


def _hosts(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts

    local = getattr(args, "local", False) or getattr(args, "inventory", None) is None
    inventory = load_inventory(args.inventory, local, offers_local=hasattr(args, "local"))
    return inventory, select_hosts(inventory, args.limit or [])


STATUS_HEAD = [
    "HOST",
    "UNIT",
    "ADDRESS",
    "STATE",
    "DEVICE",
    "TUNING",
    "RECIPE",
    "CODE",
    "LOAD",
    "DOOR",
    "CARDS",
    "DRIFT",
]


def cmd_status(args: argparse.Namespace) -> int:
    from tensorless_deploy.fleet.status import fleet_status
    from tensorless_deploy.hostplan.status import exit_code

    catalog = catalog_from(args)
    inventory, hosts = _hosts(args)
    report = fleet_status(inventory, hosts, catalog, flags_from(args))
    units = [u for h in report for u in h.units]
    idle = [h.host for h in report if h.state == "nothing deployed"]
    code = exit_code(
        any(h.error for h in report), units, any(h.cards_fail for h in report), bool(idle)
    )
    if args.json:
        emit_json(_status_json(report, code))
        return code
    rows = [row for h in report for row in _host_rows(h)]
    head = list(STATUS_HEAD)
    if not any(u.load or u.load_error for u in units):  # no unit serves /metrics: no column
        at = head.index("LOAD")
        head.remove("LOAD")
        rows = [row[:at] + row[at + 1 :] for row in rows]
    if not any(u.door for u in units):  # no door fronts a host: no column
        at = head.index("DOOR")
        head.remove("DOOR")
        rows = [row[:at] + row[at + 1 :] for row in rows]
    print(table(rows, head))
    word = {
        0: "all serving as the catalog says",
        1: "not all serving",
        3: "drift",
        4: f"nothing deployed on {', '.join(idle)}",
    }[code]
    if code == 1 and not any(h.error for h in report) and all(u.healthy for u in units):
        word = "a card fails its health checks"
    print(f"status: {word} (exit {code})", file=sys.stderr)
    return code


def _status_json(report: list[HostStatus], code: int) -> dict[str, Any]:
    from tensorless_deploy.hostplan.doctor import check_json

    return {
        "ok": code == 0,
        "exit_code": code,
        "hosts": [
            {
                "host": h.host,
                "state": h.state,
                "error": h.error,
                "cards": [check_json(c) for c in h.cards],
                "units": [u.json() for u in h.units],
            }
            for h in report
        ],
    }


def _host_rows(h: HostStatus) -> list[list[str]]:
    """One host's rows of the status table: one per unit, else one saying why there is none."""
    from tensorless_deploy.hostplan.status import cards_word

    if h.error:
        return [[h.host, paint(h.state, "1;31"), *["-"] * 9, h.error]]
    cards = cards_word(h.cards)
    cards = cards if cards in ("ok", "-") else paint(cards, "1;31" if h.cards_fail else "33")
    if not h.units:
        return [[h.host, paint(h.state, "33"), *[""] * 8, cards, ""]]
    return [_unit_row(h.host, u, cards) for u in h.units]


def _unit_row(host: str, u: UnitStatus, cards: str) -> list[str]:
    state = paint(u.state, STATE_COLOURS.get(u.state, "1;31"))
    if u.state == "crash loop" and u.restarts:
        state += f" ({u.restarts} restart{'s' * (u.restarts > 1)})"
    tuned = {True: "tuned", False: paint("untuned", "33"), None: "-"}[u.tuned]
    drift = "; ".join(f"{d.field}: {d.deployed} -> {d.wanted}" for d in u.drift)
    code = u.code if u.code in ("cpu", "-") or u.code.startswith("sm_") else paint(u.code, "1;31")
    load = u.load.text() if u.load else paint(u.load_error, "33") if u.load_error else "-"
    return [
        host,
        f"{u.unit} ({u.model or '?'} on {u.card or '?'})",
        u.address or "-",
        state,
        u.device or "-",
        tuned,
        (u.recipe_digest or "-")[:19],
        code,
        load,
        _door_cell(u.door),
        cards,
        drift or "no drift",
    ]


def _door_cell(door: str | None) -> str:
    if door is None:
        return "-"
    return door if door.startswith("UP") else paint(door, "33")


def _report(
    args: argparse.Namespace,
    results: list[HostResult],
    what: str,
    doors: list[Refreshed] | None = None,
) -> int:
    from tensorless_deploy.cli.gateway import refreshed_json, refreshed_lines, refreshed_ok

    ok = all(r.ok for r in results) and refreshed_ok(doors or [])
    if args.json:
        rows = {"ok": ok, "hosts": [result_json(r) for r in results]}
        emit_json(rows if doors is None else rows | {"doors": refreshed_json(doors)})
    else:
        print_results(results, max(args.verbose, 2))
        for line in refreshed_lines(doors or []):
            print(line)
        bad = [r.host for r in results if not r.ok]
        if bad:
            print(f"{what} failed on: {', '.join(bad)}", file=sys.stderr)
    return 0 if ok else 1


def cmd_stop(args: argparse.Namespace) -> int:
    from tensorless_deploy.cli.gateway import refresh_after
    from tensorless_deploy.fleet.deploy import door_of
    from tensorless_deploy.fleet.status import stop

    catalog = catalog_from(args)
    if args.purge:
        catalog.find(args.model)  # purging needs the recipe: which file to remove
    inventory, hosts = _hosts(args)
    with door_of(inventory, args.dry_run) as door:
        results = stop(
            inventory,
            hosts,
            catalog,
            args.model,
            args.purge,
            flags_from(args),
            dry=args.dry_run,
            door=door,
        )
        doors = refresh_after(inventory, catalog, door, flags_from(args), results)
    return _report(args, results, "stop", doors)


def cmd_rollback(args: argparse.Namespace) -> int:
    from tensorless_deploy.fleet.deploy import door_of
    from tensorless_deploy.fleet.status import rollback

    catalog = catalog_from(args)
    inventory, hosts = _hosts(args)
    with door_of(inventory, args.dry_run) as door:
        results = rollback(
            inventory, hosts, catalog, args.model, flags_from(args), dry=args.dry_run, door=door
        )
    return _report(args, results, "rollback")


def cmd_prune(args: argparse.Namespace) -> int:
    from tensorless_deploy.fleet.prune import prune

    catalog = catalog_from(args)
    inventory, hosts = _hosts(args)
    results, lists = prune(inventory, hosts, catalog, flags_from(args), dry=args.dry_run)
    ok = all(r.ok for r in results)
    if args.json:
        emit_json(
            {
                "ok": ok,
                "dry_run": args.dry_run,
                "hosts": [
                    result_json(r)
                    | {
                        "unused_models": list(lists[r.host].blobs) if r.host in lists else [],
                        "unused_images": list(lists[r.host].images) if r.host in lists else [],
                        "kept_models": list(lists[r.host].kept_blobs) if r.host in lists else [],
                        "kept_images": list(lists[r.host].kept_images) if r.host in lists else [],
                        "other_images": list(lists[r.host].other_images) if r.host in lists else [],
                    }
                    for r in results
                ],
            }
        )
        return 0 if ok else 1
    for r in results:
        u = lists.get(r.host)
        if u is None:
            print(f"{r.host}: {paint('failed', '1;31')}  {r.reason}")
            continue
        verb = "would remove" if args.dry_run else "removed"
        print(f"{r.host}: {r.outcome}")
        for b in u.blobs:
            print(f"  {verb} model {b}")
        for i in u.images:
            print(f"  {verb} image {i}")
        for b in u.kept_blobs:
            print(f"  kept model {b} (a unit uses it)")
        for i in u.kept_images:
            print(f"  kept image {i} (a unit uses it)")
        if u.other_images:
            repos = sorted({i.partition("@")[0] for i in u.other_images})
            print(
                f"  left alone {len(u.other_images)} other image(s), whose repository no unit "
                f"and no recipe of the catalog names: {', '.join(repos)} (prune --recipes DIR "
                "with the catalog that deployed one removes it)"
            )
        for s in r.steps:
            if s.outcome == "failed":
                print(f"  {s.name}: failed: {' '.join(s.output)}")
    return 0 if ok else 1


def cmd_logs(args: argparse.Namespace) -> int:
    from tensorless_deploy.fleet.logs import logs

    catalog = catalog_from(args)
    inventory, hosts = _hosts(args)
    width = max((len(h.name) for h in hosts), default=0)

    def emit(host: str, unit: str, line: str) -> None:
        # every write is made terminal-safe by cli.output's guard (journal lines included)
        print(f"{host.ljust(width)} {unit}: {line}", flush=True)

    errors = logs(
        inventory,
        hosts,
        catalog,
        args.model,
        emit,
        lines=args.lines,
        follow=args.follow,
        flags=flags_from(args),
    )
    for host, why in errors.items():
        print(f"{host}: {why}", file=sys.stderr)
    return 1 if errors else 0


def cmd_targets(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from tensorless_deploy.cli.output import write_atomic
    from tensorless_deploy.fleet.status import fleet_targets
    from tensorless_deploy.hostplan.targets import JOB_PREFIX, scrape_configs_yaml

    inventory, hosts = _hosts(args)
    jobs, skipped, errors = fleet_targets(inventory, hosts, flags_from(args))
    files: dict[str, str] = {}
    if args.output is not None:
        out = Path(args.output).absolute()
        configs = []
        for job in jobs:
            path = out / f"{job.name}.json"
            write_atomic(path, json.dumps(job.file_sd(), indent=2) + "\n")
            files[job.name] = str(path)
            configs.append(job.scrape_config(str(path)))
        write_atomic(out / "scrape_configs.yml", scrape_configs_yaml(configs))
        for old in out.glob(f"{JOB_PREFIX}*.json"):  # jobs this fleet no longer has
            if str(old) not in files.values():
                old.unlink()
    elif len(jobs) > 1 and not args.json:
        print(
            f"targets: the fleet needs {len(jobs)} scrape jobs (different API key files or "
            "TLS): give -o DIR to write one discovery file each and their scrape_configs",
            file=sys.stderr,
        )
        return 2
    if args.json:
        emit_json(
            {
                "ok": not errors,
                "jobs": [
                    job.scrape_config(files.get(job.name, f"{job.name}.json"))
                    | {"targets": job.file_sd()}
                    for job in jobs
                ],
                "skipped": [{"host": s.host, "unit": s.unit, "why": s.why} for s in skipped],
                "errors": errors,
            }
        )
        return 1 if errors else 0
    for s in skipped:
        print(f"{s.host} {s.unit}: left out: {s.why}", file=sys.stderr)
    for host, why in errors.items():
        print(f"{host}: {paint('unreachable', '1;31')}  {why}", file=sys.stderr)
    if args.output is None:
        print(json.dumps(jobs[0].file_sd() if jobs else [], indent=2))
        if jobs and (jobs[0].key_file or jobs[0].ca_file):
            how = [f"scheme: {jobs[0].scheme}"]
            if jobs[0].key_file:
                how.append(f"authorization.credentials_file: {jobs[0].key_file}")
            if jobs[0].ca_file:
                how.append(f"tls_config.ca_file: {jobs[0].ca_file}")
            print(f"targets: scrape them with {', '.join(how)} (-o DIR writes it)", file=sys.stderr)
    else:
        for job in jobs:
            print(f"{files[job.name]}: {len(job.targets)} target(s), job {job.name}")
        print(
            f"{Path(args.output).absolute() / 'scrape_configs.yml'}: the jobs, for "
            "prometheus.yml's scrape_configs"
        )
    if not jobs:
        print("targets: no unit serves /metrics to other machines", file=sys.stderr)
    return 1 if errors else 0


def _model_hosts(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    inventory_flags(p, required=False, help="pyinfra inventory file (default: here)")


def register(command: Command) -> None:
    p = command(
        "status",
        "what each host serves: unit, address, state, tuning, drift field by field (exit 0 "
        "all serving as the catalog says, 1 unreachable, unreadable or not serving, 4 a host "
        "serves nothing, 3 drift)",
        cmd_status,
    )
    hosts_flags(p, required=False)
    recipes_flag(p)
    p = command(
        "targets",
        "Prometheus file-based discovery of every unit's /metrics (with the API key file and "
        "TLS where set): print it, or -o DIR writes each job's file and their scrape_configs",
        cmd_targets,
    )
    hosts_flags(p, required=False)
    p.add_argument("-o", "--output", metavar="DIR", help="write the files here (atomically)")
    p = command("logs", "a model's journal lines from every host, prefixed host and unit", cmd_logs)
    _model_hosts(p)
    p.add_argument("-n", "--lines", type=int, default=50, metavar="N", help="last N lines (50)")
    p.add_argument("-f", "--follow", action="store_true", help="then follow until Ctrl-C")
    recipes_flag(p)
    p = command("stop", "stop and remove a model's units (on this machine without -i)", cmd_stop)
    _model_hosts(p)
    p.add_argument("--purge", action="store_true", help="also remove the model file")
    dry_run_flag(p)
    wait_lock_flag(p)
    drain_timeout_flag(p)
    recipes_flag(p)
    p = command(
        "rollback",
        "bring back each unit's previous version (kept by the last deploy that changed it), "
        "health-gated",
        cmd_rollback,
    )
    _model_hosts(p)
    dry_run_flag(p)
    wait_lock_flag(p)
    drain_timeout_flag(p)
    recipes_flag(p)
    p = command(
        "prune",
        "remove model files and engine images that no unit (current or kept for rollback) uses",
        cmd_prune,
    )
    hosts_flags(p, required=False)
    dry_run_flag(p)
    wait_lock_flag(p)
    recipes_flag(p)
