"""prepare: doctor's automatable fixes applied to hosts, idempotently, keyed by its check ids."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tensorless_deploy.cli.common import (
    COLOURS,
    catalog_from,
    dry_run_flag,
    flags_from,
    inventory_flags,
    recipes_flag,
    serving_flags,
    wait_lock_flag,
)
from tensorless_deploy.cli.output import emit_json, paint

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.fleet.prepare import PrepareResult


def print_prepare(results: Sequence[PrepareResult], verbose: int) -> None:
    for r in results:
        print(f"{r.host}: {paint(r.outcome, COLOURS.get(r.outcome, '0'))}")
        if r.reason and not r.ok:
            print(f"  {r.reason}")
        for s in r.steps:
            print(f"  {s.check}: {s.outcome}  {s.action}")
            if s.outcome == "failed" or verbose > 1:
                for line in s.output:
                    print(f"    {line}")
        for x in r.left:
            print(f"  left to you: {x.check.id} ({x.check.status}): {x.check.evidence}")
            print(f"    {x.why}" + (f"; fix: {x.check.fix}" if x.check.fix else ""))
        if r.log and verbose:
            print(f"  log: {r.log}")


def cmd_prepare(args: argparse.Namespace) -> int:
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.fleet.prepare import PrepareRequest, prepare, result_json
    from tensorless_deploy.hostplan.prepare import toolkit_source

    catalog = catalog_from(args)
    if args.model:
        catalog.find(args.model)  # an unknown model is a usage problem before any host
    toolkit = {"version": args.toolkit_version, "repo": args.toolkit_repo, "key": args.toolkit_key}
    toolkit_source(toolkit, None, "")  # a bad --toolkit-* value: a usage error, nothing touched
    flags = flags_from(args)
    inventory = load_inventory(args.inventory, False, offers_local=False)
    hosts = select_hosts(inventory, args.limit or [])
    request = PrepareRequest(args.model, flags, toolkit, args.dry_run, gateway=args.gateway)
    results = prepare(inventory, hosts, catalog, request)
    if args.json:
        emit_json({"ok": all(r.ok for r in results), "hosts": [result_json(r) for r in results]})
    else:
        print_prepare(results, args.verbose)
        bad = [r.host for r in results if not r.ok]
        done = "would be prepared" if args.dry_run else "prepared"
        print(
            f"{len(results) - len(bad)} of {len(results)} host(s) {done}"
            + (f"; failed or skipped: {', '.join(bad)}" if bad else ""),
            file=sys.stderr,
        )
    return 0 if all(r.ok for r in results) else 1


def register(command: Command) -> None:
    p = command(
        "prepare",
        "make hosts ready: doctor's automatable fixes (container toolkit, CDI spec, nvidia-uvm, "
        "/dev/char links, SELinux boolean, models directory), idempotent; never the driver",
        cmd_prepare,
    )
    inventory_flags(p)
    p.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="prepare for this model's recipe (default: what every model needs)",
    )
    dry_run_flag(p)  # list what each host would get; change nothing
    wait_lock_flag(p)
    p.add_argument(
        "--toolkit-version",
        metavar="V",
        help="pin the NVIDIA Container Toolkit, e.g. 1.17.8-1 (default: "
        "tensorless_toolkit_version, else the repository's newest)",
    )
    p.add_argument(
        "--toolkit-repo",
        metavar="URL",
        help="the toolkit's package repository (default: tensorless_toolkit_repo, else "
        "https://nvidia.github.io/libnvidia-container)",
    )
    p.add_argument(
        "--toolkit-key",
        metavar="URL",
        help="its signing key (default: tensorless_toolkit_key, else REPO/gpgkey)",
    )
    p.add_argument(
        "--gateway",
        action="store_true",
        help="also install HAProxy from the hosts' own packages (version checked), for a "
        "front door (gateway --on HOST)",
    )
    p.add_argument("--allow-draft", action="store_true", help="accept a draft recipe")
    serving_flags(p)
    recipes_flag(p)
