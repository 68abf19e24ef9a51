"""plan: where each model fits, with the largest context, before anything is downloaded."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from tensorless_deploy.cli.common import (
    catalog_from,
    flags_from,
    hosts_flags,
    instances_flag,
    recipes_flag,
    serving_flags,
)
from tensorless_deploy.cli.output import compact, emit_json, paint, stream_json, table
from tensorless_deploy.decisions.cards import describe as describe_ceiling
from tensorless_deploy.errors import UsageError

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.hostplan.placement import ModelPlan, Placement
    from tensorless_deploy.recipe.catalog import Entry

# Above this many rows --json is written compact (one line), streamed row by row through the C
# encoder, which is ten times faster than the indenting one (21 MB for 1,000 hosts x 20 recipes:
# 0.4 s against 6 s).
JSON_INDENT_MAX_ROWS = 2000


def _mib(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def _row(mp: ModelPlan, p: Placement) -> list[str]:
    gpu = f"{p.gpu.index} {p.gpu.name}" if p.gpu else "-"
    if p.ok:
        fits = paint("yes", "32")
        why = "alternative" if mp.alternative(p) else "best"
    else:
        fits = paint("no", "1;31")
        why = f"{p.error_code}: {p.error}"
    ctx = "-" if p.default_context_tokens is None else str(p.default_context_tokens)
    if p.default_context_tokens is not None and not p.tuned:
        ctx += " (untuned)"
    need = p.need_bytes
    usable = p.card_memory.usable if p.card_memory else None
    mem = "-" if need is None and usable is None else f"{_mib(need)} / {_mib(usable)}"
    return [
        p.host,
        gpu,
        p.card or "-",
        fits,
        "-" if p.max_context_tokens is None else str(p.max_context_tokens),
        ctx,
        "-" if p.kv_bytes_per_token is None else str(p.kv_bytes_per_token),
        mem,
        why,
    ]


HEADER = [
    "HOST",
    "GPU",
    "CARD",
    "FITS",
    "MAX CTX",
    "CONTEXT",
    "KV B/TOKEN",
    "NEED / USABLE",
    "CODE / REASON",
]


def _text(mp: ModelPlan, verbose: int) -> list[str]:
    best = mp.best
    head = f"{mp.model}: " + (
        paint(f"best on {best.host} GPU {best.gpu.index if best.gpu else '?'}", "32")
        if best is not None
        else paint("NO PLACEMENT", "1;31")
    )
    lines = [head]
    for key, r in sorted(mp.headers.items()):
        h = r.header
        if h is None:
            lines.append(f"  header {key[2]}: {r.error}")
        elif verbose or not r.cached:
            size = f" of {h.file_size}" if h.file_size is not None else ""
            how = "cached" if r.cached else f"{h.bytes_fetched} bytes fetched{size}"
            lines.append(f"  header {key[2]}: {h.metadata_bytes} bytes of metadata, {how}")
    for card, cc, ceiling in mp.ceilings:
        lines.append(f"  ceilings {card} (compute {cc}): {describe_ceiling(ceiling)}")
    rows = [_row(mp, p) for p in mp.placements]
    lines += ["  " + line for line in table(rows, HEADER).splitlines()]
    for p in mp.placements:
        for note in p.notes:
            gpu = f" GPU {p.gpu.index}" if p.gpu else ""
            lines.append(f"  note {p.host}{gpu}: {note}")
    return lines


def cmd_plan(args: argparse.Namespace) -> int:
    import gc

    # A plan over a large fleet makes many small objects and no cycles worth collecting: the
    # collector's passes cost about 0.1 s at 1,000 hosts x 20 recipes (bench/plan_scale.py).
    was = gc.isenabled()
    gc.disable()
    try:
        return _cmd_plan(args)
    finally:
        if was:
            gc.enable()


def _cmd_plan(args: argparse.Namespace) -> int:
    t_imports = time.perf_counter()
    from concurrent.futures import ThreadPoolExecutor

    from tensorless_deploy.fleet.inventory import load_inventory, offline_hosts, select_hosts
    from tensorless_deploy.gguf.header import header_cache_dir, read_headers
    from tensorless_deploy.hostplan.placement import (
        MARGIN,
        PlanOptions,
        header_key,
        plan,
        plan_json,
    )

    t0 = time.perf_counter()
    if args.offline and args.local:
        raise UsageError("--offline plans from inventory data: use -i INVENTORY, not --local")
    flags = flags_from(args)
    catalog = catalog_from(args)
    models: dict[str, list[Entry]] = {}
    for name in args.models:
        entries = catalog.find(name)  # an unknown model is a usage problem before any host
        models.setdefault(entries[0].recipe.model.hf_repo, entries)
    # offline: no SSH, so neither pyinfra's loader nor its imports (gevent, paramiko)
    inventory = load_inventory(args.inventory, args.local, offline=args.offline)
    hosts = select_hosts(inventory, args.limit or [])
    keys = [header_key(e.recipe) for entries in models.values() for e in entries]
    with ThreadPoolExecutor(1) as pool:  # headers over HTTP while SSH surveys the hosts
        pending = pool.submit(read_headers, keys, header_cache_dir())
        if args.offline:
            plan_hosts = offline_hosts(hosts, flags)
        else:
            from tensorless_deploy.fleet.connect import gpu_images, new_state, survey_hosts

            images = gpu_images([e for entries in models.values() for e in entries])
            plan_hosts = survey_hosts(
                new_state(inventory), hosts, flags, local=args.local, images=images
            )
        headers = pending.result()
    options = PlanOptions(context=flags.context, allow_draft=flags.allow_draft)
    t_plan = time.perf_counter()
    plans = plan(list(models.items()), plan_hosts, headers, options)
    planning_s = time.perf_counter() - t_plan
    if args.json:
        large = sum(len(mp.placements) for mp in plans) > JSON_INDENT_MAX_ROWS
        doc = plan_json(
            plans, options, offline=args.offline, lazy=large, encode=compact if large else None
        )
        doc["timing"] = {
            "imports_s": round(t0 - t_imports, 4),  # the planning layers, after the parser
            "planning_s": round(planning_s, 4),
            "total_s": round(time.perf_counter() - t0, 4),
        }
        if large:
            stream_json(doc)  # the rows made as they are written, never one string
        else:
            emit_json(doc)
    else:
        for mp in plans:
            print("\n".join(_text(mp, args.verbose)))
        if args.verbose:
            print(f"margin: {MARGIN}")
        placed = sum(1 for mp in plans if mp.placed)
        print(
            f"{placed} of {len(plans)} model(s) placed on {len(plan_hosts)} host(s); planned in "
            f"{planning_s:.3f} s",
            file=sys.stderr,
        )
    return 0 if all(mp.placed for mp in plans) else 1


def register(command: Command) -> None:
    p = command(
        "plan",
        "where each model fits, per host and GPU: the largest context, KV bytes per token, "
        "memory needed vs free, or why not (exit 1 when a model has no placement)",
        cmd_plan,
    )
    hosts_flags(p)
    p.add_argument("models", nargs="+", metavar="MODEL", help="repo ids or short names")
    p.add_argument(
        "--context",
        type=int,
        metavar="N",
        help="does context N fit (instead of the recipe's; untuned)",
    )
    p.add_argument(
        "--offline", action="store_true", help="plan from inventory data (tensorless_gpus), no SSH"
    )
    p.add_argument("--allow-draft", action="store_true", help="accept draft recipes")
    serving_flags(p)
    instances_flag(p)
    recipes_flag(p)
