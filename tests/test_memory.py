"""The one memory verdict (decisions.memory, applied by the host plan): plan, doctor and deploy
refuse the same cards with the same numbers, and what a model's own running instances hold on
a card is free when that model is planned again."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tensorless_deploy.decisions.memory import MEMORY_CHECK
from tensorless_deploy.decisions.options import Flags, Options, resolve
from tensorless_deploy.errors import UsageError
from tensorless_deploy.facts.parsers import parse_gpu_apps
from tensorless_deploy.facts.values import GpuApp, HostFacts, ToolState, ToolUnit
from tensorless_deploy.gguf.sizing import SizingProblem, sizings
from tensorless_deploy.hostplan.doctor import host_report
from tensorless_deploy.hostplan.placement import plan_model
from tensorless_deploy.hostplan.plan import HostPlan, SurveyedHost, plan_host
from tensorless_deploy.recipe.catalog import Catalog, Entry, unit_name
from tests.test_plan import FREE_PORT, MiB, headers_for, make_entry, survey_facts, tiny_path

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

__all__ = ["tiny_path"]  # the module fixture, shared with test_plan

# mixed-p100-t4-podman5: P100 0 empty, P100 1 with 15876 of 16384 MiB used, a T4 (7.5)
P100_0 = "GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90"
P100_1 = "GPU-a7d41c9e-2b35-4f86-8e1a-5c9b0d3e6f21"


def _options(**kw: object) -> Options:
    return dataclasses.replace(Options(port=FREE_PORT), **kw)  # type: ignore[arg-type]


def _plan(entry: Entry, tiny: Path, facts: HostFacts, **kw: object) -> HostPlan:
    sized = sizings([(entry.path, entry.recipe)], headers_for(entry, tiny))
    return plan_host("mixed", facts, [entry], _options(**kw), sizing=sized, units=False)


def _check(plan: HostPlan) -> str:
    c = next(c for c in plan.verdict.checks if c.id == MEMORY_CHECK)
    return f"{c.status}: {c.evidence}"


def test_gpu_apps_read_from_the_survey_section() -> None:
    out = (
        f"@app {P100_1} 4242 15874 -\n"
        f"@app {P100_0} 977 12000 tensorless-tiny-p100\n"
        f"@app {P100_0} 978 [N/A] -\n"  # MIG and some drivers: nothing to count
    )
    apps = parse_gpu_apps(out, 0)
    assert apps == (
        GpuApp(gpu_uuid=P100_1, pid=4242, used_mib=15874, container=None),
        GpuApp(gpu_uuid=P100_0, pid=977, used_mib=12000, container="tensorless-tiny-p100"),
    )
    assert parse_gpu_apps("", 0) == ()
    assert parse_gpu_apps("NVIDIA-SMI has failed", 3) is None  # unknown, not "none"
    assert parse_gpu_apps("", 124) is None  # nvidia-smi hung: gpu.responsive names it


def test_a_full_card_gets_no_instance_and_every_command_says_why_with_the_same_numbers(
    tiny_path: Path,
) -> None:
    entry = make_entry(tiny_path)
    facts = survey_facts("mixed-p100-t4-podman5")
    plan = _plan(entry, tiny_path, facts)
    # deploy's and doctor's plan: an instance on GPU 0 only
    assert [i.gpus[0].index for i in plan.instances] == [0]
    assert plan.ok
    full = plan.fit(1)
    assert full is not None and full.fits is False and full.why is not None
    assert "usable" in full.why and "MiB" in full.why
    check = _check(plan)
    assert check.startswith("warn: ") and full.why in check and "no instance there" in check
    # plan's rows: the same verdict, the same words
    sized = sizings([(entry.path, entry.recipe)], headers_for(entry, tiny_path))
    assert sized
    mp = plan_model(
        "tiny",
        [entry],
        [SurveyedHost("mixed", _options(), facts)],
        headers_for(entry, tiny_path),
    )
    rows = {p.gpu.index: p for p in mp.placements if p.gpu}
    assert rows[0].ok and rows[0].unit == plan.instances[0].name
    assert not rows[1].ok and rows[1].error == full.why
    # doctor: the same plan
    catalog = Catalog(Path("."), (entry,))
    report = host_report(SurveyedHost("mixed", _options(), facts), catalog, ["plan"], sized)
    assert report.ok
    assert _check(report.plans[0]) == check


def test_asking_for_the_full_card_is_refused_naming_why(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    facts = survey_facts("mixed-p100-t4-podman5")
    plan = _plan(entry, tiny_path, facts, instances=(1,))
    assert not plan.ok and not plan.instances
    cards = next(c for c in plan.failed() if c.id == "instances.cards")
    assert "GPU 1 does not fit" in cards.evidence
    plan2 = _plan(entry, tiny_path, facts, instances=2)
    assert not plan2.ok
    assert "GPU 1 does not fit" in next(c for c in plan2.failed()).evidence


def test_a_context_beyond_the_model_is_refused_by_the_host_plan(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    facts = survey_facts("mixed-p100-t4-podman5")
    plan = _plan(entry, tiny_path, facts, context=2**31 - 1)
    assert not plan.ok and not plan.instances
    check = _check(plan)
    assert check.startswith("fail: ") and "context_length" in check
    mp = plan_model(
        "tiny",
        [entry],
        [SurveyedHost("mixed", _options(context=2**31 - 1), facts)],
        headers_for(entry, tiny_path),
    )
    assert not mp.placed


def test_the_context_option_has_the_schemas_bound() -> None:
    with pytest.raises(UsageError, match="at most 2,147,483,647"):
        resolve(Flags(context=3_000_000_000))
    assert resolve(Flags(context=2**31 - 1)).context == 2**31 - 1


def _with_own_instance(facts: HostFacts, entry: Entry, container: str, mib: int) -> HostFacts:
    """GPU 0 filled by one compute process in `container` (a unit of the model, or not)."""
    gpus = facts.gpus.model_copy(
        update={
            "gpus": tuple(
                g.model_copy(update={"memory_used_mib": mib + 2}) if g.index == 0 else g
                for g in facts.gpus.gpus
            )
        }
    )
    base = unit_name(entry.recipe)
    unit = ToolUnit(
        path=f"/etc/containers/systemd/{base}.container",
        name=base,
        kind="quadlet",
        sha256="0" * 64,
        labels={"io.tensorless.model": entry.recipe.model.hf_repo},
        health=200,
    )
    tool = (facts.tool or ToolState()).model_copy(update={"units": (unit,)})
    apps = (GpuApp(gpu_uuid=P100_0, pid=4242, used_mib=mib, container=container),)
    return facts.model_copy(update={"gpus": gpus, "tool": tool, "gpu_apps": apps})


def test_memory_held_by_the_models_own_instance_is_free_when_it_is_planned_again(
    tiny_path: Path,
) -> None:
    entry = make_entry(tiny_path)
    facts = survey_facts("mixed-p100-t4-podman5")
    own = _with_own_instance(facts, entry, unit_name(entry.recipe), 16000)
    plan = _plan(entry, tiny_path, own)
    fit = plan.fit(0)
    assert fit is not None and fit.fits and fit.memory is not None
    assert fit.memory.own == 16000 * MiB
    assert [i.gpus[0].index for i in plan.instances] == [0]
    # the same memory held by a process that is not one of the model's instances: refused
    foreign = _with_own_instance(facts, entry, "someone-elses-container", 16000)
    plan = _plan(entry, tiny_path, foreign)
    fit = plan.fit(0)
    assert fit is not None and fit.fits is False and fit.memory is not None
    assert fit.memory.own == 0
    assert not plan.ok and _check(plan).startswith("fail: ")
    assert "held by other processes" in _check(plan)


def test_a_header_that_cannot_be_read_is_a_warning_not_a_guess(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    facts = survey_facts("mixed-p100-t4-podman5")
    pending = {entry.path: SizingProblem("pending", "GGUF header of x not readable yet: HTTP 503")}
    plan = plan_host("mixed", facts, [entry], _options(), sizing=pending, units=False)
    assert [i.gpus[0].index for i in plan.instances] == [0, 1]  # nothing judged, nothing hidden
    assert _check(plan).startswith("warn: not sized: GGUF header of x not readable yet")
    # memory not judged at all (status, prepare): no memory row
    plan = plan_host("mixed", facts, [entry], _options(), sizing=None, units=False)
    assert all(c.id != MEMORY_CHECK for c in plan.verdict.checks)
