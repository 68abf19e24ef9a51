"""fleet.prune.unused: what prune removes, keeps, and names as left alone (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorless_deploy.facts.values import ToolState
from tensorless_deploy.fleet.prune import unused
from tensorless_deploy.recipe.catalog import Catalog
from tests.test_plan import make_entry, survey_facts, tiny_path

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

__all__ = ["tiny_path"]

OTHER_ENGINE = "registry.example.net/other-engine@sha256:" + "1" * 64
PAUSE = "localhost/podman-pause@sha256:" + "2" * 64
OPERATORS = "docker.io/library/nginx@sha256:" + "3" * 64


def test_images_left_alone_are_named_but_not_podmans_own_pause_image(tiny_path: Path) -> None:
    """After kube play, podman holds its infra image (localhost/podman-pause): prune once named
    it among the images it leaves alone, on every host that ever played a pod."""
    entry = make_entry(tiny_path)
    catalog = Catalog(Path("."), (entry,))
    ours = entry.recipe.engine.image
    facts = survey_facts("mixed-p100-t4-podman5")
    tool = (facts.tool or ToolState()).model_copy(
        update={"images": (ours, OTHER_ENGINE, PAUSE, OPERATORS)}
    )
    lists = unused(facts.model_copy(update={"tool": tool}), (), catalog)
    assert lists.images == (ours,)  # no unit uses the catalog's engine: a candidate
    assert lists.other_images == (OTHER_ENGINE, OPERATORS)
