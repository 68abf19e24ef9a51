"""The maintenance window's pure parts (hostplan.maintain, decisions.checks.maintenance_check):
what the record keeps, what the operator is told, and what keeps the units stopped at the end.
The window itself, on real hosts: tests/test_maintain_hosts.py."""

from __future__ import annotations

import pytest

from tensorless_deploy.decisions.checks import Check, maintenance_check
from tensorless_deploy.facts.maintain import HOLD_TEXT, MAINTENANCE_RECORD, hold_dropin
from tensorless_deploy.facts.survey import build_host_facts
from tensorless_deploy.facts.values import (
    LABEL_CARD,
    LABEL_HEALTH,
    LABEL_MODEL,
    DeployedUnit,
    DriverModule,
    DriverPackages,
    GpuReport,
    HostFacts,
    MaintenanceRecord,
)
from tensorless_deploy.hostplan.maintain import (
    ending,
    held_units,
    new_record,
    record_text,
    to_start,
    update_hint,
)

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

HEALTH = "http://127.0.0.1:8080/health"


def _facts(driver: str = "535.183.01", packages: DriverPackages | None = None) -> HostFacts:
    return build_host_facts(
        gpus=GpuReport(state="no_devices"),
        module=DriverModule(loaded=True, version=driver, flavour="proprietary", text=""),
        driver_packages=packages,
    )


def _unit(name: str, active: str) -> DeployedUnit:
    labels = {LABEL_MODEL: "tensorless-test/tiny-llama-GGUF", LABEL_CARD: "p100"}
    return DeployedUnit(
        name=name,
        kind="quadlet",
        active=active,
        unit_labels={**labels, LABEL_HEALTH: HEALTH},
        container_labels={},
        image=None,
        image_id=None,
        health=200,
        path=f"/etc/containers/systemd/{name}.container",
    )


def test_the_record_keeps_the_driver_and_every_unit_and_reads_back() -> None:
    units = [_unit("tensorless-tiny-p100", "active"), _unit("tensorless-tiny-p100-1", "failed")]
    rec = new_record(_facts(), units, "2026-05-01T09:30:00Z", "ops@controller")
    assert rec.driver == "535.183.01" and rec.flavour == "proprietary"
    assert [u.name for u in rec.units] == ["tensorless-tiny-p100", "tensorless-tiny-p100-1"]
    assert rec.units[0].health_url == HEALTH and rec.units[0].card == "p100"
    assert MaintenanceRecord.model_validate_json(record_text(rec)) == rec
    # only what ran when the window began starts again at its end
    assert [u.name for u in to_start(rec)] == ["tensorless-tiny-p100"]
    assert held_units([]) == ()


def test_the_hold_is_a_condition_on_the_record() -> None:
    assert f"ConditionPathExists=!{MAINTENANCE_RECORD}" in HOLD_TEXT.splitlines()
    assert hold_dropin("tensorless-tiny-p100.service") == (
        "/etc/systemd/system/tensorless-tiny-p100.service.d/50-tensorless-maintenance.conf"
    )


def test_the_operator_is_told_how_to_update_within_the_branch() -> None:
    apt = DriverPackages(
        manager="apt",
        packages={"nvidia-driver": "535.183.01-1", "libcuda1": "535.183.01-1", "x": "1"},
    )
    hint = update_hint(_facts(packages=apt), 535)
    assert "within branch 535" in hint
    assert "sudo apt-get install --only-upgrade libcuda1 nvidia-driver" in hint
    dnf = DriverPackages(manager="dnf", packages={"nvidia-driver": "3:535.183.01-1.el9"})
    assert "dnf versionlock delete nvidia-driver" in update_hint(_facts(packages=dnf), 535)
    assert "with its installer" in update_hint(_facts(), 535)  # a .run install: no package


def test_the_end_is_kept_by_failed_checks_but_not_by_the_window_or_the_recipe_state() -> None:
    rec = MaintenanceRecord(began="t", by="b", driver="535.183.01")
    window = maintenance_check(rec)
    assert window.status == "fail" and "maintain end" in (window.fix or "")
    draft = Check("recipe.state", "fail", "draft")
    warn = Check("card.pcie", "warn", "x16 at gen 1")
    e = ending(rec, _facts("535.216.03"), [window, draft, warn])
    assert e.blocking == () and not e.branch_changed
    assert e.driver_line() == "535.183.01 -> 535.216.03"
    branch = Check("driver.branch", "fail", "590.44.01 is past 580", "install the 580 branch")
    e = ending(rec, _facts("590.44.01"), [window, branch, branch])
    assert e.blocking == (branch,) and e.branch_changed
    assert "prepare locks the new one" in e.driver_line()
    assert ending(rec, _facts("535.183.01"), []).driver_line() == "535.183.01 (unchanged)"
