"""deploy: converge hosts to serve a recipe under systemd, health-gated."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tensorless_deploy.cli.catalog import catalog_from
from tensorless_deploy.cli.output import emit_json, paint
from tensorless_deploy.decisions.checks import Options
from tensorless_deploy.errors import UsageError
from tensorless_deploy.fleet.deploy import DeployRequest, HostResult, deploy, roll, serving_digests
from tensorless_deploy.fleet.hosts import is_ip_address, load_inventory, select_hosts

COLOURS = {
    "changed": "33",
    "unchanged": "32",
    "no change": "32",
    "would change": "33",
    "failed": "1;31",
    "skipped": "1;31",
    "untouched": "33",
}


def hf_token() -> str | None:
    """The Hub token as huggingface_hub finds it (HF_TOKEN, or the stored login)."""
    from huggingface_hub import get_token

    return get_token()


def result_json(r: HostResult) -> dict[str, Any]:
    return {
        "host": r.host,
        "outcome": r.outcome,
        "ok": r.ok,
        "reason": r.reason,
        "recipe": r.recipe,
        "recipe_digest": r.recipe_digest,
        "card": r.card,
        "address": r.address,
        "transfer": r.transfer,
        "tuned": None if r.tuning is None else r.tuning.tuned,
        "untuned_reasons": [] if r.tuning is None else list(r.tuning.reasons),
        "failed_checks": [
            {"id": c.id, "evidence": c.evidence, "fix": c.fix} for c in r.failed_checks
        ],
        "steps": [
            {"name": s.name, "outcome": s.outcome, "output": list(s.output)} for s in r.steps
        ],
    }


def print_results(results: list[HostResult], verbose: int) -> None:
    for r in results:
        head = f"{r.host}: {paint(r.outcome, COLOURS.get(r.outcome, '0'))}"
        if r.card:
            head += f"  {r.recipe}"
        if r.address and r.ok:
            head += f"  serving on {r.address}"
        print(head)
        if r.transfer and r.transfer.startswith("push"):
            print(f"  transfer: {r.transfer}")
        if r.tuning is not None and not r.tuning.tuned:
            print(
                "  "
                + paint("untuned", "33")
                + ": "
                + "; ".join(r.tuning.reasons)
                + " (the receipt's numbers do not apply)"
            )
        if r.reason and not r.ok:
            print(f"  {r.reason}")
        for c in r.failed_checks:
            if c.fix:
                print(f"  fix {c.id}: {c.fix}")
        for s in r.steps:
            if s.outcome == "failed" or verbose:
                print(f"  {s.name}: {s.outcome}")
                for line in s.output if (s.outcome == "failed" or verbose > 1) else ():
                    print(f"    {line}")


def print_roll(results: list[HostResult], serving: dict[str, str | None]) -> None:
    """After a roll: which hosts serve the new recipe, which still the old."""
    new = next((r.recipe_digest for r in results if r.ok and r.recipe_digest), None)
    groups: dict[str, list[str]] = {}
    for r in results:
        now = serving.get(r.host)
        key = (
            ("new recipe " + (now or "")[:19])
            if now and now == new
            else (f"old recipe {now[:19]}" if now else "nothing healthy")
        )
        groups.setdefault(key, []).append(f"{r.host} ({r.outcome})")
    for key, names in groups.items():
        print(f"{key}: {', '.join(names)}")


def cmd_deploy(args: argparse.Namespace) -> int:
    catalog = catalog_from(args)
    catalog.find(args.model)
    if args.bind is not None and not is_ip_address(args.bind):
        raise UsageError(f"--bind {args.bind}: must be an IP address such as 127.0.0.1")
    base = Options(allow_draft=args.allow_draft)
    override = {k: v for k, v in (("port", args.port), ("bind", args.bind)) if v is not None}
    inventory = load_inventory(args.inventory, False)
    hosts = select_hosts(inventory, args.limit or [])
    extra = tuple(args.extra)
    request = DeployRequest(
        args.model,
        base,
        args.context,
        extra,
        args.dry,
        None if args.dry else hf_token(),
        override,
        args.transfer,
    )
    if args.serial is not None and args.serial < 1:
        raise UsageError(f"--serial {args.serial}: must be 1 or more hosts at a time")
    if args.serial and not args.dry:
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
        print_results(results, args.verbose)
        if serving:
            print_roll(results, serving)
        bad = [r.host for r in results if not r.ok]
        print(
            f"{len(results) - len(bad)} of {len(results)} host(s) serving"
            + (f"; failed or skipped: {', '.join(bad)}" if bad else ""),
            file=sys.stderr,
        )
    return 0 if all(r.ok for r in results) else 1
