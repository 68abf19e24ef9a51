"""bundle: one recipe's offline bundle (fleet.bundle), for a site that reaches neither the Hub
nor a registry; and --from-bundle, the flag of the commands that take their bytes from one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tensorless_deploy.cli.common import catalog_from, recipes_flag
from tensorless_deploy.cli.output import emit_json
from tensorless_deploy.errors import UsageError

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.fleet.bundle import Bundle
    from tensorless_deploy.fleet.push import Source
    from tensorless_deploy.recipe.catalog import Catalog, Entry


def _entry(catalog: Catalog, model: str, card: str | None) -> Entry:
    """The one recipe a bundle holds: --card's, else MODEL's only one."""
    if card:
        return catalog.card(model, card)
    hits = catalog.find(model)
    if len(hits) > 1:
        cards = ", ".join(e.recipe.card.id for e in hits)
        raise UsageError(
            f"{model}: {len(hits)} recipes ({cards}); a bundle holds one",
            fix="pass --card ID",
        )
    return hits[0]


def cmd_bundle(args: argparse.Namespace) -> int:
    from tensorless_deploy.fleet.bundle import bundle_of
    from tensorless_deploy.hub import token

    catalog = catalog_from(args)
    entry = _entry(catalog, args.model, args.card)
    bundle = bundle_of(catalog, entry, args.output, token=token)
    files = {
        "recipe": bundle.root / "recipe" / entry.path,
        "model": bundle.model,
        "image": bundle.image,
        "wheel": bundle.wheel,
    }
    if args.json:
        emit_json(
            {
                "ok": True,
                "bundle": str(bundle.root),
                "recipe": entry.path,
                "recipe_digest": entry.digest,
                "parts": {k: {"path": str(p), "bytes": p.stat().st_size} for k, p in files.items()},
            }
        )
        return 0
    for what, path in files.items():
        print(f"{what:<7} {path.relative_to(bundle.root)} ({path.stat().st_size} bytes)")
    print(f"wrote bundle {bundle.root} (recipe {entry.path}, {entry.digest})", file=sys.stderr)
    return 0


def from_bundle(args: argparse.Namespace) -> Bundle | None:
    """--from-bundle PATH verified (every part, before anything reaches a host) and staged for
    planning without network; None without the flag."""
    from tensorless_deploy.fleet.bundle import stage, verify

    path: Path | None = getattr(args, "from_bundle", None)
    if path is None:
        return None
    if getattr(args, "recipes", None) is not None:
        raise UsageError("--from-bundle and --recipes: the bundle holds its own recipe")
    bundle = verify(path)
    stage(bundle)
    return bundle


def catalog_of(args: argparse.Namespace, bundle: Bundle | None) -> Catalog:
    """The bundle's catalog of one where a command takes its bytes from a bundle, else
    --recipes' (default: the built-in catalog)."""
    return bundle.catalog if bundle is not None else catalog_from(args)


def deploy_source(args: argparse.Namespace) -> tuple[Catalog, Source | None, str]:
    """deploy's catalog, the bytes it pushes from and its transfer: --from-bundle's (the
    bundle's catalog of one, its files, push: the hosts need neither Hub nor registry), else
    --recipes' catalog, the Hub and the registry, --transfer."""
    bundle = from_bundle(args)
    if bundle is None:
        return catalog_from(args), None, args.transfer
    if args.transfer == "pull":
        raise UsageError("--from-bundle pushes the bundle's bytes: it takes no --transfer pull")
    return bundle.catalog, bundle.source, "push"


def from_bundle_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from-bundle",
        type=Path,
        metavar="PATH",
        help="take the recipe, the model and the image from a bundle (every part verified "
        "first): no Hub, no registry",
    )


def register(command: Command) -> None:
    p = command(
        "bundle",
        "write one recipe's offline bundle: image (OCI archive), GGUF, recipe, this tool's "
        "wheel, SHA256SUMS",
        cmd_bundle,
    )
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    p.add_argument("--card", metavar="ID", help="the card's recipe (needed when MODEL has more)")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="PATH",
        help="the bundle directory to write (must not exist)",
    )
    recipes_flag(p)
