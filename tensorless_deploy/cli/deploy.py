"""deploy: converge hosts to serve a recipe under systemd, health-gated."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tensorless_deploy.cli.common import (
    catalog_from,
    dry_run_flag,
    flags_from,
    instances_flag,
    print_results,
    recipes_flag,
    result_json,
)
from tensorless_deploy.cli.output import emit_json
from tensorless_deploy.errors import UsageError

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.fleet.deploy import HostResult


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
    from tensorless_deploy.fleet.deploy import DeployRequest, deploy, roll
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.fleet.status import serving_digests
    from tensorless_deploy.hub import token

    catalog = catalog_from(args)
    catalog.find(args.model)
    flags = flags_from(args)
    if args.serial is not None and args.serial < 1:
        raise UsageError(f"--serial {args.serial}: must be 1 or more hosts at a time")
    inventory = load_inventory(args.inventory, False)
    hosts = select_hosts(inventory, args.limit or [])
    # the token is looked up only when a host (or this machine, to push) downloads the model
    request = DeployRequest(
        args.model,
        flags,
        args.dry_run,
        None,
        args.transfer,
        token_source=None if args.dry_run else token,
    )
    if args.serial and not args.dry_run:
        results = roll(inventory, hosts, catalog, request, args.serial)
        serving = serving_digests(inventory, hosts, catalog, args.model)
    else:
        results = deploy(inventory, hosts, catalog, request)
        serving = {}
    if args.json:
        rows = [
            result_json(r) | ({"serving_digest": serving.get(r.host)} if serving else {})
            for r in results
        ]
        emit_json({"ok": all(r.ok for r in results), "hosts": rows})
    else:
        for r in results:
            print_results([r], args.verbose)
            if args.dry_run:
                print_unit_diff(r)
        if serving:
            print_roll(results, serving)
        bad = [r.host for r in results if not r.ok]
        print(
            f"{len(results) - len(bad)} of {len(results)} host(s) serving"
            + (f"; failed or skipped: {', '.join(bad)}" if bad else ""),
            file=sys.stderr,
        )
    return 0 if all(r.ok for r in results) else 1


def register(command: Command) -> None:
    p = command(
        "deploy",
        "serve a recipe on every matching host: image by digest, verified model, systemd unit, "
        "/health (extra llama-server args after --, untuned)",
        cmd_deploy,
    )
    p.add_argument(
        "-i", "--inventory", required=True, metavar="INVENTORY", help="pyinfra inventory file"
    )
    p.add_argument("--limit", action="append", metavar="HOST", help="only this host (repeatable)")
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    dry_run_flag(p)
    p.add_argument(
        "--transfer",
        choices=("auto", "pull", "push"),
        default="auto",
        help="pull: hosts fetch model and image; push: this machine sends them; "
        "auto (default): push only where a host cannot reach them",
    )
    p.add_argument(
        "--serial",
        type=int,
        metavar="N",
        help="roll N hosts at a time; the first failure stops the roll",
    )
    p.add_argument("--allow-draft", action="store_true", help="accept a draft recipe")
    p.add_argument(
        "--context",
        type=int,
        metavar="N",
        help="context instead of the recipe's (marks the run untuned)",
    )
    p.add_argument(
        "--port",
        type=int,
        metavar="N",
        help="API port (default: the host's tensorless_port, else 8080)",
    )
    p.add_argument(
        "--bind", metavar="ADDR", help="API address (default: tensorless_bind, else 127.0.0.1)"
    )
    instances_flag(p)
    p.set_defaults(takes_extra=True)
    recipes_flag(p)
