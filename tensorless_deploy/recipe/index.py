"""The catalog's listing (``models``) without pydantic: a cache of what the full load validated,
keyed by the bytes of every recipe file and of the code that validates them.

A full load (``catalog.load_catalog``: TOML, the schema's models, the path and cross-recipe
rules) costs about as much as importing pydantic and building the schema's models; listing the
catalog needs neither once the same bytes were validated before. The key is the sha256 of this
tool's version, every ``recipe/*.py`` file and every recipe file's path and bytes, so an edited
recipe, a new one, a removed one or a changed rule all miss the cache and load in full (an
invalid catalog is never cached: the full load refuses it, as before).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CACHE_FORMAT = 1
ROW_KEYS = ("hf_repo", "name", "title", "card", "state", "path", "digest")


def builtin_recipes_dir() -> Path:
    """The catalog shipped in the wheel, or the repository's recipes/ in a source checkout."""
    here = Path(__file__).resolve().parent.parent
    shipped = here / "_builtin" / "recipes"
    return shipped if shipped.is_dir() else here.parent / "recipes"


def recipe_files(root: Path) -> Iterator[tuple[str, Path]]:
    """Every ``*.toml`` under root (no dot-named part), sorted: the files a catalog is made of."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if path.suffix == ".toml" and path.is_file():
            yield rel.as_posix(), path


def _cache_dir() -> Path:
    """hub.controller_state_dir()/catalog, computed here: importing hub (dataclasses, inspect)
    costs more than listing the catalog (tests/test_cli_startup.py holds the two equal)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tensorless-deploy" / "catalog"


def catalog_key(root: Path) -> str | None:
    """sha256 of the tool's version, its recipe-validating code and every recipe file's path
    and bytes; None when a file cannot be read (the full load then says why)."""
    from tensorless_deploy import __version__

    h = hashlib.sha256(f"tensorless catalog {CACHE_FORMAT} {__version__}\0".encode())
    try:
        for code in sorted(Path(__file__).resolve().parent.glob("*.py")):
            h.update(code.name.encode() + b"\0" + code.read_bytes() + b"\0")
        h.update(b"recipes\0")
        for rel, path in recipe_files(root):
            data = path.read_bytes()
            h.update(f"{rel}\0{len(data)}\0".encode() + data)
    except OSError:
        return None
    return h.hexdigest()


def _rows_of(catalog: Any) -> list[dict[str, Any]]:
    return [
        {
            "hf_repo": e.recipe.model.hf_repo,
            "name": e.recipe.model.name,
            "title": e.recipe.model.title,
            "card": e.recipe.card.id,
            "state": e.recipe.state,
            "path": e.path,
            "digest": e.digest,
        }
        for e in catalog.entries
    ]


def catalog_rows(root: Path | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """The catalog under root (default: built-in), one row per recipe (``ROW_KEYS``), in
    catalog order; from the cache when these bytes were validated before, else from a full load
    (``load_catalog``, which refuses an invalid catalog), whose rows are cached for next time."""
    root = builtin_recipes_dir() if root is None else root
    key = catalog_key(root) if root.is_dir() else None
    cached = _cache_dir() / f"{key}.json" if key else None
    if cached is not None:
        try:
            doc = json.loads(cached.read_text(encoding="utf-8"))
            rows = doc["rows"]
            if doc.get("key") == key and all(set(r) == set(ROW_KEYS) for r in rows):
                return root, rows
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no cache, or not one this version wrote: load in full
    from tensorless_deploy.recipe.catalog import load_catalog

    catalog = load_catalog(root)
    rows = _rows_of(catalog)
    if cached is not None:
        _write(cached, {"key": key, "root": str(root), "rows": rows})
    return root, rows


def _write(path: Path, doc: dict[str, Any]) -> None:
    """Atomically, and quietly: a cache this machine cannot write only costs the next run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
