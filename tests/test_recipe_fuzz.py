"""Random recipes: loading either succeeds or raises the project's recipe error, nothing else."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorless_deploy.errors import RecipeError
from tensorless_deploy.recipe import Recipe, load_catalog, parse_recipe
from tests.recipe_tools import example, to_toml, write_recipe

REL = "iamMrDuncan/Qwen3.8-27B-PN3-GGUF/p100.toml"

scalars = st.one_of(
    st.none(),  # stands for "delete this key"
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=80),
    st.sampled_from(["main", "0" * 40, "0" * 64, "-m", "--port=1", "6.0", "a/b", "../x"]),
)
values = st.recursive(
    scalars.filter(lambda v: v is not None),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    return out


ALL_PATHS = _paths(example())


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    data = example()
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(ALL_PATHS))
        node: Any = data
        for part in path[:-1]:
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            if not isinstance(node, dict):
                continue
            action = draw(st.sampled_from(["replace", "delete", "add"]))
            if action == "delete":
                node.pop(path[-1], None)
            elif action == "add":
                node[draw(st.text(min_size=1, max_size=12))] = draw(values)
            else:
                node[path[-1]] = draw(values)
    return data


def _check(text: str) -> None:
    recipe, problems = parse_recipe(text, REL)
    if recipe is None:
        assert problems and all(
            p.startswith(REL + ": ") and "\n" not in p.strip() for p in problems
        )
    else:
        assert isinstance(recipe, Recipe) and problems == []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_values_and_keys(data: dict[str, Any]) -> None:
    try:
        text = to_toml(data)
    except TypeError:
        return
    _check(text)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_toml_text(data: st.DataObject) -> None:
    text = to_toml(example())
    for _ in range(data.draw(st.integers(1, 5))):
        pos = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 8))
        insert = data.draw(st.text(max_size=6))
        text = text[:pos] + insert + text[pos + cut :]
    _check(text)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text(text: str) -> None:
    _check(text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_catalog_load_raises_only_recipe_error(data: dict[str, Any]) -> None:
    try:
        text = to_toml(data)
    except TypeError:
        return
    with tempfile.TemporaryDirectory() as tmp:
        write_recipe(Path(tmp), example())
        path = Path(tmp) / REL
        path.write_text(text, encoding="utf-8")
        try:
            load_catalog(Path(tmp))
        except RecipeError as exc:
            assert exc.problems
