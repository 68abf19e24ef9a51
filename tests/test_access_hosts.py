"""Who the commands run as, and what a command says after it acted, on real test hosts: as the
SSH user ``operator`` without ``_sudo`` every command that needs root refuses that host first
(``access.root``, with the fix) and changes nothing; with ``_sudo`` and passwordless sudo
everything works; a sudo that asks for a password is one line per host, never a prompt, on a
pipe and on a terminal; ``stop`` reports a unit gone only when the host says so; ``status``
with nothing deployed has a state and an exit status of its own; a dry run exits as the real
run would. Every outcome is read from outside the tool (ssh: the unit file, systemctl, podman,
curl)."""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner

pytestmark = pytest.mark.hosts

UNIT = "tensorless-tiny-p100"
QUADLET = f"/etc/containers/systemd/{UNIT}.container"
HEALTH = "http://127.0.0.1:8080/health"
# sudoers.d is read in name order and the last matching rule wins: this one, after the test
# hosts' NOPASSWD rule (50-tensorless-tests), makes operator's sudo ask for a password
PASSWORD_DROP_IN = "/etc/sudoers.d/90-tl-sudo-password"
REFUSE_DROP_IN = f"/etc/systemd/system/{UNIT}.service.d/tl-refuse-stop.conf"


class Fleet:
    """gpu1 (and gpu2) reached three ways: as root, as operator without _sudo, as operator with
    _sudo; the tiny recipe from the set's Hub server."""

    def __init__(self, tmp: Path, hosts_json: dict[str, Any], hosts: list[Host], hf: HFServer):
        self.hosts = hosts
        self.catalog = write_catalog(tmp / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
        self.env = {"HF_ENDPOINT": hf.url, "NO_COLOR": "1"}
        self.root = write_inventory(tmp / "root.py", hosts)
        op = [h.as_user(h.sudo_user) for h in hosts]
        self.plain = write_inventory(tmp / "operator.py", op)
        self.sudo = write_inventory(
            tmp / "operator-sudo.py", op, data={h.name: {"_sudo": True} for h in hosts}
        )

    def run(
        self, inventory: Path, *args: str, recipes: bool = True, timeout: float = 300
    ) -> tuple[int, str, str]:
        argv = [*args, "-i", str(inventory)]
        if recipes:
            argv += ["--recipes", str(self.catalog)]
        proc = cli(*argv, env=self.env, timeout=timeout)
        for stream in (proc.stdout, proc.stderr):
            assert "Traceback" not in stream and "EOFError" not in stream, stream
        return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def fleet(tmp_path: Path, hosts_json: dict[str, Any], gpu_hosts: list[Host], hf: HFServer) -> Fleet:
    return Fleet(tmp_path, hosts_json, gpu_hosts[:2], hf)


def serving(ssh: SshRunner, host: str = "gpu1") -> dict[str, str]:
    """The unit as the host sees it: its file, systemd's state, the container, /health."""
    out = ssh(
        host,
        f"echo \"$(sha256sum {QUADLET} 2>/dev/null | cut -d' ' -f1)\"; "
        f'echo "$(systemctl is-active {UNIT})"; '
        f"podman container exists {UNIT} && echo container || echo none; "
        f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 3 {HEALTH}; echo",
        check=False,
    ).stdout.splitlines()
    sha, active, container, health = [*out, "", "", "", ""][:4]
    return {"sha": sha, "active": active, "container": container, "health": health}


GONE = {"sha": "", "active": "inactive", "container": "none", "health": "000"}


def test_a_plain_user_is_refused_first_everywhere_and_nothing_changes(
    fleet: Fleet, ssh: SshRunner
) -> None:
    """Item 2 (and item 1 as it was seen): operator without _sudo. doctor says not ready with
    access.root and its fix; deploy refuses before any change; status and logs say they cannot
    read the host (not drift, not silence) and exit 1; stop refuses and the unit keeps serving.
    Each dry run exits as its real run."""
    rc, _, err = fleet.run(fleet.root, "deploy", "tiny", "--limit", "gpu1")
    assert rc == 0, err
    before = serving(ssh)
    assert before["active"] == "active" and before["health"] == "200", before

    rc, out, _ = fleet.run(fleet.plain, "doctor", "tiny", "--limit", "gpu1")
    assert rc == 1 and "gpu1: NOT READY" in out, out
    lines = out.splitlines()
    first = next(i for i, ln in enumerate(lines) if "access.root" in ln)
    assert "FAIL  access.root" in lines[first] and "commands run as operator (uid" in lines[first]
    assert "NOPASSWD" in lines[first + 1] and "connect as root" in lines[first + 1], out
    assert not any("systemd.pid1" in ln for ln in lines[:first]), "access.root comes first"
    rc, out, _ = fleet.run(fleet.plain, "doctor", "tiny", "--limit", "gpu1", "--json")
    (check,) = [
        c for c in json.loads(out)["hosts"][0]["results"][0]["checks"] if c["id"] == "access.root"
    ]
    assert check["status"] == "fail" and "_sudo" in check["fix"]

    # deploy, and its dry run, refuse before any change (a new context would rewrite the unit)
    for dry in (["--dry-run"], []):
        rc, out, err = fleet.run(
            fleet.plain, "deploy", "tiny", "--limit", "gpu1", "--context", "2048", *dry
        )
        assert rc == 1 and "gpu1: skipped" in out and "access.root" in out, out + err
        assert "newuidmap" not in out + err
    assert serving(ssh) == before

    rc, out, err = fleet.run(fleet.plain, "status", "--limit", "gpu1")
    assert rc == 1 and "unreadable" in out and "access.root" in out, out + err
    assert "none found" not in out  # not a drift of a container it could not see
    rc, out, _ = fleet.run(fleet.plain, "status", "--limit", "gpu1", "--json")
    doc = json.loads(out)
    assert doc["exit_code"] == 1 and doc["hosts"][0]["state"] == "unreadable"
    assert doc["hosts"][0]["error"].startswith("access.root: ")

    rc, out, err = fleet.run(fleet.plain, "logs", "tiny", "--limit", "gpu1", recipes=False)
    assert rc == 1 and out == "" and "gpu1: access.root: " in err, out + err

    for args in (["stop", "tiny", "--dry-run"], ["stop", "tiny"], ["rollback", "tiny", "--dry-run"],
                 ["prune", "--dry-run"], ["prepare", "--dry-run"]):  # fmt: skip
        rc, out, err = fleet.run(fleet.plain, *args, "--limit", "gpu1")
        assert rc == 1 and "access.root" in out + err, (args, out, err)
        assert "would change" not in out, (args, out)
        if args == ["stop", "tiny"]:  # item 1: failed, and what is left is said: everything
            assert "gpu1: failed" in out and "stop failed on: gpu1" in err, out + err
            assert "  nothing stopped or removed: access.root: commands run as operator" in out
            assert f"stopped {UNIT}" not in out and "read back" not in out, out
    assert serving(ssh) == before  # still there, still serving: nothing was said to be gone


def test_with_passwordless_sudo_every_command_works_and_stop_is_read_back(
    fleet: Fleet, ssh: SshRunner
) -> None:
    """operator with _sudo (NOPASSWD): ready, deployed, serving, its journal, then stopped, and
    the host confirms the unit, the container and the port are gone."""
    rc, out, _ = fleet.run(fleet.sudo, "doctor", "tiny", "--limit", "gpu1")
    assert rc == 0 and "commands run as root (sudo from operator)" in out, out
    rc, out, err = fleet.run(fleet.sudo, "deploy", "tiny", "--limit", "gpu1")
    assert rc == 0 and "serving on 127.0.0.1:8080" in out, out + err
    assert serving(ssh)["health"] == "200"
    rc, out, err = fleet.run(fleet.sudo, "status", "--limit", "gpu1")
    assert rc == 0 and "serving" in out and "no drift" in out, out + err
    rc, out, err = fleet.run(fleet.sudo, "logs", "tiny", "--limit", "gpu1", "-n", "200",
                             recipes=False)  # fmt: skip
    assert rc == 0 and f"gpu1 {UNIT}: " in out and "listening on" in out, out + err
    rc, out, err = fleet.run(fleet.sudo, "stop", "tiny", "--limit", "gpu1")
    assert rc == 0, out + err
    assert (
        f"stopped {UNIT}.service and removed {QUADLET}; read back: inactive, container gone, "
        "port 8080 closed"
    ) in out
    assert serving(ssh) == GONE


@pytest.fixture
def refuse_stop(ssh: SshRunner) -> Iterator[str]:
    """gpu1's unit refuses a manual stop (a drop-in); afterwards the drop-in goes and the unit
    is stopped by hand: a unit left running without its file is beyond the host reset."""
    try:
        yield REFUSE_DROP_IN
    finally:
        ssh("gpu1", f"rm -rf {Path(REFUSE_DROP_IN).parent}; systemctl daemon-reload; "
            f"systemctl stop {UNIT}; systemctl reset-failed", check=False)  # fmt: skip


def test_stop_reports_what_is_left_when_the_stop_is_refused(
    fleet: Fleet, ssh: SshRunner, refuse_stop: str
) -> None:
    """Item 1: a unit whose stop systemd refuses (RefuseManualStop in a drop-in) is not reported
    removed: failed, exit 1, each thing left named, the fix; the unit keeps its file and serves.
    Once the drop-in is gone the same stop removes it, and the host confirms it."""
    rc, _, err = fleet.run(fleet.root, "deploy", "tiny", "--limit", "gpu1")
    assert rc == 0, err
    refuse = "[Unit]\\nRefuseManualStop=yes\\n"
    ssh("gpu1", f"mkdir -p {Path(REFUSE_DROP_IN).parent} && "
        f"printf '{refuse}' > {REFUSE_DROP_IN} && systemctl daemon-reload")  # fmt: skip
    before = serving(ssh)
    rc, out, err = fleet.run(fleet.root, "stop", "tiny", "--limit", "gpu1")
    assert rc == 1 and "gpu1: failed" in out, out + err
    assert "stopped" not in out and "removed" not in out.replace("removed the", ""), out
    left = next(ln for ln in out.splitlines() if "left: " in ln)
    for thing in (f"{UNIT}.service is active", f"container {UNIT} still exists",
                  "port 8080 still listening", f"{QUADLET} still there"):  # fmt: skip
        assert thing in left, left
    assert "fix: " in out and "stop again" in out
    assert "stop failed on: gpu1" in err
    assert serving(ssh) == before and before["health"] == "200"

    ssh("gpu1", f"rm -rf {Path(REFUSE_DROP_IN).parent} && systemctl daemon-reload")
    rc, out, err = fleet.run(fleet.root, "stop", "tiny", "--limit", "gpu1")
    assert rc == 0 and "read back: inactive, container gone, port 8080 closed" in out, out + err
    assert serving(ssh) == GONE


@pytest.fixture
def sudo_password(ssh: SshRunner) -> Iterator[str]:
    """gpu1's operator needs a password for sudo while the test runs (the reset does not cover
    sudoers.d: removed here, also when the test fails)."""
    ssh("gpu1", f"printf 'operator ALL=(ALL:ALL) ALL\\n' > {PASSWORD_DROP_IN} && "
        f"chmod 440 {PASSWORD_DROP_IN} && visudo -c -q")  # fmt: skip
    try:
        yield "gpu1"
    finally:
        ssh("gpu1", f"rm -f {PASSWORD_DROP_IN}", check=False)


def under_terminal(argv: list[str], env: dict[str, str], limit: float) -> tuple[int | None, str]:
    """The CLI on a pseudo-terminal of its own (stdin, stdout and stderr, and its controlling
    terminal: where getpass would prompt), killed after limit seconds: (exit status or None when
    it had to be killed, everything it wrote)."""
    import pty

    pid, master = pty.fork()
    if pid == 0:  # the child: the terminal is its session's
        os.environ.update({"HF_HUB_DISABLE_TELEMETRY": "1", **env})
        os.execv(sys.executable, [sys.executable, "-m", "tensorless_deploy", *argv])
    seen = b""
    deadline = time.monotonic() + limit
    status: int | None = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        ready, _, _ = select.select([master], [], [], min(left, 0.5))
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                chunk = b""
            seen += chunk
            if chunk:
                continue
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(code)
            break
    os.close(master)
    return status, seen.decode(errors="replace")


def test_sudo_that_needs_a_password_is_one_line_never_a_prompt(
    fleet: Fleet, ssh: SshRunner, sudo_password: str
) -> None:
    """Issue 25 item 6: doctor first, then deploy, status, stop and logs: one line for the host
    naming the user and the fix, exit 1, no traceback, on a pipe and on a terminal (where sudo's
    password prompt would have waited forever); the other host is not held up."""
    assert (
        "a password is required"
        in ssh("gpu1", "su operator -c 'sudo -n true' 2>&1", check=False).stdout
    )
    want = "access.root: sudo needs a password for operator (fix: give operator NOPASSWD sudo"
    for args in (["doctor", "tiny"], ["deploy", "tiny"], ["status"], ["stop", "tiny"],
                 ["logs", "tiny"]):  # fmt: skip
        t0 = time.monotonic()
        rc, out, err = fleet.run(fleet.sudo, *args, recipes=args[0] != "logs", timeout=120)
        assert rc == 1, (args, out, err)
        assert time.monotonic() - t0 < 60, args
        lines = (out + err).splitlines()
        said = [i for i, ln in enumerate(lines) if want in ln]
        assert len(said) == 1, (args, out, err)  # one line, under gpu1's name or after it
        at = said[0]
        assert lines[at].startswith("gpu1") or lines[at - 1].startswith("gpu1: "), (args, out)
        assert "gpu2" in out + err and "gpu2: failed" not in out, (args, out)
    # gpu2's sudo needs none: its commands run as root (it is NOT READY only because no recipe
    # of the catalog fits its H200)
    gpu2 = fleet.run(fleet.sudo, "doctor")[1].split("gpu2: ", 1)[1]
    assert "ok  access.root         commands run as root (sudo from operator)" in gpu2, gpu2
    for args in (["doctor", "tiny"], ["deploy", "tiny"], ["status"]):
        argv = [*args, "-i", str(fleet.sudo), "--recipes", str(fleet.catalog), "--limit", "gpu1"]
        code, term = under_terminal(argv, fleet.env, limit=60)
        assert code == 1, (args, term)  # None: it hung (at a prompt) and was killed
        assert "password:" not in term and "Traceback" not in term, term
        assert want in term, term


def test_status_with_nothing_deployed_has_its_own_state_and_exit(
    fleet: Fleet, ssh: SshRunner
) -> None:
    """Item 6: nothing deployed is not "all serving": state `nothing deployed`, exit 4; a host
    of the inventory that serves nothing while another serves does the same; once every host
    serves, exit 0."""
    rc, out, err = fleet.run(fleet.root, "status")
    assert rc == 4, out + err
    assert "status: nothing deployed on gpu1, gpu2 (exit 4)" in err
    assert [ln.split()[:3] for ln in out.splitlines()[1:]] == [
        ["gpu1", "nothing", "deployed"], ["gpu2", "nothing", "deployed"]
    ]  # fmt: skip
    rc, out, err = fleet.run(fleet.root, "status", "--json")
    doc = json.loads(out)
    assert doc["exit_code"] == 4 and not doc["ok"]
    assert [h["state"] for h in doc["hosts"]] == ["nothing deployed", "nothing deployed"]
    # one host serves, the other serves nothing
    rc, _, err = fleet.run(fleet.root, "deploy", "tiny", "--limit", "gpu1")
    assert rc == 0, err
    assert serving(ssh)["health"] == "200" and serving(ssh, "gpu2")["sha"] == ""
    rc, out, err = fleet.run(fleet.root, "status")
    assert rc == 4 and "status: nothing deployed on gpu2 (exit 4)" in err, out + err
    rc, out, err = fleet.run(fleet.root, "status", "--limit", "gpu1")
    assert rc == 0 and "all serving as the catalog says" in err, out + err


def test_a_dry_run_exits_as_the_real_run(fleet: Fleet, ssh: SshRunner) -> None:
    """Item 8 on the hosts: deploy to a wide bind without a key, and rollback with nothing
    kept, refuse in the dry run with the real run's status, having printed what they would
    do; neither changes anything, as the host confirms."""
    wide = ["deploy", "tiny", "--limit", "gpu1", "--bind", "0.0.0.0"]
    rc_dry, out_dry, _ = fleet.run(fleet.root, *wide, "--dry-run")
    rc_real, out_real, _ = fleet.run(fleet.root, *wide)
    assert rc_dry == rc_real == 1, (out_dry, out_real)
    assert "api.key" in out_dry and "api.key" in out_real
    assert serving(ssh) == GONE
    rc, _, err = fleet.run(fleet.root, "deploy", "tiny", "--limit", "gpu1")
    assert rc == 0, err
    rc_dry, out_dry, _ = fleet.run(fleet.root, "rollback", "tiny", "--limit", "gpu1", "--dry-run")
    rc_real, out_real, _ = fleet.run(fleet.root, "rollback", "tiny", "--limit", "gpu1")
    assert rc_dry == rc_real == 1 and "no previous unit is kept" in out_dry, out_dry
    rc, out, _ = fleet.run(fleet.root, "stop", "tiny", "--limit", "gpu1", "--dry-run")
    assert rc == 0 and "would change" in out, out
    assert serving(ssh)["health"] == "200"
