"""Data-only decision scenarios: tests/decisions/<case>.json, host facts + recipe + options in,
checks out. Facts come from the fact scenarios' expected values (real parser output), patched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.decisions.options import Options
from tensorless_deploy.facts.values import HostFacts
from tensorless_deploy.hostplan.plan import HostPlan, plan_host, readiness
from tensorless_deploy.recipe import load_catalog
from tensorless_deploy.recipe.catalog import Entry
from tensorless_deploy.recipe.schema import Recipe
from tests.recipe_tools import example

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

TESTS = Path(__file__).parent
CASES = sorted((TESTS / "decisions").glob("*.json"))


def _merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base.get(key), value)
        return out
    return patch


def _facts(spec: dict[str, Any]) -> HostFacts:
    survey = json.loads((TESTS / "facts" / "survey" / f"{spec['survey']}.json").read_text())
    data = _merge(survey["expected"], spec.get("patch", {}))
    if "gpu_driver" in spec:
        for gpu in data["gpus"]["gpus"]:
            gpu["driver_version"] = spec["gpu_driver"]
    return HostFacts.model_validate(data)


def _plan(case: dict[str, Any]) -> HostPlan:
    """The product's own host plan for the case: the one doctor, plan, deploy and run compute."""
    facts = _facts(case["facts"])
    options = Options(**case.get("options", {}))
    if case.get("no_model"):
        return readiness("host", facts, load_catalog(), options)
    recipe = Recipe.model_validate(_merge(example(), case.get("recipe", {})))
    entry = Entry(f"{recipe.model.hf_repo}/{recipe.card.id}.toml", recipe)
    return plan_host("host", facts, [entry], options, sizing=None)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_decision_scenario(path: Path) -> None:
    case = json.loads(path.read_text())
    plan = _plan(case)
    verdict = plan.verdict
    no_card = not case.get("no_model") and plan.entry is None
    want = case["expected"]
    by_id = {c.id: c for c in verdict.checks}
    assert len(by_id) == len(verdict.checks), "check ids are unique per host"
    if "ok" in want:
        assert verdict.ok is want["ok"], [c for c in verdict.checks if c.status != "ok"]
    assert no_card is want.get("no_card", False)
    for check_id, status in want.get("checks", {}).items():
        assert check_id in by_id, (check_id, list(by_id))
        assert by_id[check_id].status == status, by_id[check_id]
    for check_id in want.get("absent_checks", []):
        assert check_id not in by_id
    for check_id, text in want.get("evidence_contains", {}).items():
        assert text in by_id[check_id].evidence, by_id[check_id]
    for check_id, text in want.get("fix_contains", {}).items():
        assert by_id[check_id].fix and text in by_id[check_id].fix, by_id[check_id]
    if "gpu_uuids" in want:
        assert verdict.match is not None and list(verdict.match.uuids) == want["gpu_uuids"]
        served = [u for i in plan.instances for u in i.spec.gpu_uuids]
        assert served == want["gpu_uuids"], "the instances serve exactly the matched cards"
    if "engine" in want:
        assert verdict.engine == want["engine"]
    if "servable" in want:
        assert list(verdict.servable) == want["servable"]
    for check in verdict.checks:
        if check.status != "ok" and check.id not in ("recipe.state",):
            assert check.fix, f"{check.id} is {check.status} without a fix"


def test_every_scenario_file_is_valid() -> None:
    """Every case names only keys the harness reads (a misspelt key would be ignored)."""
    for path in CASES:
        case = json.loads(path.read_text())
        assert set(case) <= {"description", "facts", "options", "recipe", "no_model", "expected"}
        assert set(case["expected"]) <= {
            "ok",
            "no_card",
            "checks",
            "absent_checks",
            "evidence_contains",
            "fix_contains",
            "gpu_uuids",
            "engine",
            "servable",
        }, path


def test_access_root_is_the_first_check_and_only_where_units_are_written() -> None:
    """doctor, deploy and prepare see access.root first; a foreground run (no unit written: a
    container of the operator's own) is not refused for it."""
    case = json.loads((TESTS / "decisions" / "access-plain-user-refused.json").read_text())
    facts = _facts(case["facts"])
    recipe = Recipe.model_validate(example())
    entry = Entry(f"{recipe.model.hf_repo}/{recipe.card.id}.toml", recipe)
    units = plan_host("host", facts, [entry], Options(port=8081), sizing=None)
    assert units.verdict.checks[0].id == "access.root" and not units.ok
    foreground = plan_host("host", facts, [entry], Options(port=8081), sizing=None, units=False)
    assert "access.root" not in [c.id for c in foreground.verdict.checks]
