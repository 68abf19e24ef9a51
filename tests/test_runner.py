"""The one pyinfra runner's result mapping (fleet.runner): a step that did not run fails its host
in every runner (deploy, prepare, stop/rollback/prune through apply_steps), and a dry run's steps
say what a real run would do."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.api.command import StringCommand
from pyinfra.api.operation import OperationMeta
from pyinfra.connectors.util import CommandOutput

from tensorless_deploy.fleet.deploy import _result, _step_results
from tensorless_deploy.fleet.prepare import _result as prepare_result
from tensorless_deploy.fleet.prepare import _step_results as prepare_steps
from tensorless_deploy.fleet.runner import host_outcome, step_result
from tests.test_converge import _plan, _pristine
from tests.test_prepare import NO_TOOLKIT, facts, prep


def _ran(change: bool, ok: bool = True) -> OperationMeta:
    meta = OperationMeta("hash", is_change=None)
    commands = [StringCommand("true")] if change or not ok else []
    meta.set_complete(ok, commands, CommandOutput([]))
    return meta


def _not_run() -> OperationMeta:
    return OperationMeta("later", is_change=True)


def test_the_mapping_of_one_operation() -> None:
    assert step_result("a", _ran(True)).outcome == "changed"
    assert step_result("a", _ran(False)).outcome == "unchanged"
    assert step_result("a", _ran(True, ok=False)).outcome == "failed"
    assert step_result("a", _not_run()).outcome == "not run"
    assert step_result("a", None).outcome == "not run"
    assert step_result("a", _not_run(), dry=True).outcome == "would change"
    assert host_outcome(["changed", "not run"], dry=False) == "failed"
    assert host_outcome(["would change", "no change"], dry=True) == "would change"


def test_a_deploy_host_whose_step_did_not_run_is_failed() -> None:
    """deploy called a host "changed" when its image step changed and the rest never ran."""
    plan = _plan(_pristine())
    metas = {"image": _ran(True), "model": _not_run()}
    result = _result(plan, _step_results(metas, dry=False), False, None)
    assert [(s.name, s.outcome) for s in result.steps] == [
        ("image", "changed"),
        ("model", "not run"),
    ]
    assert result.outcome == "failed" and not result.ok
    assert result.reason == "model failed"


def test_a_prepare_host_whose_step_did_not_run_is_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENSORLESS_LOG_DIR", str(tmp_path))
    p = prep(facts(NO_TOOLKIT))
    first, *rest = [s.check for s in p.steps]
    assert rest, "the case needs a step after the first"
    metas = {first: _ran(True), **{c: _not_run() for c in rest}}
    result = prepare_result(p, prepare_steps(p, metas, dry=False), False)
    assert result.outcome == "failed" and not result.ok
    assert result.reason is not None and result.reason.startswith(f"{rest[0]} failed: no output")
    assert result.log is not None and Path(result.log).exists()
