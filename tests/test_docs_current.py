"""The recipe reference and JSON schema are generated from the models and must be current."""

from __future__ import annotations

import json

import pytest

from tensorless_deploy.cli import docsgen
from tensorless_deploy.recipe.schema import Recipe

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)


def test_generated_docs_are_current() -> None:
    assert docsgen.stale() == [], "run: python -m tensorless_deploy.cli.docsgen --write"


def test_every_field_has_a_description() -> None:
    def walk(model: type) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():  # type: ignore[attr-defined]
            if not field.description:
                missing.append(f"{model.__name__}.{name}")
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                missing += walk(ann)
        return missing

    assert walk(Recipe) == []


def test_json_schema_forbids_unknown_keys() -> None:
    schema = json.loads(docsgen.json_schema())
    assert schema["additionalProperties"] is False
    assert all(d["additionalProperties"] is False for d in schema["$defs"].values())
