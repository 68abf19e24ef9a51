"""Layer 1: recipes of schema 1, the loader and the catalog."""

from tensorless_deploy.recipe.catalog import (
    Catalog,
    Entry,
    builtin_recipes_dir,
    load_catalog,
    parse_recipe,
    recipe_digest,
)
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
