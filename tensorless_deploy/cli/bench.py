"""bench: measure a running server against the recipe's receipt."""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import TYPE_CHECKING, Any

from tensorless_deploy.cli.common import catalog_from, limit_flag, recipes_flag
from tensorless_deploy.cli.output import emit_json, paint
from tensorless_deploy.errors import UsageError

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.local.bench import Summary
    from tensorless_deploy.recipe.catalog import Entry


def _target_url(url: str) -> tuple[str, int, bool]:
    """--url: (host, port, https)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--url {url}: must be http://HOST:PORT or https://HOST:PORT")
    secure = parts.scheme == "https"
    return parts.hostname, parts.port or (443 if secure else 80), secure


def bench_result(
    name: str, entry: Entry, summary: Summary, tuned: bool | None, args: argparse.Namespace
) -> dict[str, Any]:
    from tensorless_deploy.local.bench import compare

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


def print_bench_result(res: dict[str, Any]) -> None:
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
    from contextlib import ExitStack

    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.fleet.status import BenchTarget, bench_targets, client_key
    from tensorless_deploy.local.bench import (
        BenchError,
        measure,
        receipt_toml,
        summarise,
        tcp,
        tls_context,
    )

    catalog = catalog_from(args)
    entries = catalog.find(args.model)
    entry = (
        next((e for e in entries if e.recipe.card.id == args.card), None)
        if args.card
        else entries[0]
    )
    if entry is None:
        raise UsageError(f"{args.model}: no recipe for card {args.card!r}")
    targets: list[BenchTarget]
    results: list[dict[str, Any]] = []
    failed: list[str] = []
    with ExitStack() as stack:
        if args.inventory:
            # each unit judged by the recipe of its own card (--card: only that card's units)
            inventory = load_inventory(args.inventory, False)
            hosts = select_hosts(inventory, args.limit or [])
            targets, refused = stack.enter_context(
                bench_targets(inventory, hosts, entries, args.card)
            )
            failed += refused
        else:
            host, port, secure = (
                _target_url(args.url) if args.url else ("127.0.0.1", args.port, False)
            )
            key = client_key(args.api_key_file, "--api-key-file")
            try:
                tls = tls_context(args.cacert) if secure else None
            except OSError as exc:
                raise UsageError(f"--cacert {args.cacert}: {exc.strerror or exc}") from None
            scheme = "https" if secure else "http"
            where = f"{scheme}://{host}:{port}"
            targets = [(where, tcp(host, port, tls=tls), None, key, entry)]
        for name, connect, tuned, key, entry in targets:
            try:
                summary = summarise(measure(connect, args.runs, api_key=key))
            except BenchError as exc:
                failed.append(f"{name}: {exc.lines()[0]}")
                continue
            results.append(bench_result(name, entry, summary, tuned, args))
            if args.receipt:
                date = datetime.date.today().isoformat()
                sys.stdout.write(
                    receipt_toml(
                        summary, entry.recipe.engine.image, entry.recipe.card.id, date, tuned
                    )
                )
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
            print_bench_result(res)
    for line in failed:
        print(line, file=sys.stderr)
    if failed:
        return 1
    return 0 if all(c["meets"] for r in results for c in r["comparisons"]) else 1


def register(command: Command) -> None:
    p = command("bench", "measure decode and prefill speed against the recipe's receipt", cmd_bench)
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--local", action="store_true", help="the server on this machine (the default; see --port)"
    )
    where.add_argument(
        "-i",
        "--inventory",
        metavar="INVENTORY",
        help="every inventory host serving MODEL, through SSH",
    )
    where.add_argument("--url", metavar="URL", help="a server at http://HOST:PORT (or https://)")
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="send the key in FILE (local or --url; with -i the inventory's "
        "tensorless_api_key_file)",
    )
    p.add_argument(
        "--cacert",
        metavar="FILE",
        help="with an https --url: the CA (or self-signed cert) to trust",
    )
    p.add_argument("--port", type=int, default=8080, metavar="N", help="local port (8080)")
    limit_flag(p)
    p.add_argument("--card", metavar="ID", help="the card's recipe (default: the model's first)")
    p.add_argument("--runs", type=int, default=3, metavar="N", help="measured runs (default 3)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.10,
        metavar="F",
        help="how far below the receipt still meets it (default 0.10)",
    )
    p.add_argument(
        "--receipt", action="store_true", help="print the [receipt] table for the measured numbers"
    )
    recipes_flag(p)
