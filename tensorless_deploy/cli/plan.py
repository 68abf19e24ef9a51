"""plan: where each model fits, with the largest context, before anything is downloaded."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tensorless_deploy.cli.catalog import catalog_from
from tensorless_deploy.cli.output import emit_json, paint, table
from tensorless_deploy.decisions.checks import Options
from tensorless_deploy.decisions.placement import (
    MARGIN,
    HeaderKey,
    HeaderResult,
    ModelPlan,
    Placement,
    PlanHost,
    PlanOptions,
    header_key,
    plan,
    plan_json,
)
from tensorless_deploy.errors import TensorlessError, UsageError
from tensorless_deploy.recipe.catalog import Entry

HEADER_THREADS = 8
# Above this many rows --json is written compact (one line): the C encoder is ten times faster
# than the indenting one (21 MB for 1,000 hosts x 20 recipes: 0.4 s against 6 s).
JSON_INDENT_MAX_ROWS = 2000


def header_cache_dir() -> Path:
    """$XDG_CACHE_HOME/tensorless-deploy/headers (default ~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tensorless-deploy" / "headers"


def read_headers(
    keys: Sequence[HeaderKey], cache_dir: Path | None, endpoint: str | None = None
) -> dict[HeaderKey, HeaderResult]:
    """Each (repo, revision, file) header once, in parallel, through the per-commit cache. A
    token (huggingface_hub's) is looked up only when the server asks for one."""
    from tensorless_deploy.gguf.header import HeaderError, read_hub_header
    from tensorless_deploy.hub import endpoint as hf_endpoint

    base = endpoint or hf_endpoint()
    cache = cache_dir
    if cache is not None:
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError:
            cache = None  # planning still works, it only reads the headers again next time

    def one(key: HeaderKey) -> HeaderResult:
        repo, revision, filename = key
        try:
            try:
                h = read_hub_header(repo, revision, filename, endpoint=base, cache_dir=cache)
            except HeaderError as exc:
                if "HTTP 401" not in exc.message and "HTTP 403" not in exc.message:
                    raise
                from huggingface_hub import get_token

                token = get_token()
                if not token:
                    fix = "log in with `hf auth login` or set HF_TOKEN (gated or private repo)"
                    raise HeaderError(exc.message, fix=fix) from None
                h = read_hub_header(
                    repo, revision, filename, token=token, endpoint=base, cache_dir=cache
                )
        except TensorlessError as exc:
            return HeaderResult(None, exc.lines()[0])
        return HeaderResult(h, None, cached=h.bytes_fetched == 0)

    unique = list(dict.fromkeys(keys))
    if not unique:
        return {}
    with ThreadPoolExecutor(min(HEADER_THREADS, len(unique))) as pool:
        return dict(zip(unique, pool.map(one, unique), strict=True))


def offline_hosts(hosts: Sequence[Any]) -> list[PlanHost]:
    """Host facts from inventory data (tensorless_gpus), without connecting."""
    from tensorless_deploy.facts import host_facts_from_inventory
    from tensorless_deploy.fleet.hosts import DATA_GPUS

    out = []
    for h in hosts:
        gpus = getattr(h.data, DATA_GPUS, None)
        if gpus is None:
            out.append(
                PlanHost(
                    h.name,
                    None,
                    f"--offline: no {DATA_GPUS} in its inventory data "
                    "(add it, or plan without --offline)",
                )
            )
            continue
        try:
            out.append(PlanHost(h.name, host_facts_from_inventory({"gpus": gpus})))
        except TensorlessError as exc:
            out.append(PlanHost(h.name, None, f"{DATA_GPUS}: {exc.message}"))
    return out


def surveyed_hosts(inventory: Any, hosts: Sequence[Any], local: bool) -> list[PlanHost]:
    from tensorless_deploy.fleet.hosts import new_state, survey_hosts

    state = new_state(inventory)
    outcomes = survey_hosts(state, hosts, Options(local=local))
    return [PlanHost(o.name, o.facts, o.error) for o in outcomes]


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
    rows = [_row(mp, p) for p in mp.placements]
    lines += ["  " + line for line in table(rows, HEADER).splitlines()]
    for p in mp.placements:
        for note in p.notes:
            gpu = f" GPU {p.gpu.index}" if p.gpu else ""
            lines.append(f"  note {p.host}{gpu}: {note}")
    return lines


def cmd_plan(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if args.offline and args.local:
        raise UsageError("--offline plans from inventory data: use -i INVENTORY, not --local")
    if args.context is not None and args.context <= 0:
        raise UsageError(f"--context {args.context}: must be positive")
    catalog = catalog_from(args)
    models: dict[str, list[Entry]] = {}
    for name in args.models:
        entries = catalog.find(name)  # an unknown model is a usage problem before any host
        models.setdefault(entries[0].recipe.model.hf_repo, entries)
    from tensorless_deploy.fleet.hosts import load_inventory, select_hosts

    inventory = load_inventory(args.inventory, args.local)
    hosts = select_hosts(inventory, args.limit or [])
    keys = [header_key(e.recipe) for entries in models.values() for e in entries]
    with ThreadPoolExecutor(1) as pool:  # headers over HTTP while SSH surveys the hosts
        pending = pool.submit(read_headers, keys, header_cache_dir())
        if args.offline:
            plan_hosts = offline_hosts(hosts)
        else:
            plan_hosts = surveyed_hosts(inventory, hosts, args.local)
        headers = pending.result()
    options = PlanOptions(context=args.context, allow_draft=args.allow_draft)
    t_plan = time.perf_counter()
    plans = plan(list(models.items()), plan_hosts, headers, options)
    planning_s = time.perf_counter() - t_plan
    if args.json:
        doc = plan_json(plans, options, offline=args.offline)
        doc["timing"] = {
            "planning_s": round(planning_s, 4),
            "total_s": round(time.perf_counter() - t0, 4),
        }
        if sum(len(mp.placements) for mp in plans) <= JSON_INDENT_MAX_ROWS:
            emit_json(doc)
        else:
            # json.dumps, not json.dump: only the one-shot form uses the C encoder
            sys.stdout.write(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")
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
