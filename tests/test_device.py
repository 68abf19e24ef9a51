"""Is an instance on its card: decisions.device (the controller's reading, for status, run and
the report) and unit-lib.sh's on_card (the host's, which decides whether a new unit stays) judge
the same start logs alike. Data-only cases in tests/decisions/device/; the logs are captured
(tests/fixtures/llama-server/README.md) except the one on a P100, constructed from the pinned
source's format strings."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy import shell
from tensorless_deploy.decisions.device import (
    cuda_bus_id,
    device_verdict,
    expected_device,
    valid_label,
)
from tensorless_deploy.facts.device import DEVICE_LINE, parse_device_log
from tensorless_deploy.facts.parsers import parse_gpu_row
from tensorless_deploy.facts.values import Gpu

TESTS = Path(__file__).parent
CASES = sorted((TESTS / "decisions" / "device").glob("*.json"))
KEYS = {"description", "label", "uuid", "log", "ok", "device", "why", "why_contains"}


def _log(spec: dict[str, Any]) -> list[str]:
    lines = (
        (TESTS / spec["file"]).read_text().splitlines() if "file" in spec else list(spec["lines"])
    )
    for old, new in spec.get("replace", []):
        lines = [x.replace(old, new) for x in lines]
    if "drop" in spec:
        lines = [x for x in lines if spec["drop"] not in x]
    return lines + list(spec.get("append", []))


def _device_lines(lines: list[str]) -> list[str]:
    """What the host scripts keep of a log (grep -E DEVICE_LINE)."""
    proc = subprocess.run(
        ["grep", "-E", DEVICE_LINE],
        input="".join(f"{x}\n" for x in lines),
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.splitlines()


def _on_card(label: str, lines: list[str]) -> bool:
    lib = shell.load("tensorless_deploy.operations", "unit-lib")
    proc = subprocess.run(
        ["sh", "-c", f'{lib}\non_card "$1"', "sh", label],
        input="".join(f"{x}\n" for x in lines),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode == 0


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_device_case(path: Path) -> None:
    case = json.loads(path.read_text())
    assert set(case) <= KEYS, sorted(set(case) - KEYS)
    kept = _device_lines(_log(case["log"]))
    # the Python reading keeps the same lines the host's grep does
    pattern = re.compile(DEVICE_LINE)
    assert kept == [x for x in _log(case["log"]) if pattern.search(x)]
    verdict = device_verdict(case["label"], parse_device_log(kept), case.get("uuid"))
    assert verdict.ok is case["ok"], verdict
    assert verdict.device == case["device"]
    if "why" in case:
        assert verdict.why == case["why"]
    if "why_contains" in case:
        assert verdict.why and case["why_contains"] in verdict.why, verdict.why
    # the host's on_card decides the same
    assert _on_card(case["label"], kept) is case["ok"]


def test_every_label_the_cases_use_is_one_expected_device_makes() -> None:
    for path in CASES:
        assert valid_label(json.loads(path.read_text())["label"]), path


def test_the_bus_id_ties_nvidia_smi_to_llama_cpp() -> None:
    # nvidia-smi's 8-digit domain, upper-case hex; cudaDeviceGetPCIBusId's, lowercased
    assert cuda_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert cuda_bus_id("00000000:00:04.0") == "0000:00:04.0"
    assert cuda_bus_id("0001:81:00.0") == "0001:81:00.0"
    assert cuda_bus_id("[N/A]") is None and cuda_bus_id(None) is None
    row = parse_gpu_row(
        "0, GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90, Tesla P100-PCIE-16GB, 6.0, 16384, 0, "
        "535.183.01, 00000000:00:04.0"
    )
    assert row is not None and row.pci_bus_id == "00000000:00:04.0"
    assert row.name == "Tesla P100-PCIE-16GB" and row.driver_version == "535.183.01"
    # the 7-field rows of the older query (captured fixtures) still read, without a bus id
    old = parse_gpu_row(
        "0, GPU-ab6a0263-0ae2-1846-2f4f-455ff8b12167, NVIDIA H200, 9.0, 143771, 0, 580.159.04"
    )
    assert old is not None and old.pci_bus_id is None and old.driver_version == "580.159.04"


def test_the_label_follows_the_engine_arch_and_the_card() -> None:
    gpu = Gpu(
        index=0,
        uuid="GPU-1",
        name="Tesla P100-PCIE-16GB",
        compute_cap="6.0",
        memory_total_mib=16384,
        memory_used_mib=0,
        driver_version="535.183.01",
        pci_bus_id="00000000:00:04.0",
    )
    assert expected_device("cpu", [gpu]) == "cpu"
    assert expected_device("sm60", [gpu]) == "CUDA0@0000:00:04.0"
    assert expected_device("sm60", [gpu.model_copy(update={"pci_bus_id": None})]) == "CUDA0"
    assert expected_device("sm90", []) == "CUDA0"
