"""bench over an inventory judges each unit by the recipe of its own card: on a mixed fleet an
H200 instance is never compared with the P100 receipt, and a unit whose card has no recipe is
refused rather than compared (fleet.status.unit_recipe)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tensorless_deploy.facts.values import LABEL_CARD, LABEL_MODEL, DeployedUnit
from tensorless_deploy.fleet.status import model_units, unit_recipe
from tensorless_deploy.recipe.catalog import Entry, load_catalog

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent


def _entries() -> list[Entry]:
    p100 = load_catalog(REPO / "recipes").entries[0]
    card = p100.recipe.card.model_copy(update={"id": "h200"})
    h200 = replace(
        p100,
        path=p100.path.replace("p100", "h200"),
        recipe=p100.recipe.model_copy(update={"card": card}),
    )
    return [p100, h200]


def _unit(name: str, labels: dict[str, str], *, running: bool = True) -> DeployedUnit:
    return DeployedUnit(
        name=name,
        kind="quadlet",
        active="active",
        unit_labels=labels,
        container_labels=labels if running else {},
        image=None,
        image_id=None,
        health=200,
    )


def test_each_unit_is_judged_by_the_recipe_of_its_own_card() -> None:
    p100, h200 = _entries()
    repo = p100.recipe.model.hf_repo
    units = [
        _unit("tensorless-pn3-p100", {LABEL_MODEL: repo, LABEL_CARD: "p100"}),
        _unit("tensorless-pn3-h200", {LABEL_MODEL: repo, LABEL_CARD: "h200"}, running=False),
    ]
    # the model label matches both cards' units: the card label decides the receipt
    assert [u.name for u in model_units(units, [p100])] == [u.name for u in units]
    assert [unit_recipe(u, [p100, h200]) for u in units] == [p100, h200]


def test_a_unit_whose_card_has_no_recipe_is_refused_not_compared() -> None:
    p100, _ = _entries()
    repo = p100.recipe.model.hf_repo
    why = unit_recipe(_unit("tensorless-pn3-h200", {LABEL_MODEL: repo, LABEL_CARD: "h200"}), [p100])
    assert why == (
        "tensorless-pn3-h200 serves card h200, for which the catalog has no recipe of this "
        "model (recipes for: p100): not compared"
    )
    bare = unit_recipe(_unit("tensorless-pn3-p100", {LABEL_MODEL: repo}), [p100])
    assert isinstance(bare, str) and f"carries no {LABEL_CARD} label" in bare
