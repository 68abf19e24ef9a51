"""A unit of another model is never replaced: the host plan refuses it before any change
(unit.owner), and unit-install.sh itself refuses it (the public @deploy, any older catalog)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tensorless_deploy import shell
from tensorless_deploy.facts.values import ToolState, ToolUnit
from tensorless_deploy.hostplan.plan import plan_host
from tensorless_deploy.recipe.catalog import unit_name
from tests.test_memory import _options
from tests.test_plan import FREE_PORT, make_entry, survey_facts, tiny_path

__all__ = ["tiny_path"]

OTHER = "co-ll/x"


def _install(tmp_path: Path, model: str, existing: str | None) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "tensorless-co-ll-p100.container"
    new = tmp_path / ".tensorless-co-ll-p100.container.tensorless-new"
    new.write_text(f'Label="io.tensorless.model={model}"\n')
    if existing is not None:
        path.write_text(f'[Container]\nLabel="io.tensorless.model={existing}"\n')
    script = shell.bind(
        shell.load("tensorless_deploy.operations", "unit-install"),
        path=str(path),
        new=str(new),
        sha="0" * 64,
        model=model,
    )
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)


def test_the_install_script_never_replaces_another_models_unit(tmp_path: Path) -> None:
    proc = _install(tmp_path, "co.ll/x", OTHER)
    assert proc.returncode == 1
    assert f"it serves {OTHER}, not co.ll/x" in proc.stderr
    unit = tmp_path / "tensorless-co-ll-p100.container"
    assert OTHER in unit.read_text()  # the old unit is as it was
    assert not (tmp_path / ".tensorless-co-ll-p100.container.tensorless-new").exists()
    assert not (tmp_path / "tensorless-co-ll-p100.container.tensorless-prev").exists()


def test_the_install_script_replaces_its_own_models_unit_whatever_the_case(tmp_path: Path) -> None:
    proc = _install(tmp_path, "Co.LL/X", "co.ll/x")
    assert proc.returncode == 0, proc.stderr
    assert "Co.LL/X" in (tmp_path / "tensorless-co-ll-p100.container").read_text()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert _install(fresh, "co.ll/x", None).returncode == 0  # nothing there yet


def test_the_host_plan_refuses_a_unit_name_another_model_serves(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    name = unit_name(entry.recipe)
    facts = survey_facts("mixed-p100-t4-podman5")
    unit = ToolUnit(
        path=f"/etc/containers/systemd/{name}.container",
        name=name,
        kind="quadlet",
        sha256="0" * 64,
        labels={"io.tensorless.model": OTHER, "io.tensorless.port": str(FREE_PORT)},
        health=200,
    )
    facts = facts.model_copy(
        update={"tool": (facts.tool or ToolState()).model_copy(update={"units": (unit,)})}
    )
    plan = plan_host("mixed", facts, [entry], _options(), sizing=None, units=False)
    assert not plan.ok
    owner = next(c for c in plan.failed() if c.id == "unit.owner")
    assert OTHER in owner.evidence and entry.recipe.model.hf_repo in owner.evidence
    assert owner.fix is not None and f"stop {OTHER}" in owner.fix
    assert all(u.name != name for u in plan.surplus)
