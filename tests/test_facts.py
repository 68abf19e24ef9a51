"""Data-only host-fact scenarios: tests/facts/<fact>/<scenario>.json, output in, parsed value out.

A scenario is ``{"description", "args", "expected"}`` or ``{..., "error": "substring"}``. An
argument is a literal, or ``{"file": "fixtures/relative/path"}`` (optionally with ``"section"``
to take one ``## name`` section of a captured host-facts file), or ``{"lines": [...]}`` (joined
with newlines, one after the last), or ``{"concat": [arg, ...]}``. Adding a case adds no code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_core import to_jsonable_python

from tensorless_deploy.facts import maintain, nvidia, parsers
from tensorless_deploy.facts.errors import FactError
from tensorless_deploy.facts.survey import host_facts_from_inventory, host_facts_from_survey
from tensorless_deploy.facts.values import HostFacts, blocking_listeners

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

TESTS = Path(__file__).parent
SCENARIOS = TESTS / "facts"
FIXTURES = TESTS / "fixtures"


def _cdi_report(output: str, driver_version: str | None, gpu_uuids: list[str]) -> Any:
    return parsers.analyse_cdi(parsers.parse_cdi_dump(output), driver_version, gpu_uuids)


def _ports_taken(output: str, port: int, bind_address: str) -> Any:
    return blocking_listeners(parsers.parse_ss(output, 0), port, bind_address)


# One line per fact folder; scenarios inside a folder are pure data.
FACTS: dict[str, Callable[..., Any]] = {
    "nvidia-smi": parsers.parse_nvidia_smi,
    "devices": parsers.nvidia_devices,
    "podman": parsers.parse_podman_version,
    "quadlet": parsers.parse_quadlet_path,
    "docker": parsers.parse_docker_version,
    "nvidia-ctk": parsers.parse_nvidia_ctk_version,
    "cdi-spec": parsers.parse_cdi_spec,
    "cdi": _cdi_report,
    "selinux": parsers.parse_selinux,
    "pid1": parsers.parse_pid1,
    "access": parsers.parse_access,
    "sudo": parsers.parse_sudo,
    "systemctl": parsers.parse_systemd_version,
    "cgroup": parsers.parse_cgroups,
    "nproc": parsers.parse_nproc,
    "df": parsers.parse_df,
    "ss": parsers.parse_ss,
    "ports-taken": _ports_taken,
    "version": parsers.parse_version,
    "tool-state": parsers.parse_tool_state,
    "engine-paths": parsers.parse_engine_paths,
    "nvidia-module": nvidia.parse_module_version,
    "kernel-log": nvidia.parse_kernel_log,
    "nvidia-health": nvidia.parse_health_xml,
    "engine-labels": nvidia.parse_engine_labels,
    "driver-packages": nvidia.parse_driver_packages,
    "maintenance": maintain.parse_maintenance,
    "survey": host_facts_from_survey,
    "inventory": host_facts_from_inventory,
}


def _section(text: str, name: str) -> str:
    """The body of ``## name`` in a captured host-facts file, up to the next ``## ``."""
    out: list[str] = []
    inside = False
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            inside = line[3:].strip() == name
            continue
        if inside:
            out.append(line)
    assert out, f"no section {name!r}"
    return "".join(out)


def resolve(value: Any) -> Any:
    if isinstance(value, dict) and set(value) <= {"file", "section"} and "file" in value:
        text = (TESTS / value["file"]).read_text()
        return _section(text, value["section"]) if "section" in value else text
    if isinstance(value, dict) and set(value) == {"lines"}:
        return "".join(f"{resolve(line)}\n" for line in value["lines"])
    if isinstance(value, dict) and set(value) == {"concat"}:
        return "".join(resolve(part) for part in value["concat"])
    return value


def scenarios(*folders: str, expected_only: bool = False) -> list[Any]:
    paths = sorted(SCENARIOS.glob("*/*.json"))
    return [
        pytest.param(path, id=f"{path.parent.name}/{path.stem}")
        for path in paths
        if (not folders or path.parent.name in folders)
        and (not expected_only or "expected" in json.loads(path.read_text()))
    ]


def test_every_fact_folder_has_a_parser() -> None:
    folders = {p.name for p in SCENARIOS.iterdir() if p.is_dir()}
    assert folders == set(FACTS), "a folder without a parser, or a parser without scenarios"


@pytest.mark.parametrize("path", scenarios())
def test_scenario(path: Path) -> None:
    case = json.loads(path.read_text())
    assert set(case) <= {"description", "args", "expected", "error"}, path
    assert ("expected" in case) != ("error" in case), f"{path}: give expected or error"
    parse = FACTS[path.parent.name]
    args = {name: resolve(value) for name, value in case.get("args", {}).items()}
    if "error" in case:
        with pytest.raises(FactError) as raised:
            parse(**args)
        assert case["error"] in raised.value.message
        return
    got = json.loads(json.dumps(to_jsonable_python(parse(**args))))
    assert got == case["expected"]


@pytest.mark.parametrize("path", scenarios("survey", "inventory", expected_only=True))
def test_host_facts_read_back_from_their_json(path: Path) -> None:
    """A dumped HostFacts (doctor --json, a cache) validates back to the same value."""
    case = json.loads(path.read_text())
    again = HostFacts.model_validate(case["expected"])
    assert json.loads(again.model_dump_json()) == case["expected"]
