"""First contact, without booting a host: docs/install.md's playground and ./demo's install.

The playground: under `eval` a failure returns non-zero with one line saying why (it left `$?`
at 0 and `$INV` empty); a set never booted gets its BASE/logs (the redirect to
BASE/logs/playground-setup.log failed at once); the venv of install.md's own install (found
through the tensorless-deploy on PATH, no checkout .venv) is one the playground runs with.
Setup is made to stop at once (N=99) where a test would otherwise boot hosts. ./demo's pip step
says it is alive (tests/hosts/heartbeat.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "hosts" / "playground.sh"

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="playground.sh runs as root")


def _eval(args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """As install.md types it: eval of the script's stdout, then $? and $INV."""
    return subprocess.run(
        ["bash", "-c", f'eval "$(bash {args})"; echo "rc=$? INV=[${{INV:-}}]"'],
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@AS_ROOT
def test_no_installed_tool_fails_under_eval_with_the_install_command() -> None:
    proc = _eval(str(SCRIPT), {"PYTHON": "/nonexistent/python"})
    assert proc.stdout.strip() == "rc=2 INV=[]", proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("playground: no Python with tensorless-deploy installed"), line
    assert "install it first: python3 -m venv ~/.venvs/tensorless" in line, line
    assert "docs/install.md" not in line  # no loop back to the page that sent the user here


@AS_ROOT
def test_a_set_never_booted_gets_its_logs_and_a_failed_setup_is_non_zero(tmp_path: Path) -> None:
    base = tmp_path / "never-booted"
    proc = _eval(f"{SCRIPT} 99", {"BASE": str(base), "TL_SET": "7"})
    assert proc.stdout.strip() == "rc=1 INV=[]", proc.stdout + proc.stderr
    assert "No such file or directory" not in proc.stderr, proc.stderr
    log = base / "logs" / "playground-setup.log"
    assert f"playground: setup failed (log {log})" in proc.stderr, proc.stderr
    assert "N must be 1..16" in log.read_text()


@AS_ROOT
def test_install_mds_venv_is_the_one_the_playground_runs_with(tmp_path: Path) -> None:
    """A checkout without .venv, the tool installed elsewhere with only its own packages (here:
    this venv, reached only through a tensorless-deploy on PATH, as install.md's install
    leaves it): the playground finds that Python and gets as far as setup."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "tests" / "hosts", checkout / "tests" / "hosts")
    bin_dir = tmp_path / "venv-bin"
    bin_dir.mkdir()
    tool = bin_dir / "tensorless-deploy"
    tool.write_text(f"#!{sys.executable}\nfrom tensorless_deploy.cli import main\nmain()\n")
    tool.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "BASE": str(tmp_path / "base"), "TL_SET": "7"}
    env |= {"PYTHONPATH": str(ROOT)}  # the tool itself, as site-packages would hold it
    proc = _eval(f"{checkout / 'tests' / 'hosts' / 'playground.sh'} 99", env, cwd=checkout)
    assert "no Python with tensorless-deploy" not in proc.stderr, proc.stderr
    assert "N must be 1..16" in (tmp_path / "base" / "logs" / "playground-setup.log").read_text()


def test_the_demos_pip_step_is_never_silent(tmp_path: Path) -> None:
    """./demo's install ran pip -q for 97 s without a word: heartbeat says every HEARTBEAT_S
    seconds that it still runs, with the last line it wrote, and on failure the log's tail."""
    lib = ROOT / "tests" / "hosts" / "heartbeat.sh"
    slow = "echo 'Collecting numpy'; sleep 3; echo 'Installing collected packages'"
    ok = subprocess.run(
        ["bash", "-c", f'. {lib}; heartbeat "demo: pip install" {tmp_path}/a.log sh -c "$0"', slow],
        env={**os.environ, "HEARTBEAT_S": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    beats = [ln for ln in ok.stderr.splitlines() if ln.startswith("demo: pip install: ")]
    assert len(beats) >= 2 and "(Collecting numpy)" in beats[0], ok.stderr
    assert beats[-1].startswith("demo: pip install: done in ")


def test_the_demos_pip_failure_shows_the_log(tmp_path: Path) -> None:
    lib = ROOT / "tests" / "hosts" / "heartbeat.sh"
    failing = "echo 'ERROR: No matching distribution found for pyinfra'; exit 3"
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f'. {lib}; heartbeat "demo: pip install" {tmp_path}/c.log sh -c "$0"',
            failing,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3
    assert "demo: pip install: failed (exit 3)" in proc.stderr, proc.stderr
    assert "No matching distribution found for pyinfra" in proc.stderr
