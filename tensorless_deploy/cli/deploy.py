"""deploy: converge hosts to serve a recipe under systemd, health-gated."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tensorless_deploy.cli.bundle import deploy_source, from_bundle_flag
from tensorless_deploy.cli.common import (
    FleetProgress,
    drain_timeout_flag,
    dry_run_flag,
    flags_from,
    instances_flag,
    inventory_flags,
    print_results,
    recipes_flag,
    result_json,
    serving_flags,
    wait_lock_flag,
)
from tensorless_deploy.cli.output import emit_json
from tensorless_deploy.errors import UsageError

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.fleet.runner import HostResult


RESTORED = "restored the previous unit; it is healthy again"  # operations/scripts/unit-activate.sh
NOT_RESTORED = ("restored the previous unit, but it is not healthy either", "removed the new unit")


def after_run(r: HostResult, dry: bool) -> str | None:
    """What serves MODEL on this host after the run, as far as its result says: "new" (the run
    left its units healthy, health-gated; with --dry-run: would), "previous" (its new unit
    failed and the previous one was restored healthy), None (nothing does, or the host could
    not be reached), "?" (the result cannot say: refused by preflight, failed before any unit
    changed, left untouched by a stopped roll: what was there may still serve)."""
    if r.ok:
        return "new"
    if dry or r.outcome == "unreachable":
        return None  # an unreachable host is not asked again: it passed its deadline once
    lines = [line for s in r.steps for line in s.output]
    if any(RESTORED in line for line in lines):
        return "previous"
    if any(any(x in line for x in NOT_RESTORED) for line in lines):
        return None
    if r.outcome == "failed" and r.recipe_digest is None and r.transfer is None:
        return None  # the survey itself failed: unreachable, or its facts unreadable
    return "?"


def serving_after(
    results: Sequence[HostResult], dry: bool, survey: Callable[[list[str]], dict[str, str | None]]
) -> dict[str, str | None]:
    """Per host, what serves after the run: the result's word where it has one, else what a
    survey after the run finds (a healthy unit of MODEL: "previous"; none: None)."""
    out = {r.host: after_run(r, dry) for r in results}
    unknown = [h for h, v in out.items() if v == "?"]
    if unknown:
        found = survey(unknown)
        for h in unknown:
            out[h] = "previous" if found.get(h) else None
    return out


def summary(results: Sequence[HostResult], serving: dict[str, str | None], dry: bool) -> str:
    """The last line: how many hosts serve MODEL after the run (with --dry-run: would)."""
    bad = [r.host for r in results if not r.ok]
    now = [r.host for r in results if serving.get(r.host)]
    previous = [h for h in now if serving[h] == "previous"]
    line = f"{len(now)} of {len(results)} host(s) " + ("would serve" if dry else "serving")
    if previous:
        line += f" ({', '.join(previous)} on the unit{'s' * (len(previous) > 1)} " + (
            "it had before)" if len(previous) == 1 else "they had before)"
        )
    if bad:
        line += f"; failed or skipped: {', '.join(bad)}"
    return line


def print_roll(results: Sequence[HostResult], serving: dict[str, str | None]) -> None:
    """After a roll: which hosts serve the new recipe, which still the old."""
    new = next((r.recipe_digest for r in results if r.ok and r.recipe_digest), None)
    groups: dict[str, list[str]] = {}
    for r in results:
        now = serving.get(r.host)
        if now and now == new:
            key = "new recipe " + now[:19]
        else:
            key = f"old recipe {now[:19]}" if now else "nothing healthy"
        groups.setdefault(key, []).append(f"{r.host} ({r.outcome})")
    for key, names in groups.items():
        print(f"{key}: {', '.join(names)}")


def print_unit_diff(r: HostResult) -> None:
    """deploy --dry-run: each unit that would change, its text there against the rendered one."""
    for s in r.steps:
        if s.name.startswith("unit") and s.outcome == "would change" and s.output:
            print(f"  {s.name}: would change")
            for line in s.output:
                print(f"    {line}")


def cmd_deploy(args: argparse.Namespace) -> int:
    from tensorless_deploy.cli.gateway import (
        refresh_after,
        refreshed_json,
        refreshed_lines,
        refreshed_ok,
    )
    from tensorless_deploy.fleet.deploy import DeployRequest, deploy, door_of, roll
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.fleet.status import serving_digests
    from tensorless_deploy.hub import token

    catalog, source, transfer = deploy_source(args)
    catalog.find(args.model)
    flags = flags_from(args)
    if args.serial is not None and args.serial < 1:
        raise UsageError(f"--serial {args.serial}: must be 1 or more instances at a time")
    inventory = load_inventory(args.inventory, False, offers_local=False)
    hosts = select_hosts(inventory, args.limit or [])
    # the token is looked up only when a host (or this machine, to push) downloads the model
    progress = FleetProgress(quiet=args.json)
    with door_of(inventory, args.dry_run) as door:
        request = DeployRequest(
            args.model,
            flags,
            args.dry_run,
            None,
            transfer,
            token_source=None if args.dry_run else token,
            progress=progress if progress.tty else None,
            source=source,
            door=door,
        )
        try:
            if args.serial and not args.dry_run:
                results = roll(inventory, hosts, catalog, request, args.serial)
                serving = serving_digests(inventory, hosts, catalog, args.model, flags)
            else:
                results = deploy(inventory, hosts, catalog, request)
                serving = {}
        finally:
            progress.close()
        # a change of the instances renders each door over them again (hitless reload)
        doors = refresh_after(inventory, catalog, door, flags, results)
    by_name = {h.name: h for h in hosts}

    def survey(names: list[str]) -> dict[str, str | None]:
        # after a roll every host was surveyed already; else only the hosts whose result
        # cannot say what serves there now (one read-only round trip more, in parallel)
        if serving:
            return {n: serving.get(n) for n in names}
        return serving_digests(inventory, [by_name[n] for n in names], catalog, args.model, flags)

    after = serving_after(results, args.dry_run, survey)
    if args.json:
        rows = [
            result_json(r)
            | {
                "serving": after.get(r.host),
                # read back from the host: after a roll, by a survey of every host
                "serving_digest": serving.get(r.host) if serving else r.serving_digest,
            }
            for r in results
        ]
        ok = all(r.ok for r in results) and refreshed_ok(doors)
        emit_json({"ok": ok, "hosts": rows, "doors": refreshed_json(doors)})
    else:
        for r in results:
            print_results([r], args.verbose)
            if args.dry_run:
                print_unit_diff(r)
        if serving:
            print_roll(results, serving)
        for line in refreshed_lines(doors):
            print(line)
        print(summary(results, after, args.dry_run), file=sys.stderr)
    return 0 if all(r.ok for r in results) and refreshed_ok(doors) else 1


def register(command: Command) -> None:
    p = command(
        "deploy",
        "serve a recipe on every matching host: image by digest, verified model, systemd unit, "
        "/health (extra llama-server args after --, untuned)",
        cmd_deploy,
    )
    inventory_flags(p)
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    dry_run_flag(p)
    wait_lock_flag(p)
    drain_timeout_flag(p)
    p.add_argument(
        "--transfer",
        choices=("auto", "pull", "push"),
        default="auto",
        help="pull: hosts fetch model and image; push: this machine sends them; "
        "auto (default): push only where a host cannot reach them",
    )
    p.add_argument(
        "--relay",
        action="store_true",
        help="a push to a host comes from a host that holds the bytes verified (its cache, "
        "or a host the push reached first), this machine sending only while none does; in a "
        "pull, the model is downloaded by one host (none, if one holds it) and passed on from "
        "it; each hop over a key made for it, removed at its end (default: tensorless_relay)",
    )
    p.add_argument(
        "--serial",
        type=int,
        metavar="N",
        help="roll at most N instances at a time: N hosts at once, each host's instances one "
        "by one (the next only once the one before is healthy on its card again), so a host "
        "with two cards keeps serving; the first failure stops the roll",
    )
    from_bundle_flag(p)
    p.add_argument("--allow-draft", action="store_true", help="accept a draft recipe")
    p.add_argument(
        "--context",
        type=int,
        metavar="N",
        help="context instead of the recipe's (marks the run untuned)",
    )
    serving_flags(p)
    instances_flag(p)
    p.set_defaults(takes_extra=True)
    recipes_flag(p)
