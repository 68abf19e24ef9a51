"""gateway: one front door (HAProxy, from the host's packages) over every instance of some
models across the inventory, on one host; fleet.gateway runs it, docs/gateway.md says how."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from tensorless_deploy.cli.common import (
    access_from,
    catalog_from,
    dry_run_flag,
    flags_from,
    inventory_flags,
    recipes_flag,
)
from tensorless_deploy.cli.output import emit_json

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.fleet.gateway import GatewayResult


def _lines(out: GatewayResult) -> list[str]:
    lines = [f"door {out.plan.url} on {out.plan.host}"]
    for p in out.plan.pools:
        where = ", ".join(f"{b.host}:{b.port}" for b in p.backends)
        lines.append(f"  {p.model}: {where}")
    for host, why in out.skipped:
        lines.append(f"  not fronted: {host}: {why}")
    if out.door is not None:
        lines.append(
            f"{out.door.host}: {out.door.outcome}"
            + (f" ({out.door.reason})" if out.door.reason else "")
        )
        for s in out.door.steps:
            lines.append(f"  {s.name}: {s.outcome}")
            if s.outcome != "unchanged":
                lines += [f"    {line}" for line in s.output]
    for m in out.markers:
        lines.append(f"{m.host}: marker {m.outcome}" + (f" ({m.reason})" if m.reason else ""))
    return lines


def cmd_gateway(args: argparse.Namespace) -> int:
    from tensorless_deploy.errors import UsageError
    from tensorless_deploy.fleet.gateway import gateway
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts

    catalog = catalog_from(args)
    models = args.models or list(dict.fromkeys(e.recipe.model.hf_repo for e in catalog.entries))
    for m in models:
        catalog.find(m)  # an unknown model is a usage problem before any host
    flags = access_from(args, flags_from(args))
    inventory = load_inventory(args.inventory, False, offers_local=False)
    fronted = [h.name for h in select_hosts(inventory, args.limit or [])]
    if args.on is None:
        raise UsageError("gateway: --on HOST is required: the inventory host the door runs on")
    out = gateway(inventory, catalog, models, args.on, flags, dry=args.dry_run, only=fronted)
    if args.json:
        emit_json(
            {
                "ok": out.ok,
                "url": out.plan.url,
                "host": out.plan.host,
                "models": {
                    p.model: [f"{b.host}:{b.port}" for b in p.backends] for p in out.plan.pools
                },
                "skipped": [{"host": h, "why": w} for h, w in out.skipped],
                "outcome": out.door.outcome if out.door is not None else "dry run",
            }
        )
    else:
        for line in _lines(out):
            print(line, file=sys.stderr if args.dry_run else sys.stdout)
    return 0 if out.ok else 1


def register(command: Command) -> None:
    from tensorless_deploy.hostplan.gateway import DEFAULT_DOOR_PORT

    p = command(
        "gateway",
        "one front door (HAProxy from the host's packages) on --on HOST over every instance of "
        "the models across the inventory: balanced by health and load, routed by model",
        cmd_gateway,
    )
    p.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="a repo id or short name (default: every model in the catalog)",
    )
    inventory_flags(p)
    p.add_argument("--on", metavar="HOST", help="the inventory host the door runs on (required)")
    p.add_argument(
        "--port", type=int, metavar="N", help=f"the door's port (default {DEFAULT_DOOR_PORT})"
    )
    p.add_argument("--bind", metavar="ADDR", help="the door's address (default 127.0.0.1)")
    p.add_argument("--api-key-file", metavar="FILE", help="callers must send the key in FILE")
    p.add_argument(
        "--insecure-open",
        action="store_true",
        help="allow a non-loopback --bind without an API key",
    )
    p.add_argument(
        "--tls-cert-file", metavar="FILE", help="serve https at the door with this PEM cert"
    )
    p.add_argument("--tls-key-file", metavar="FILE", help="... and this PEM private key")
    dry_run_flag(p)
    recipes_flag(p)
