"""check, models, info: the recipe catalog for operators and recipe authors."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorless_deploy.cli.common import catalog_from, recipes_flag
from tensorless_deploy.cli.output import emit_json, paint, table
from tensorless_deploy.decisions.cards import ceiling_for
from tensorless_deploy.decisions.cards import describe as describe_ceiling
from tensorless_deploy.errors import UsageError

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.recipe import Entry

MEASURE_ORDER = ("short", "ctx_4k", "ctx_32k", "ctx_65k")


def ordered_measurements(values: dict[str, float]) -> list[tuple[str, float]]:
    """short, ctx_4k, ctx_32k, ctx_65k, then any other keys alphabetically (recipe schema 1,
    docs/design.md)."""
    known = [(k, values[k]) for k in MEASURE_ORDER if k in values]
    rest = sorted((k, v) for k, v in values.items() if k not in MEASURE_ORDER)
    return known + rest


def cmd_check(args: argparse.Namespace) -> int:
    from tensorless_deploy.recipe import builtin_recipes_dir, load_catalog

    if args.dir is not None and args.recipes is not None and args.dir != args.recipes:
        raise UsageError(f"check {args.dir} --recipes {args.recipes}: give the directory once")
    given: Path | None = args.dir if args.dir is not None else args.recipes
    root: Path = given if given is not None else builtin_recipes_dir()
    catalog = load_catalog(root)  # a RecipeError prints every problem and exits 1
    if not catalog.entries:  # an empty or mistyped directory is nothing validated
        raise UsageError(
            f"{root}: no recipe files here (a recipe is DIR/<org>/<repo>/<card>.toml)",
            fix="pass the recipes directory itself",
        )
    n_models = len(catalog.models())
    if args.json:
        emit_json({"dir": str(root), "valid": True, "recipes": [e.path for e in catalog.entries]})
    else:
        print(f"{root}: {len(catalog.entries)} recipes, {n_models} models: all valid")
    return 0


MODEL_ROW = ("hf_repo", "name", "title", "card", "state", "path")


def cmd_models(args: argparse.Namespace) -> int:
    # the listing from the validated-catalog cache (recipe.index): no pydantic, no schema
    # import while the recipe files are the bytes a full load validated before
    from tensorless_deploy.recipe.index import catalog_rows

    root, cached = catalog_rows(getattr(args, "recipes", None))
    rows = [{k: r[k] for k in MODEL_ROW} for r in cached]
    if args.json:
        emit_json(rows)
        return 0
    if not rows:
        print(f"no recipes in {root}")
        return 0
    print(
        table(
            [
                [r["hf_repo"], r["name"] or "-", r["card"], r["state"], r["title"] or ""]
                for r in rows
            ],
            ["MODEL", "NAME", "CARD", "STATE", "TITLE"],
        )
    )
    return 0


def info_data(e: Entry) -> dict[str, Any]:
    """Every value of one recipe, as info --json prints it."""
    r = e.recipe
    data = r.model_dump(mode="json", by_alias=True)
    data["receipt"]["decode_tps"] = dict(ordered_measurements(r.receipt.decode_tps))
    data["receipt"]["prefill_tps"] = dict(ordered_measurements(r.receipt.prefill_tps))
    ceiling = ceiling_for(r.card.compute_capability)
    return {
        "path": e.path,
        "state": r.state,
        "published": not r.unpublished,
        "recipe_digest": e.digest,
        **data,
        # the card's ceilings (decisions.cards), not recipe values: null for a card without
        "card_ceilings": None
        if ceiling is None
        else {
            "max_driver_branch": ceiling.max_branch,
            "proprietary_modules_only": ceiling.proprietary_only,
            "max_cuda_major": ceiling.max_cuda_major,
            "family": ceiling.family,
        },
    }


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "bytes" else f"{n} bytes ({size:.1f} {unit})"
        size /= 1024
    raise AssertionError("unreachable")


def info_text(e: Entry) -> str:
    r = e.recipe
    head = f"{r.model.hf_repo} on {r.card.id}"
    if r.model.name:
        head += f" ({r.model.name})"
    head += f": {r.state}"
    if r.unpublished:
        head += "  " + paint("NOT PUBLISHED", "1;31")
    card = r.card
    rows: list[tuple[str, str]] = [
        ("title", r.model.title or "-"),
        ("recipe", f"{e.path} ({e.digest})"),
        ("image", r.engine.image),
        ("engine", f"{r.engine.release}, {r.engine.arch}"),
        (
            "card",
            f"{card.title or card.id}: compute capability {card.compute_capability}, "
            f">= {card.min_memory_mib} MiB, driver >= {card.min_driver}",
        ),
        *(
            [("ceilings", describe_ceiling(c))]
            if (c := ceiling_for(card.compute_capability)) is not None
            else []
        ),
        ("repo", r.model.hf_repo),
        ("revision", r.model.revision),
        ("file", r.model.file),
        ("sha256", r.model.sha256),
        ("size", _human_size(r.model.size_bytes)),
        ("license", r.model.license),
        ("alias", r.run.alias),
        ("context", str(r.run.context)),
        ("threads", f"at most {r.run.threads_max} (-t, -tb, OMP_NUM_THREADS)"),
        ("args", shlex.join(r.run.args) if r.run.args else "-"),
        (
            "env",
            " ".join(f"{k}={shlex.quote(v)}" for k, v in r.run.env.items()) or "-",
        ),
    ]
    for key, value in ordered_measurements(r.receipt.decode_tps):
        rows.append((f"decode {key}", f"{value:g} tok/s"))
    for key, value in ordered_measurements(r.receipt.prefill_tps):
        rows.append((f"prefill {key}", f"{value:g} tok/s"))
    if r.receipt.summary:
        rows.append(("summary", r.receipt.summary))
    if r.receipt.source:
        rows.append(("source", r.receipt.source))
    rows.extend(("note", note) for note in r.receipt.notes)
    width = max(len(k) for k, _ in rows)
    return "\n".join([head, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])


def cmd_info(args: argparse.Namespace) -> int:
    catalog = catalog_from(args)
    entries = [catalog.card(args.model, args.card)] if args.card else catalog.find(args.model)
    if args.json:
        emit_json([info_data(e) for e in entries])
    else:
        print("\n\n".join(info_text(e) for e in entries))
    return 0


def register(command: Command) -> None:
    p = command(
        "check", "validate a recipes directory (exit 1 when any recipe is refused)", cmd_check
    )
    p.add_argument(
        "dir",
        nargs="?",
        type=Path,
        metavar="DIR",
        help="recipes directory (default: the built-in catalog)",
    )
    recipes_flag(p)  # every command reads recipes from --recipes DIR; check also takes DIR
    p = command("models", "list the recipes: one row per model and card", cmd_models)
    recipes_flag(p)
    p = command(
        "info", "show every value of a model's recipes before anything is downloaded", cmd_info
    )
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    p.add_argument("--card", metavar="ID", help="only this card's recipe")
    recipes_flag(p)
