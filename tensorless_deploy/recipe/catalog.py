"""Load a recipes directory: path rules, cross-recipe rules, lookup by repo id or short name."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from tensorless_deploy.errors import RecipeError, UnknownModelError, UsageError
from tensorless_deploy.hub import CachePaths, cache_paths, host_state_dir
from tensorless_deploy.recipe.index import builtin_recipes_dir, recipe_files
from tensorless_deploy.recipe.schema import Recipe
from tensorless_deploy.recipe.text import quoted
from tensorless_deploy.shell import UNIT_PREFIX

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 controllers
    import tomli as tomllib


@dataclass(frozen=True)
class Entry:
    """One loaded recipe and where it came from (path relative to the catalog root)."""

    path: str
    recipe: Recipe

    @property
    def digest(self) -> str:
        return recipe_digest(self.recipe)


@dataclass(frozen=True)
class Catalog:
    """Every recipe of one directory, valid as a whole."""

    root: Path
    entries: tuple[Entry, ...]

    def models(self) -> dict[str, list[Entry]]:
        """Entries grouped by repo id (casefolded key), cards sorted."""
        out: dict[str, list[Entry]] = {}
        for e in self.entries:
            out.setdefault(e.recipe.model.hf_repo.casefold(), []).append(e)
        return out

    def find(self, model: str) -> list[Entry]:
        """All cards of MODEL (a repo id in any case, or a short name); unknown models raise."""
        key = model.casefold()
        hits = [
            e
            for e in self.entries
            if e.recipe.model.hf_repo.casefold() == key or e.recipe.model.name == key
        ]
        if not hits:
            names = sorted(
                {e.recipe.model.hf_repo for e in self.entries}
                | {e.recipe.model.name for e in self.entries if e.recipe.model.name}
            )
            raise UnknownModelError(model, closest(key, names))
        return hits

    def find_or_none(self, model: str) -> list[Entry]:
        """find, or no entries when the catalog does not know MODEL (what is deployed on a
        host can still be found there by its label)."""
        try:
            return self.find(model)
        except UnknownModelError:
            return []

    def card(self, model: str, card_id: str) -> Entry:
        """MODEL's recipe for one card; an unknown card names the cards there are."""
        hits = self.find(model)
        for e in hits:
            if e.recipe.card.id == card_id:
                return e
        have = ", ".join(e.recipe.card.id for e in hits)
        raise UsageError(
            f"{hits[0].recipe.model.hf_repo}: no recipe for card {card_id!r} (cards: {have})"
        )


def closest(key: str, names: list[str], n: int = 3) -> list[str]:
    """The names most like key: a substring hit first, then difflib on the whole id and on the
    repo part after the slash (people type "qwen3.8-27b", not the org)."""

    def score(name: str) -> float:
        folded = name.casefold()
        repo = folded.rsplit("/", 1)[-1]
        if key in folded:
            return 1.0 + len(key) / len(folded)
        return max(
            difflib.SequenceMatcher(None, key, folded).ratio(),
            difflib.SequenceMatcher(None, key, repo).ratio(),
        )

    ranked = sorted(((score(name), name) for name in names), key=lambda t: (-t[0], t[1]))
    return [name for s, name in ranked[:n] if s >= 0.6]


_DIGESTS: dict[int, tuple[Recipe, str]] = {}  # id -> (the recipe kept alive, its digest)


def recipe_digest(recipe: Recipe) -> str:
    """Canonical content digest: sha256 of sorted-key, compact JSON of the whole recipe.
    Recipes are immutable, so each one's digest is computed once per process."""
    hit = _DIGESTS.get(id(recipe))
    if hit is not None and hit[0] is recipe:
        return hit[1]
    data = recipe.model_dump(mode="json", by_alias=True)
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = "sha256:" + hashlib.sha256(blob.encode()).hexdigest()
    _DIGESTS[id(recipe)] = (recipe, digest)
    return digest


def model_paths(cache: str, recipe: Recipe) -> CachePaths:
    """Where a recipe's model file lives under a cache directory (hosts: the models directory;
    this machine: its Hugging Face cache), its stamp beside the cache, never in it."""
    m = recipe.model
    return cache_paths(cache, host_state_dir(cache), m.hf_repo, m.revision, m.file, m.sha256)


_TOML_TYPES = {
    str: "a string",
    int: "an integer",
    float: "a float",
    bool: "a boolean",
    list: "an array",
    dict: "a table",
}
_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


def _toml_type(value: Any) -> str:
    for py, name in _TOML_TYPES.items():
        if type(value) is py:
            return name
    return f"a {type(value).__name__}"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return quoted(value)
    if isinstance(value, (dict, list)):
        return _toml_type(value)
    return repr(value)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _dotted(loc: tuple[int | str, ...]) -> str:
    """model.sha256, run.args[2]; a key that is not a bare TOML key is quoted, so a newline or
    other odd character in a key can never break the one-line error."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = part if _BARE_KEY.fullmatch(part) and len(part) <= 80 else quoted(part)
            out += ("." if out else "") + key
    return out or "(top level)"


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the schema has at the table that holds loc[-1]."""
    model: type[BaseModel] = Recipe
    for part in loc[:-1]:
        if not isinstance(part, str):
            return []
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return [f.alias or n for n, f in model.model_fields.items()]


def _problem(err: Any) -> tuple[str, str]:
    loc = tuple(err["loc"])
    kind = err["type"]
    value = err.get("input")
    if kind == "missing":
        return _dotted(loc), "is required"
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc)
        return _dotted(loc), "unknown key (the schema has: " + ", ".join(allowed) + ")"
    if kind == "value_error":
        return _dotted(loc), str(err["ctx"]["error"])
    if kind == "literal_error":
        return _dotted(loc), f"must be {err['ctx']['expected']} ({_show(value)})"
    if kind in _EXPECTED:
        return _dotted(loc), f"must be {_EXPECTED[kind]}, not {_toml_type(value)} ({_show(value)})"
    if kind in ("int_from_float", "int_parsing", "float_parsing"):
        return _dotted(loc), f"must be {_EXPECTED['int_type']} ({_show(value)})"
    return _dotted(loc), f"{err['msg']} ({_show(value)})"


def parse_recipe(text: str, rel: str) -> tuple[Recipe | None, list[str]]:
    """Parse one recipe's TOML text; every problem as 'rel: key: message'."""
    if text.startswith("\ufeff"):  # TOML has no byte-order mark; tomllib only says line 1
        return None, [
            f"{rel}: starts with a UTF-8 byte-order mark (BOM), which TOML does not allow: "
            "save the file as UTF-8 without BOM"
        ]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return None, [f"{rel}: invalid TOML: {exc}"]
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively; a recipe needs two levels
        return None, [f"{rel}: invalid TOML: arrays or inline tables nested too deep"]
    except ValueError as exc:  # an integer beyond Python's int-from-string digit limit
        what = str(exc)
        if "digits" in what:
            what = "an integer with too many digits to read"
        return None, [f"{rel}: invalid TOML: {quoted(what)[1:-1]}"]
    try:
        return Recipe.model_validate(data), []
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key, msg = _problem(err)
            problems.append(f"{rel}: {key}: {msg}")
        return None, problems


def _path_problems(rel: str, recipe: Recipe) -> list[str]:
    parts = rel.split("/")
    if len(parts) != 3:
        return [f"{rel}: recipe files must sit at <org>/<repo>/<card>.toml"]
    problems = []
    repo = f"{parts[0]}/{parts[1]}"
    if repo != recipe.model.hf_repo:
        problems.append(
            f'{rel}: model.hf_repo: must equal the directory "{repo}" '
            f'("{recipe.model.hf_repo}"); move the file or fix the key'
        )
    card = parts[2].removesuffix(".toml")
    if card != recipe.card.id:
        problems.append(
            f'{rel}: card.id: must equal the file name "{card}" ("{recipe.card.id}"); '
            "rename the file or fix the key"
        )
    return problems


def slug(text: str) -> str:
    """A name part of a unit: lowercase letters and digits, runs of anything else one dash."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def unit_name(recipe: Recipe) -> str:
    """The systemd service and container name: tensorless-<short name or repo>-<card>; its
    instances beyond the first add -1, -2, ... (hostplan.plan.instance_name)."""
    stem = recipe.model.name or recipe.model.hf_repo
    return UNIT_PREFIX + slug(f"{stem}-{recipe.card.id}")


_INSTANCE = re.compile(r"(.+)-([0-9]+)")


def _unit_problems(entries: list[Entry]) -> list[str]:
    """Two recipes whose units would have one name (the slug folds case, dots, slashes and
    dashes together, and instances add -N) would replace each other's unit on a host."""
    problems: list[str] = []
    owners: dict[str, Entry] = {}
    fix = "give one of them a model.name of its own (units are named after it)"
    for e in entries:
        name = unit_name(e.recipe)
        owner = owners.setdefault(name, e)
        if owner is not e:
            problems.append(
                f"{e.path}: its unit name {name} is also the unit name of {owner.path}: "
                f"deploying one would replace the other's unit; {fix}"
            )
    for name, e in owners.items():
        m = _INSTANCE.fullmatch(name)
        base = owners.get(m.group(1)) if m else None
        if base is not None and m is not None:
            problems.append(
                f"{e.path}: its unit name {name} is the name of instance {m.group(2)} of "
                f"{base.path} ({m.group(1)}); {fix}"
            )
    return problems


def _cross_problems(entries: list[Entry]) -> list[str]:
    problems: list[str] = []
    spelled: dict[str, Entry] = {}
    names: dict[str, Entry] = {}
    for e in entries:
        m = e.recipe.model
        key = m.hf_repo.casefold()
        first = spelled.setdefault(key, e)
        if first.recipe.model.hf_repo != m.hf_repo:
            problems.append(
                f'{e.path}: model.hf_repo: "{m.hf_repo}" differs only in case from '
                f'"{first.recipe.model.hf_repo}" in {first.path}; use one spelling'
            )
    for e in entries:
        m = e.recipe.model
        if m.name is None:
            continue
        if m.name.casefold() in spelled:
            problems.append(f'{e.path}: model.name: "{m.name}" equals a repo id; choose another')
            continue
        owner = names.setdefault(m.name, e)
        if owner.recipe.model.hf_repo.casefold() != m.hf_repo.casefold():
            problems.append(
                f'{e.path}: model.name: "{m.name}" is already the short name of '
                f"{owner.recipe.model.hf_repo} ({owner.path}); short names are unique across models"
            )
    by_model: dict[str, set[str | None]] = {}
    for e in entries:
        by_model.setdefault(e.recipe.model.hf_repo.casefold(), set()).add(e.recipe.model.name)
    for e in entries:
        declared = by_model[e.recipe.model.hf_repo.casefold()]
        if len(declared) > 1:
            shown = ", ".join(sorted(f'"{n}"' if n else "none" for n in declared))
            problems.append(
                f"{e.path}: model.name: the cards of {e.recipe.model.hf_repo} must share one "
                f"short name (found {shown})"
            )
    if not problems:  # a clash of names above is the cause of any unit-name clash too
        problems.extend(_unit_problems(entries))
    return problems


def load_catalog(root: Path | None = None) -> Catalog:
    """Load every recipe under root (default: built-in); any invalid recipe fails the load."""
    root = builtin_recipes_dir() if root is None else root
    if not root.is_dir():
        raise UsageError(f"{root}: no such recipes directory", fix="pass an existing DIR")
    problems: list[str] = []
    entries: list[Entry] = []
    for rel, path in recipe_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{rel}: cannot read: {exc}")
            continue
        recipe, file_problems = parse_recipe(text, rel)
        problems.extend(file_problems)
        if recipe is not None:
            path_problems = _path_problems(rel, recipe)
            problems.extend(path_problems)
            if not path_problems:
                entries.append(Entry(rel, recipe))
    problems.extend(_cross_problems(entries))
    if problems:
        raise RecipeError(problems)
    return Catalog(root, tuple(entries))
