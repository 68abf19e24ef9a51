"""bench: measure a running server against the recipe's receipt."""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import Any

from tensorless_deploy.cli.catalog import catalog_from
from tensorless_deploy.cli.output import emit_json, paint
from tensorless_deploy.errors import UsageError
from tensorless_deploy.local.bench import (
    BenchError,
    Connect,
    Summary,
    compare,
    measure,
    over_channel,
    receipt_toml,
    summarise,
    tcp,
)
from tensorless_deploy.recipe.catalog import Entry


def _target_url(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(f"--url {url}: must be http://HOST:PORT")
    return parts.hostname, parts.port or 80


def _result(
    name: str, entry: Entry, summary: Summary, tuned: bool | None, args: argparse.Namespace
) -> dict[str, Any]:
    comps = compare(summary, entry.recipe, args.tolerance)
    return {
        "target": name,
        "recipe": entry.path,
        "tuned": tuned,
        "runs": summary.runs,
        "prompt_tokens": summary.prompt_n,
        "generated_tokens": summary.predicted_n,
        "decode_tps": {
            "median": summary.decode_median,
            "min": summary.decode_min,
            "max": summary.decode_max,
        },
        "prefill_tps": {
            "median": summary.prefill_median,
            "min": summary.prefill_min,
            "max": summary.prefill_max,
        },
        "tolerance": args.tolerance,
        "comparisons": [
            {
                "key": c.key,
                "measured": c.measured,
                "receipt": c.receipt,
                "ratio": c.ratio,
                "meets": c.meets,
            }
            for c in comps
        ],
    }


def _print(res: dict[str, Any]) -> None:
    d, p = res["decode_tps"], res["prefill_tps"]
    label = {True: "tuned", False: paint("UNTUNED", "1;33"), None: "tuning unknown"}[res["tuned"]]
    print(
        f"{res['target']}: {res['recipe']} ({label}), median of {res['runs']} runs, "
        f"{res['generated_tokens']} tokens after a {res['prompt_tokens']}-token "
        "prompt"
    )
    print(f"  decode   {d['median']:9.2f} tok/s  (min {d['min']:.2f}, max {d['max']:.2f})")
    print(f"  prefill  {p['median']:9.2f} tok/s  (min {p['min']:.2f}, max {p['max']:.2f})")
    for c in res["comparisons"]:
        verdict = paint("meets", "32") if c["meets"] else paint("BELOW", "1;31")
        print(
            f"  {c['key']}: {c['ratio']:.2f}x the receipt's {c['receipt']:g} ({verdict}; "
            f"tolerance {res['tolerance']:.0%})"
        )
    if not res["comparisons"]:
        print("  the receipt has no decode_tps.short to compare with")


def cmd_bench(args: argparse.Namespace) -> int:
    catalog = catalog_from(args)
    entries = catalog.find(args.model)
    entry = (
        next((e for e in entries if e.recipe.card.id == args.card), None)
        if args.card
        else entries[0]
    )
    if entry is None:
        raise UsageError(f"{args.model}: no recipe for card {args.card!r}")
    targets: list[tuple[str, Connect, bool | None, Any]] = []
    cleanup: list[Any] = []
    results: list[dict[str, Any]] = []
    failed: list[str] = []
    try:
        if args.inventory:
            targets = _inventory_targets(args, entry, cleanup, failed)
        else:
            host, port = _target_url(args.url) if args.url else ("127.0.0.1", args.port)
            targets = [(f"http://{host}:{port}", tcp(host, port), None, None)]
        for name, connect, tuned, _ in targets:
            try:
                summary = summarise(measure(connect, args.runs))
            except BenchError as exc:
                failed.append(f"{name}: {exc.message}")
                continue
            results.append(_result(name, entry, summary, tuned, args))
            if args.receipt:
                date = datetime.date.today().isoformat()
                sys.stdout.write(
                    receipt_toml(
                        summary, entry.recipe.engine.image, entry.recipe.card.id, date, tuned
                    )
                )
    finally:
        for close in cleanup:
            close()
    if args.json:
        emit_json(
            {
                "ok": not failed and all(c["meets"] for r in results for c in r["comparisons"]),
                "results": results,
                "errors": failed,
            }
        )
    elif not args.receipt:
        for res in results:
            _print(res)
    for line in failed:
        print(line, file=sys.stderr)
    if failed:
        return 1
    return 0 if all(c["meets"] for r in results for c in r["comparisons"]) else 1


Target = tuple[str, Connect, "bool | None", Any]


def _inventory_targets(
    args: argparse.Namespace, entry: Entry, cleanup: list[Any], failed: list[str]
) -> list[Target]:
    """One target per host serving the recipe, each through an SSH direct-tcpip channel to the
    host's own 127.0.0.1 (or its bind address): the API never has to listen on the network."""
    from tensorless_deploy.facts.deployed import DeployedUnits
    from tensorless_deploy.fleet.hosts import (
        disconnect,
        load_inventory,
        new_state,
        on_each_host,
        select_hosts,
    )
    from tensorless_deploy.launch.spec import unit_name

    inventory = load_inventory(args.inventory, False)
    hosts = select_hosts(inventory, args.limit or [])
    state = new_state(inventory)
    found = on_each_host(state, hosts, lambda h: h.get_fact(DeployedUnits), keep_connected=True)
    cleanup.append(lambda: disconnect(hosts))
    want = unit_name(entry.recipe)
    targets = []
    for host, units in zip(hosts, found, strict=True):
        if isinstance(units, str):
            failed.append(f"{host.name}: {units}")
            continue
        unit = next((u for u in units if u.name == want), None)
        if unit is None:
            failed.append(f"{host.name}: {want} is not deployed here")
            continue
        labels = unit.container_labels or unit.unit_labels
        port = int(labels.get("io.tensorless.port", "8080"))
        bind = labels.get("io.tensorless.bind", "127.0.0.1")
        bind = "127.0.0.1" if bind in ("0.0.0.0", "::") else bind
        tuned = {"true": True, "false": False}.get(labels.get("io.tensorless.tuned", ""))
        transport = host.connector.client.get_transport()

        def channel(t: Any = transport, b: str = bind, p: int = port) -> Any:
            return t.open_channel("direct-tcpip", (b, p), ("127.0.0.1", 0), timeout=10)

        targets.append(
            (f"{host.name} ({bind}:{port} over ssh)", over_channel(channel), tuned, None)
        )
    return targets
