"""prepare's pure part: which failed checks map to which operations (with which arguments), what
stops a host, what is left to the operator, where the toolkit comes from, and the dry-run
listing. Host facts are the fact scenarios' real parser output, patched per case; the plan is
the product's own (hostplan.plan), as every command computes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.operation import OperationMeta

from tensorless_deploy.cli.prepare import print_prepare
from tensorless_deploy.decisions.options import Options
from tensorless_deploy.errors import InventoryError, UsageError
from tensorless_deploy.facts.values import HostFacts
from tensorless_deploy.fleet.prepare import PrepareResult, _result, _step_results, result_json
from tensorless_deploy.hostplan.plan import HostPlan, plan_host, readiness
from tensorless_deploy.hostplan.prepare import (
    DOCKER_NEVER,
    LEFT_WHY,
    NVIDIA_TOOLKIT_REPO,
    STEP_ORDER,
    HostPrep,
    Step,
    ToolkitSource,
    driver_need,
    prepare_host,
    toolkit_source,
)
from tensorless_deploy.operations.prepare import OPERATIONS
from tensorless_deploy.recipe import load_catalog
from tensorless_deploy.recipe.catalog import Entry
from tensorless_deploy.recipe.schema import Recipe
from tests.recipe_tools import example

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

TESTS = Path(__file__).parent
P100_A = "GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90"
P100_B = "GPU-a7d41c9e-2b35-4f86-8e1a-5c9b0d3e6f21"
T4 = "GPU-5e0b9d72-8c14-43a6-b2f9-0a6d1c7e3b58"
# every node of the mixed host linked: the base case has no gpu.char_links warning
ALL_LINKED = {
    "devices": {
        "char_links": [{"major": 195, "minor": m, "target": f"/dev/nvidia{m}"} for m in (0, 1, 2)]
        + [
            {"major": 195, "minor": 255, "target": "/dev/nvidiactl"},
            {"major": 508, "minor": 0, "target": "/dev/nvidia-uvm"},
            {"major": 508, "minor": 1, "target": "/dev/nvidia-uvm-tools"},
        ]
    }
}
NO_TOOLKIT = {"toolkit": {"present": False, "version": None, "version_text": ""}}


def _merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        return {k: _merge(base.get(k), patch[k]) if k in patch else base[k] for k in base | patch}
    return patch


def facts(*patches: dict[str, Any]) -> HostFacts:
    data = json.loads((TESTS / "facts" / "survey" / "mixed-p100-t4-podman5.json").read_text())
    data = data["expected"]
    for p in (ALL_LINKED, *patches):
        data = _merge(data, p)
    return HostFacts.model_validate(data)


def plan_for(f: HostFacts, options: Options | None = None, *, model: bool = False) -> HostPlan:
    opts = options or Options(port=8081)  # the surveyed host listens on 8080 itself
    if not model:
        return readiness("gpu1", f, load_catalog(), opts)
    recipe = Recipe.model_validate(example())
    entry = Entry(f"{recipe.model.hf_repo}/p100.toml", recipe)
    return plan_host("gpu1", f, [entry], opts, sizing=None)


def prep(f: HostFacts, options: Options | None = None, **kw: Any) -> HostPrep:
    model = kw.pop("model", False)
    return prepare_host(plan_for(f, options, model=model), f, kw.pop("toolkit", ToolkitSource()))


def test_every_step_has_its_operation_and_runs_in_a_fixed_order() -> None:
    assert list(OPERATIONS) == list(STEP_ORDER)


def test_a_ready_host_gets_only_the_models_directory() -> None:
    p = prep(facts())
    assert p.stop is None and p.left == ()
    assert p.steps == (
        Step(
            "disk.model",
            "models directory /var/lib/tensorless/models: root-owned, mode 0755",
            {"path": "/var/lib/tensorless/models", "selinux_label": False},
        ),
    )


def test_gateway_adds_haproxy_after_the_host_is_ready_and_only_when_asked() -> None:
    f = facts()
    assert "gateway.haproxy" not in [s.check for s in prep(f).steps]
    p = prepare_host(plan_for(f), f, ToolkitSource(), gateway=True)
    assert [s.check for s in p.steps] == ["disk.model", "gateway.haproxy"]
    assert "at least 2.6" in p.steps[-1].action and p.left == ()


def test_no_toolkit_installs_it_then_generates_the_spec_for_every_gpu() -> None:
    p = prep(facts(NO_TOOLKIT))
    assert p.checks == ("toolkit.present", "toolkit.cdi", "disk.model")
    toolkit, cdi, _ = p.steps
    assert toolkit.args == {
        "repo_url": NVIDIA_TOOLKIT_REPO,
        "key_url": f"{NVIDIA_TOOLKIT_REPO}/gpgkey",
        "version": None,
    }
    assert "newest from https://nvidia.github.io/libnvidia-container" in toolkit.action
    # readiness: every GPU of the host must be addressable
    assert cdi.args == {"driver_version": "535.183.01", "gpu_uuids": (P100_A, P100_B, T4)}


def test_with_a_model_the_spec_must_address_the_cards_it_serves_on() -> None:
    p = prep(facts(NO_TOOLKIT), model=True)
    cdi = next(s for s in p.steps if s.check == "toolkit.cdi")
    assert cdi.args["gpu_uuids"] == (P100_A, P100_B)


def test_a_pinned_mirror_reaches_the_toolkit_operation() -> None:
    source = ToolkitSource("http://10.0.0.1:8000/nvidia", None, "1.17.8-1")
    (toolkit,) = (
        s for s in prep(facts(NO_TOOLKIT), toolkit=source).steps if s.check.startswith("toolkit.p")
    )
    assert toolkit.args == {
        "repo_url": "http://10.0.0.1:8000/nvidia",
        "key_url": "http://10.0.0.1:8000/nvidia/gpgkey",
        "version": "1.17.8-1",
    }


def test_stale_spec_is_regenerated() -> None:
    stale = {"cdi": {"stale": ["/etc/cdi/nvidia.yaml"]}}
    assert prep(facts(stale)).checks == ("toolkit.cdi", "disk.model")


def test_missing_uvm_and_links_the_links_step_links_the_new_nodes_too() -> None:
    nodes = facts()
    assert nodes.devices is not None
    without_uvm = [n.model_dump() for n in nodes.devices.nodes if "uvm" not in n.path]
    p = prep(facts({"devices": {"nodes": without_uvm, "char_links": []}}))
    assert p.checks == ("gpu.uvm", "gpu.char_links", "disk.model")
    assert p.steps[1].args == {"nodes_pending": True}
    only_links = prep(facts({"devices": {"char_links": []}}))
    assert only_links.checks == ("gpu.char_links", "disk.model")
    assert only_links.steps[0].args == {"nodes_pending": False}


def test_selinux_enforcing_sets_the_boolean_and_labels_the_models_directory() -> None:
    p = prep(facts({"selinux": {"mode": "enforcing", "container_use_devices": False}}))
    assert p.checks == ("selinux.devices", "disk.model")
    assert p.steps[1].args == {"path": "/var/lib/tensorless/models", "selinux_label": True}
    assert "container_ro_file_t" in p.steps[1].action


NO_ENGINE = {"engines": {"podman": {"present": False, "version": None, "version_text": ""}}}


def test_no_engine_gets_podman_never_docker() -> None:
    assert prep(facts(NO_ENGINE)).checks[0] == "engine.present"
    asked_docker = prep(facts(NO_ENGINE), Options(port=8081, engine="docker"))
    assert "engine.present" not in asked_docker.checks
    (left,) = asked_docker.left
    assert left.check.id == "engine.present" and left.why == DOCKER_NEVER


DOCKER_ONLY = {
    "engines": {
        "podman": {"present": False, "version": None, "version_text": ""},
        "docker": {"present": True, "version": [28, 2, 2], "version_text": "28.2.2"},
    }
}


def test_docker_hosts_get_the_toolkit_but_no_cdi_spec() -> None:
    assert prep(facts(DOCKER_ONLY, NO_TOOLKIT)).checks == ("toolkit.present", "disk.model")


def test_the_docker_runtime_and_a_taken_port_are_left_to_the_operator() -> None:
    runtime = _merge(DOCKER_ONLY, {"engines": {"docker": {"runtimes": ["runc"]}}})
    p = prep(facts(runtime), Options(port=8080))
    assert p.checks == ("disk.model",)
    assert {x.check.id: x.why for x in p.left} == {
        "toolkit.docker_runtime": LEFT_WHY["toolkit.docker_runtime"],
        "port.free": LEFT_WHY["port.free"],
    }
    assert all(x.check.fix for x in p.left)  # doctor's own fix travels with it


def test_no_driver_stops_the_host_naming_the_driver_the_recipes_need() -> None:
    no_smi = {"gpus": {"state": "absent", "gpus": [], "exit_code": 127, "message": ""}}
    f = facts(no_smi, NO_TOOLKIT)
    need = driver_need([e.recipe for e in load_catalog().entries])
    p = prepare_host(plan_for(f), f, ToolkitSource(), need)
    assert p.steps == () and p.stop is not None
    assert p.stop.startswith("driver.present: nvidia-smi not found")
    assert f"need NVIDIA driver {need} or newer" in p.stop
    assert "never installs or changes a driver" in p.stop and "\n" not in p.stop


def test_an_old_driver_stops_the_host_with_the_recipe_minimum() -> None:
    recipe = Recipe.model_validate(example())
    f = facts()
    old = f.model_copy(
        update={
            "gpus": f.gpus.model_copy(
                update={
                    "gpus": tuple(
                        g.model_copy(update={"driver_version": "515.105.01"}) for g in f.gpus.gpus
                    )
                }
            )
        }
    )
    plan = plan_host("gpu1", old, [Entry("x/p100.toml", recipe)], Options(), sizing=None)
    p = prepare_host(plan, old, ToolkitSource(), driver_need([recipe]))
    assert p.stop is not None and p.stop.startswith("driver.version: driver 515.105.01")
    assert f"{recipe.card.min_driver} (p100)" in p.stop


def test_driver_need_lists_each_card_once() -> None:
    recipe = Recipe.model_validate(example())
    assert driver_need([recipe, recipe]) == f"{recipe.card.min_driver} ({recipe.card.id})"
    assert driver_need([]) == "any"


def test_toolkit_source_flag_over_host_data_over_nvidia() -> None:
    data = {
        "tensorless_toolkit_repo": "http://mirror.lan/nvidia/",
        "tensorless_toolkit_version": "1.17.8-1",
    }
    assert toolkit_source({}, None, "h") == ToolkitSource()
    from_data = toolkit_source({}, data, "h")
    assert from_data == ToolkitSource("http://mirror.lan/nvidia", None, "1.17.8-1")
    assert from_data.key_url == "http://mirror.lan/nvidia/gpgkey"
    flagged = toolkit_source({"version": "1.18.0-1", "key": "https://keys.lan/k.asc"}, data, "h")
    assert flagged == ToolkitSource(
        "http://mirror.lan/nvidia", "https://keys.lan/k.asc", "1.18.0-1"
    )


def test_toolkit_source_refuses_bad_values_naming_flag_or_host_and_key() -> None:
    with pytest.raises(InventoryError, match=r"gpu7: tensorless_toolkit_version: must be"):
        toolkit_source({}, {"tensorless_toolkit_version": "1.17; rm -rf /"}, "gpu7")
    with pytest.raises(InventoryError, match="tensorless_toolkit_repo"):
        toolkit_source({}, {"tensorless_toolkit_repo": "ftp://x"}, "gpu7")
    with pytest.raises(UsageError, match=r"--toolkit-repo http://a b"):
        toolkit_source({"repo": "http://a b"}, None, "")


def _meta(will_change: bool) -> OperationMeta:
    return OperationMeta("hash", is_change=will_change)


def test_dry_run_lists_each_step_with_would_change_or_no_change() -> None:
    p = prep(facts(NO_TOOLKIT))
    metas = {"toolkit.present": _meta(True), "toolkit.cdi": _meta(True), "disk.model": _meta(False)}
    steps = _step_results(p, metas, dry=True)
    assert [(s.check, s.outcome) for s in steps] == [
        ("toolkit.present", "would change"),
        ("toolkit.cdi", "would change"),
        ("disk.model", "no change"),
    ]
    result = _result(p, steps, dry=True)
    assert result.outcome == "would change" and result.ok and result.log is None
    converged = _result(p, _step_results(p, dict.fromkeys(metas, _meta(False)), dry=True), True)
    assert converged.outcome == "no change"


def test_dry_run_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    p = prep(facts(NO_TOOLKIT), Options(port=8080))
    steps = _step_results(p, {s.check: _meta(True) for s in p.steps}, dry=True)
    result = _result(p, steps, dry=True)
    print_prepare([result], verbose=0)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "gpu1: would change"
    assert out[1].startswith("  toolkit.present: would change  NVIDIA Container Toolkit newest")
    assert out[2].startswith(
        "  toolkit.cdi: would change  CDI spec generated for driver 535.183.01"
    )
    assert out[3].startswith("  disk.model: would change  models directory")
    assert out[4].startswith("  left to you: port.free (fail): 127.0.0.1:8080 is taken")
    assert out[5].startswith("    prepare never stops what holds a port; fix: ")
    doc = result_json(result)
    assert doc["outcome"] == "would change" and doc["ok"] is True
    assert [s["check"] for s in doc["steps"]] == ["toolkit.present", "toolkit.cdi", "disk.model"]
    assert doc["left"][0]["id"] == "port.free" and doc["left"][0]["fix"]


def test_a_skipped_host_is_not_ok() -> None:
    assert not PrepareResult("h", "skipped", "driver.present: ...").ok
    assert not PrepareResult("h", "failed", "toolkit.present failed: ...").ok
