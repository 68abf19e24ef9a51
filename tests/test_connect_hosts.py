"""SSH failures as an operator meets them on a fresh controller, each one line with its fix, and
the fix applied makes the host reachable: no ~/.ssh/known_hosts (normal on a new machine), a
host nobody answers, a port no sshd listens on, no key to log in with, a key the host refuses.
Against the real test hosts (their sshd), through `doctor` as the tutorial runs it first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.harness import Host

pytestmark = pytest.mark.hosts


def _doctor(inventory: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}  # no agent keys
    return subprocess.run(
        [sys.executable, "-m", "tensorless_deploy", "doctor", "-i", str(inventory)],
        env={**env, "HOME": str(home), "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _row(proc: subprocess.CompletedProcess[str], name: str) -> str:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{name}:")]
    assert lines, proc.stdout + proc.stderr
    i = proc.stdout.splitlines().index(lines[0])
    return "\n".join(proc.stdout.splitlines()[i : i + 3])


def test_ssh_failures_name_the_fix(
    tmp_path: Path, gpu_hosts: list[Host], unreachable_ip: str, hosts_json: dict[str, Any]
) -> None:
    h = gpu_hosts[0]
    home = tmp_path / "home"
    home.mkdir()
    hosts = {
        # pyinfra's defaults: ~/.ssh/known_hosts, accept-new
        "fresh": {"ssh_hostname": h.ip, "ssh_user": "root", "ssh_key": str(h.key)},
        "ghost": {
            "ssh_hostname": unreachable_ip,
            "ssh_user": "root",
            "ssh_key": str(h.key),
            "ssh_known_hosts_file": str(h.known_hosts),
            "ssh_connect_timeout": 3,
        },
        "noport": {
            "ssh_hostname": h.ip,
            "ssh_port": 2222,
            "ssh_user": "root",
            "ssh_key": str(h.key),
            "ssh_known_hosts_file": str(h.known_hosts),
        },
        "nokey": {"ssh_hostname": h.ip, "ssh_user": "root"},
        "stranger": {
            "ssh_hostname": h.ip,
            "ssh_user": "nobody-here",
            "ssh_key": str(h.key),
            "ssh_known_hosts_file": str(h.known_hosts),
        },
    }
    hosts["nokey"]["ssh_known_hosts_file"] = str(h.known_hosts)
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"hosts = {list(hosts.items())!r}\n", encoding="utf-8")
    proc = _doctor(inventory, home)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    fresh = _row(proc, "fresh")
    known = home / ".ssh" / "known_hosts"
    assert f"no known_hosts file {known}" in fresh, fresh
    assert f"mkdir -p {known.parent} && touch {known}" in fresh, fresh
    assert "Errno" not in proc.stdout, proc.stdout
    ghost = _row(proc, "ghost")
    assert f"nothing answers SSH at {unreachable_ip}:22" in ghost, ghost
    assert "ssh_hostname and ssh_port" in ghost, ghost
    noport = _row(proc, "noport")
    assert f"nothing answers SSH at {h.ip}:2222 (connection refused" in noport, noport
    nokey = _row(proc, "nokey")
    assert "no SSH key to log in to" in nokey and "set ssh_key in the inventory" in nokey, nokey
    stranger = _row(proc, "stranger")
    assert "refused the login as nobody-here" in stranger and "ssh-copy-id" in stranger
    # the fix the first line names, applied as written: the host is reached (its key recorded)
    subprocess.run(
        ["bash", "-c", f"mkdir -p {known.parent} && touch {known}"], check=True, timeout=30
    )
    inventory.write_text(f"hosts = {[('fresh', hosts['fresh'])]!r}\n", encoding="utf-8")
    again = _doctor(inventory, home)
    assert "cannot connect" not in again.stdout, again.stdout
    assert h.ip in known.read_text(), "pyinfra recorded the new host's key"
