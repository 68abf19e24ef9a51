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
    from tensorless_deploy.decisions.options import Flags
    from tensorless_deploy.fleet.gateway import FleetDoor, GatewayResult, Refreshed
    from tensorless_deploy.fleet.runner import HostResult
    from tensorless_deploy.recipe.catalog import Catalog


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


def _models(out: GatewayResult) -> dict[str, list[str]]:
    return {p.model: [f"{b.host}:{b.port}" for b in p.backends] for p in out.plan.pools}


def refresh_after(
    inventory: object,
    catalog: Catalog,
    door: FleetDoor | None,
    flags: Flags,
    results: list[HostResult],
) -> list[Refreshed]:
    """After deploy or stop: the inventory's doors rendered again when the run changed a host
    (fleet.gateway.refresh_doors); nothing for a run that changed nothing."""
    from tensorless_deploy.fleet.gateway import refresh_doors

    if door is None or not any(r.outcome == "changed" for r in results):
        return []
    return refresh_doors(inventory, catalog, door, flags)


def refreshed_ok(done: list[Refreshed]) -> bool:
    """No door failed to render again (one this controller cannot render is said, not failed)."""
    return all(r.result is None or r.result.ok for r in done)


def refreshed_lines(done: list[Refreshed]) -> list[str]:
    lines = []
    for r in done:
        if r.result is None:
            lines.append(f"door {r.door}: not rendered again: {r.why}")
            continue
        d = r.result.door
        said = [line for s in d.steps if s.name == "gateway.door" for line in s.output] if d else []
        outcome = d.outcome if d is not None else "?"
        pools = "; ".join(f"{m}: {', '.join(w) or 'none'}" for m, w in _models(r.result).items())
        lines.append(
            f"door {r.door}: {outcome}"
            + (f" ({d.reason})" if d is not None and d.reason else "")
            + (f", {said[-1]}" if said and outcome == "changed" else "")
            + f" [{pools or 'no instance'}]"
        )
    return lines


def refreshed_json(done: list[Refreshed]) -> list[dict[str, object]]:
    return [
        {
            "door": r.door,
            "outcome": r.result.door.outcome if r.result and r.result.door else "not rendered",
            "why": r.why if r.result is None else (r.result.door.reason if r.result.door else None),
            "models": _models(r.result) if r.result is not None else {},
        }
        for r in done
    ]


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
    # --limit: the door fronts those hosts only, and so does every refresh (None: every host
    # of the inventory, those added to it later too)
    fronted = [h.name for h in select_hosts(inventory, args.limit)] if args.limit else None
    if args.on is None:
        raise UsageError("gateway: --on HOST is required: the inventory host the door runs on")
    out = gateway(inventory, catalog, models, args.on, flags, dry=args.dry_run, only=fronted)
    if args.json:
        emit_json(
            {
                "ok": out.ok,
                "url": out.plan.url,
                "host": out.plan.host,
                "models": _models(out),
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
