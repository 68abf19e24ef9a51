"""./demo's host part as a new operator runs it (tests/hosts/demo.py against gpu1 of the set):
the deploy's output passes through as it comes, and the demo ends by saying how to reach the
server (the command it prints works), where the inventory it wrote is, and what to read next;
its speed line is a median after a warm-up, labelled as meaningless for the tiny model (a
single request said 13,489 tok/s on one run and 7.9 on the next)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.hosts


def test_the_demo_says_how_to_reach_the_server_and_what_next(hosts_json: dict[str, object]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.hosts.demo"],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    lines = out.splitlines()
    assert any(ln.startswith("gpu1: ") and "serving on 127.0.0.1:8080" in ln for ln in lines), out
    assert out.index("gpu1: ") < out.index("completion from")  # the deploy's own lines first
    assert "tok/s" not in out
    assert "the median of 3 requests after a warm-up" in out and "the speed mean" in out
    reach = next(ln.strip() for ln in lines if "curl -s http://127.0.0.1:8080/v1/models" in ln)
    models = subprocess.run(shlex.split(reach), capture_output=True, text=True, timeout=60)
    assert models.returncode == 0 and "tensorless-test/tiny-llama-GGUF" in models.stdout, reach
    where = next(ln for ln in lines if "the inventory and catalog of this deploy:" in ln)
    inventory = Path(where.split(": ", 1)[1].split(", ")[0])
    assert inventory.is_file() and "gpu1" in inventory.read_text(), where
    assert any(ln.startswith("Next: docs/tutorial.md") for ln in lines), out
    assert "tests/hosts/teardown.sh" in lines[-1]
