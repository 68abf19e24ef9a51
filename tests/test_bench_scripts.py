"""The benches under bench/ measure what they say, checked without test hosts: they count only
the hosts asked for (gpu1..gpuN, never legacy1 or persist1 unasked), one host set's ports never
meet another's, their work folders go on every way out, and cli_startup.py's "no bytecode" case
imports a copy that holds none (tests/hosts/benchkit.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.hosts.benchkit import PORT_STRIDE, gpu_hosts, set_port, work_dir

REPO = Path(__file__).resolve().parent.parent
NAMES = ["legacy1", "gpu10", "persist1", "gpu2", "gpu1", "gpu3"]


def _host(name: str) -> dict[str, Any]:
    """A hosts.json row of a host nobody can reach (the refusals come before any SSH)."""
    return {
        "name": name,
        "ip": "10.253.7.250",
        "user": "root",
        "key": "/nonexistent",
        "known_hosts": "/nonexistent",
        "ssh_config": "/nonexistent",
        "distro": "debian",
        "suite": "bookworm" if name == "legacy1" else "trixie",
        "podman_major": 4 if name == "legacy1" else 5,
        "podman_version": "5.4.2",
        "quadlet": name != "legacy1",
        "profile": "p100",
        "netns": f"tl7-{name}",
    }


def test_gpu_hosts_are_the_first_n_by_number_and_never_the_other_kinds() -> None:
    hosts = {n: n for n in NAMES}
    assert gpu_hosts(hosts) == ["gpu1", "gpu2", "gpu3", "gpu10"]
    assert gpu_hosts(hosts, 2) == ["gpu1", "gpu2"]
    with pytest.raises(SystemExit, match=r"--hosts 5, but this host set has 4 GPU host\(s\)"):
        gpu_hosts(hosts, 5)


def test_ports_of_two_host_sets_never_meet(monkeypatch: pytest.MonkeyPatch) -> None:
    ports = {set_port(18090, i) for i in range(8)}
    assert len(ports) == 8 and min(ports) == 18090 and max(ports) == 18090 + 7 * PORT_STRIDE
    monkeypatch.setenv("TL_SET", "4")
    assert set_port(18090) == 18090 + 4 * PORT_STRIDE


def test_a_work_folder_goes_on_an_error_too(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), work_dir("bench-", tmp_path) as work:
        (work / "inside").write_text("x")
        raise RuntimeError("the bench failed")
    assert not work.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", ["deploy_fleet.py", "doctor_parallel.py"])
def test_a_bench_counts_only_the_gpu_hosts_asked_for(tmp_path: Path, script: str) -> None:
    # legacy1 and persist1 are in the set, but asked for 5 of its 4 GPU hosts the bench refuses
    # in one line before it reaches any host (it counted legacy1 as a fifth host before)
    rows = [_host(n) for n in NAMES]
    (tmp_path / "hosts.json").write_text(json.dumps({"hosts": rows}))
    env = {**os.environ, "BASE": str(tmp_path), "TL_SET": "7"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), "--hosts", "5", "--runs", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "bench: --hosts 5, but this host set has 4 GPU host(s) (gpu1, gpu2, gpu3, gpu10); boot "
        "more with `TL_SET=N bash tests/hosts/setup.sh 5`"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts.json"]  # no work folder left


def _cli_startup() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_startup", REPO / "bench" / "cli_startup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_no_bytecode_case_imports_a_copy_that_holds_none(tmp_path: Path) -> None:
    bench = _cli_startup()
    extra, copy = bench.bytecode_free_copy(tmp_path)
    env = {**os.environ, **extra}
    env.pop("PYTHONPYCACHEPREFIX", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tensorless_deploy", "models", "--json"],
        capture_output=True,
        text=True,
        env={**env, "XDG_CACHE_HOME": str(tmp_path / "xdg")},
        cwd=copy,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    bench.check_no_bytecode(env, copy)  # exits naming what it found otherwise
    assert list(copy.rglob("__pycache__")) == []
