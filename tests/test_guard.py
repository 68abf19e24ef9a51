"""The Pascal guard's tables against the docs: every check id of decisions.guard and
decisions.cards is a row of docs/doctor.md, and its card ceilings table is CEILINGS."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tensorless_deploy.decisions import cards, guard
from tensorless_deploy.decisions.checks import Check
from tensorless_deploy.facts.survey import build_host_facts
from tensorless_deploy.facts.values import DriverModule, DriverPackages, GpuReport
from tests.test_docs import doctor_check_ids

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent


def test_every_guard_check_id_is_documented() -> None:
    ids = {guard.BRANCH, guard.MODULE, guard.ENGINE_CODE, guard.LOCK, "gpu.responsive"}
    ids |= set(cards.HEALTH_CHECKS) | {r.check for r in cards.HEALTH_RULES.values()}
    assert ids - doctor_check_ids() == set()


def test_the_ceilings_table_is_the_code() -> None:
    text = (ROOT / "docs/doctor.md").read_text(encoding="utf-8")
    table = text.split("### Card ceilings", 1)[1].split("\n\n", 3)[2]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    documented = [tuple(cell.strip() for cell in row.strip("|").split("|")) for row in rows[1:]]
    want = [
        (
            c.family,
            f"{c.max_branch} ({c.legacy_name})",
            "proprietary only" if c.proprietary_only else "any",
            f"{c.max_cuda_major}.x at most",
        )
        for c in sorted(cards.CEILINGS, key=lambda c: c.below)
    ]
    assert documented == want


def test_ceilings_apply_below_their_bound() -> None:
    pascal = cards.ceiling_for("6.0")
    assert pascal is not None and pascal.max_branch == 580
    assert cards.ceiling_for("7.0").max_branch == 580  # type: ignore[union-attr]
    assert cards.ceiling_for("3.7").max_branch == 470  # type: ignore[union-attr]
    assert cards.ceiling_for("7.5") is None and cards.ceiling_for("9.0") is None
    assert cards.ceiling_for("garbage") is None


def test_machine_code_runs_on_its_own_major_and_later_minors() -> None:
    assert guard.runs_on(60, (6, 0)) and guard.runs_on(60, (6, 1))
    assert not guard.runs_on(61, (6, 0)) and not guard.runs_on(70, (6, 0))
    assert not guard.runs_on(50, (6, 0))


def test_labels_in_cmake_words() -> None:
    assert guard.label_code({guard.LABEL_CUDA_ARCHS: "60"}) == ({60}, set())
    assert guard.label_code({guard.LABEL_CUDA_ARCHS: "60-virtual"}) == (set(), {60})
    assert guard.label_code({guard.LABEL_CUDA_ARCHS: "50-virtual;61-virtual;86-real"}) == (
        {86},
        {50, 61},
    )
    assert guard.label_code({}) is None
    assert re.fullmatch(r".*@sha256:[0-9a-f]{12}", guard.short_image("r/n@sha256:" + "a" * 64))


def test_other_branches_is_every_three_digit_number_but_the_branch() -> None:
    for branch in (100, 470, 535, 580, 590, 909, 999):
        other = re.compile(guard._other_branches(branch))
        matched = {n for n in range(100, 1000) if other.fullmatch(str(n))}
        assert matched == set(range(100, 1000)) - {branch}, branch


def _lock(packages: dict[str, str], **seen: object) -> Check | None:
    facts = build_host_facts(
        gpus=GpuReport(state="no_devices"),
        module=DriverModule(loaded=True, version="535.183.01", flavour="proprietary", text=""),
        driver_packages=DriverPackages.model_validate(
            {"manager": "apt", "packages": packages, **seen}
        ),
    )
    return guard.driver_lock_check(facts)


def test_driver_lock_reads_pin_holds_and_locks() -> None:
    pkgs = {"nvidia-driver": "535.183.01-1", "libcuda1": "535.183.01-1", "nvidia-ctk": "1.18.0-1"}
    pin = guard.apt_pin(("libcuda1", "nvidia-driver"), 535)
    assert (c := _lock(pkgs)) is not None and c.status == "warn" and "prepare" in (c.fix or "")
    assert (c := _lock(pkgs, pin=pin)) is not None and c.status == "ok", c
    assert "pinned to branch 535" in c.evidence
    assert (c := _lock(pkgs, pin=guard.apt_pin(("nvidia-driver",), 535))) is not None
    assert c.status == "warn" and "does not cover" in c.evidence
    assert (c := _lock(pkgs, held=["libcuda1", "nvidia-driver"])) is not None and c.status == "ok"
    assert (c := _lock(pkgs, held=["nvidia-driver"])) is not None and c.status == "warn"
    assert _lock({"nvidia-ctk": "1.18.0-1"}) is None  # the driver is no package: nothing to lock


def test_dnf_lock_lines_name_their_package_only() -> None:
    assert guard.dnf_locks("nvidia-driver-3:580.65.06-1.el9.*", "nvidia-driver")
    assert not guard.dnf_locks("nvidia-driver-libs-3:580.65.06-1.el9.*", "nvidia-driver")
    assert guard.dnf_locks('name = "nvidia-driver"', "nvidia-driver")  # dnf 5's toml
    assert not guard.dnf_locks('name = "nvidia-driver-libs"', "nvidia-driver")
