"""Layer 1: recipes of schema 1, the loader and the catalog.

The names below load on first use (PEP 562): importing ``tensorless_deploy.recipe.flags`` or
``.text`` (the options resolver does, for every command) does not import pydantic and the
schema, and ``models`` reads the catalog through ``recipe.index`` without either.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensorless_deploy.recipe.catalog import (
        Catalog,
        Entry,
        load_catalog,
        parse_recipe,
        recipe_digest,
    )
    from tensorless_deploy.recipe.index import builtin_recipes_dir
    from tensorless_deploy.recipe.schema import Recipe

__all__ = [
    "Catalog",
    "Entry",
    "Recipe",
    "builtin_recipes_dir",
    "load_catalog",
    "parse_recipe",
    "recipe_digest",
]
_HOME = {name: "catalog" for name in __all__} | {"Recipe": "schema", "builtin_recipes_dir": "index"}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
