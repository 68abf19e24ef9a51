"""deploy against the real test hosts: systemd, podman (quadlet and plain unit), the registry,
the Hub-compatible model server and the real llama-server. Only the GPU is a stand-in."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner

pytestmark = pytest.mark.hosts

UNIT = "tensorless-tiny-p100"
FILE = "tiny-llama.gguf"


@dataclass
class Fleet:
    catalog: Path
    inventory: Path
    env: dict[str, str]
    hf: HFServer
    ssh: SshRunner
    hosts_json: dict[str, Any]

    def recipe(self, **run: Any) -> dict[str, Any]:
        return tiny_recipe(self.hosts_json, TINY_COMMIT, **run)

    def write(self, **run: Any) -> None:
        write_catalog(self.catalog, self.recipe(**run))

    def deploy(
        self,
        *hosts: str,
        extra: tuple[str, ...] = (),
        dry: bool = False,
        env: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any], str]:
        args = [
            "deploy",
            "-i",
            str(self.inventory),
            "tiny",
            "--recipes",
            str(self.catalog),
            "--json",
        ]
        for h in hosts:
            args += ["--limit", h]
        if dry:
            args.append("--dry")
        if extra:
            args += ["--", *extra]
        proc = cli(*args, env={**self.env, **(env or {})})
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.stdout.startswith("{"), proc.stdout + proc.stderr
        return proc.returncode, json.loads(proc.stdout), proc.stdout + proc.stderr

    def by_host(self, report: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {h["host"]: h for h in report["hosts"]}

    def steps(self, report: dict[str, Any], host: str) -> dict[str, str]:
        return {s["name"]: s["outcome"] for s in self.by_host(report)[host]["steps"]}

    def sh(self, host: str, cmd: str, check: bool = True) -> str:
        return str(self.ssh(host, cmd, check=check).stdout)

    def complete(self, host: str) -> dict[str, Any]:
        body = json.dumps({"prompt": "hello", "max_tokens": 8, "temperature": 0})
        out = self.sh(
            host,
            "curl -fsS http://127.0.0.1:8080/v1/completions "
            f"-H 'Content-Type: application/json' -d '{body}'",
        )
        answer: dict[str, Any] = json.loads(out)
        return answer

    def bytes_served(self) -> int:
        return self.hf.stats(TINY_REPO, FILE).bytes_sent


@pytest.fixture
def fleet(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    hf: HFServer,
    ssh: SshRunner,
    profile: Any,
    clean_hosts: None,
) -> Iterator[Fleet]:
    profile("gpu2", "p100")  # both trixie hosts carry a P100 stand-in for the tiny P100 recipe
    hosts = [test_hosts[n] for n in ("gpu1", "gpu2", "legacy1")]
    inventory = write_inventory(tmp_path / "inventory.py", hosts, unreachable=True)
    f = Fleet(tmp_path / "recipes", inventory, {"HF_ENDPOINT": hf.url}, hf, ssh, hosts_json)
    f.write()
    yield f


def test_deploy_three_hosts_serves_then_converged_run_changes_nothing(fleet: Fleet) -> None:
    rc, report, out = fleet.deploy("gpu1", "gpu2", "legacy1")
    assert rc == 0, out
    hosts = fleet.by_host(report)
    assert {n: h["outcome"] for n, h in hosts.items()} == {
        "gpu1": "changed",
        "gpu2": "changed",
        "legacy1": "changed",
    }
    assert fleet.bytes_served() == 3 * fleet.hosts_json["tiny_gguf"]["size"]
    for name in ("gpu1", "gpu2", "legacy1"):
        # a first deploy (the image may be there: a host reset keeps images): no "serving:
        # unchanged" beside the restart, as if it had served before
        steps = fleet.steps(report, name)
        assert steps["model"] == steps["unit"] == steps["restart"] == "changed", steps
        assert "serving" not in steps, steps
    for name in ("gpu1", "gpu2", "legacy1"):
        answer = fleet.complete(name)
        assert answer["model"] == TINY_REPO
        assert answer["timings"]["predicted_n"] == 8
        assert hosts[name]["address"] == "127.0.0.1:8080" and hosts[name]["tuned"] is True
    # quadlet on podman 5, a plain systemd unit on podman 4.3
    assert fleet.sh("gpu1", f"test -f /etc/containers/systemd/{UNIT}.container && echo q") == "q\n"
    assert fleet.sh("legacy1", f"test -f /etc/systemd/system/{UNIT}.service && echo s") == "s\n"
    assert fleet.sh("legacy1", f"ls /etc/containers/systemd/{UNIT}.container", check=False) == ""

    fleet.hf.reset_stats()
    rc, report, out = fleet.deploy("gpu1", "gpu2", "legacy1")
    assert rc == 0, out
    for name in ("gpu1", "gpu2", "legacy1"):
        assert fleet.by_host(report)[name]["outcome"] == "unchanged", out
        assert set(fleet.steps(report, name).values()) == {"unchanged"}
    assert fleet.bytes_served() == 0  # no model bytes moved, nothing hashed again
    # a dry run of a converged host says so, step by step (the restart too: its unit is unchanged)
    rc, dry, out = fleet.deploy("gpu1", "gpu2", "legacy1", dry=True)
    assert rc == 0, out
    for name in ("gpu1", "gpu2", "legacy1"):
        assert fleet.by_host(dry)[name]["outcome"] == "no change", out
        assert set(fleet.steps(dry, name).values()) == {"no change"}, fleet.steps(dry, name)


def test_files_labels_and_socket(fleet: Fleet, testinfra_hosts: dict[str, Any]) -> None:
    rc, report, out = fleet.deploy("gpu1")
    assert rc == 0, out
    host = testinfra_hosts["gpu1"]
    unit = host.file(f"/etc/containers/systemd/{UNIT}.container")
    assert unit.exists and unit.user == "root" and unit.mode == 0o644
    assert not host.file(f"/etc/containers/systemd/{UNIT}.container.tensorless-prev").exists
    assert host.service(f"{UNIT}.service").is_running
    fmt = "'{{json .Config.Labels}}'"
    labels = json.loads(host.check_output(f"podman inspect {UNIT} --format {fmt}"))
    digest = fleet.by_host(report)["gpu1"]["recipe_digest"]
    assert labels["io.tensorless.recipe-digest"] == digest
    assert labels["io.tensorless.tuned"] == "true"
    assert labels["io.tensorless.model"] == TINY_REPO
    image = host.check_output(f"podman inspect {UNIT} --format '{{{{.ImageName}}}}'")
    assert image == fleet.hosts_json["image"]["ref"]  # pinned by digest, never a tag
    listening = host.socket.get_listening_sockets()
    assert "tcp://127.0.0.1:8080" in listening
    assert not [s for s in listening if s.endswith(":8080") and s != "tcp://127.0.0.1:8080"]
    # Hugging Face cache layout: the snapshot link resolves to the blob named by its sha256
    sha = fleet.hosts_json["tiny_gguf"]["sha256"]
    repo_dir = "/var/lib/tensorless/models/models--tensorless-test--tiny-llama-GGUF"
    snap = host.file(f"{repo_dir}/snapshots/{TINY_COMMIT}/{FILE}")
    assert snap.is_symlink and snap.linked_to == f"{repo_dir}/blobs/{sha}"
    assert host.file(f"{repo_dir}/blobs/{sha}").mode == 0o644
    mounts = host.check_output(f"podman inspect {UNIT} --format '{{{{json .Mounts}}}}'")
    (mount,) = json.loads(mounts)
    assert mount["Source"] == f"{repo_dir}/blobs/{sha}" and mount["RW"] is False


def test_recipe_change_restarts_only_what_changed(fleet: Fleet) -> None:
    rc, first, out = fleet.deploy("gpu1")
    assert rc == 0, out
    fleet.hf.reset_stats()
    fleet.write(context=1024)
    rc, dry, out = fleet.deploy("gpu1", dry=True)
    assert rc == 0 and fleet.by_host(dry)["gpu1"]["outcome"] == "would change", out
    assert fleet.steps(dry, "gpu1") == {
        "image": "no change",
        "model": "no change",
        "unit": "would change",
        "restart": "would change",
        "serving": "no change",
    }, fleet.steps(dry, "gpu1")
    assert "1024" not in fleet.sh("gpu1", f"cat /etc/containers/systemd/{UNIT}.container")
    rc, second, out = fleet.deploy("gpu1")
    assert rc == 0, out
    steps = fleet.steps(second, "gpu1")
    assert steps == {  # the restart waited for /health: no "serving" step beside it
        "image": "unchanged",
        "model": "unchanged",
        "unit": "changed",
        "restart": "changed",
    }, steps
    assert fleet.bytes_served() == 0
    assert first["hosts"][0]["recipe_digest"] != second["hosts"][0]["recipe_digest"]
    assert '"-c" "1024"' in fleet.sh("gpu1", f"cat /etc/containers/systemd/{UNIT}.container")
    fleet.complete("gpu1")


def test_cut_download_resumes_on_the_next_run(fleet: Fleet) -> None:
    size = fleet.hosts_json["tiny_gguf"]["size"]
    # every attempt of the first run is cut after 50,000 bytes: 5 attempts, 250,000 bytes
    fleet.hf.add_fault("drop", repo_id=TINY_REPO, filename=FILE, after_bytes=50_000, times=5)
    rc, report, out = fleet.deploy("gpu1")
    assert rc == 1
    assert fleet.by_host(report)["gpu1"]["outcome"] == "failed"
    assert "stopped at 250000 of 520800 bytes" in out, out
    assert fleet.sh("gpu1", f"systemctl is-active {UNIT}.service", check=False).strip() != "active"
    fleet.hf.reset_stats()
    rc, report, out = fleet.deploy("gpu1")
    assert rc == 0, out
    assert "resumed from 250000" in out
    assert fleet.bytes_served() == size - 250_000
    fleet.complete("gpu1")


def test_wrong_bytes_are_refused_and_never_served(fleet: Fleet) -> None:
    fleet.hf.add_fault("corrupt", repo_id=TINY_REPO, filename=FILE)
    rc, _report, out = fleet.deploy("gpu1")
    assert rc == 1
    assert "not 21bf02ee" in out and "refused and deleted" in out, out
    repo_dir = "/var/lib/tensorless/models/models--tensorless-test--tiny-llama-GGUF"
    assert fleet.sh("gpu1", f"find {repo_dir} -type f 2>/dev/null", check=False) == ""
    assert fleet.sh("gpu1", f"ls /etc/containers/systemd/{UNIT}.container", check=False) == ""
    assert fleet.sh("gpu1", "ss -Hltn 'sport = :8080'") == ""


def test_failing_new_unit_restores_the_previous_one(fleet: Fleet) -> None:
    rc, _first, out = fleet.deploy("gpu1")
    assert rc == 0, out
    before = fleet.sh("gpu1", f"cat /etc/containers/systemd/{UNIT}.container")
    rc, report, out = fleet.deploy("gpu1", extra=("--no-such-llama-flag",))
    assert rc == 1
    host = fleet.by_host(report)["gpu1"]
    assert host["outcome"] == "failed" and host["tuned"] is False
    assert "restored the previous unit; it is healthy again" in out, out
    assert "  | " in out  # the unit's last journal lines are shown
    assert fleet.sh("gpu1", f"cat /etc/containers/systemd/{UNIT}.container") == before
    assert fleet.complete("gpu1")["model"] == TINY_REPO


def test_unreachable_host_fails_alone(fleet: Fleet) -> None:
    rc, report, _out = fleet.deploy("gpu1", "ghost")
    assert rc == 1
    hosts = fleet.by_host(report)
    assert hosts["gpu1"]["outcome"] == "changed"
    assert hosts["ghost"]["outcome"] == "failed"
    assert "cannot connect" in hosts["ghost"]["reason"]


def test_token_never_shows(fleet: Fleet) -> None:
    token = "hf_tEsTtOkEn0123456789abcdefSECRET"
    fleet.hf.require_token(TINY_REPO, token)
    rc, _report, out = fleet.deploy("gpu1")
    assert rc == 1 and "curl exit 22" in out  # 401 without the token
    # slow the download so the process list can be read while curl runs
    fleet.hf.add_fault(
        "stall", repo_id=TINY_REPO, filename=FILE, after_bytes=1000, seconds=4, times=1
    )
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            cmd = "ps -eo args; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'"
            seen.append(fleet.sh("gpu1", cmd, check=False))
            time.sleep(0.3)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        rc, _report, out = fleet.deploy("gpu1", env={"HF_TOKEN": token})
    finally:
        done.set()
        watcher.join()
    assert rc == 0, out
    assert any("curl" in s for s in seen), "the watcher never saw the download running"
    assert not any(token in s for s in seen)
    assert token not in out
    assert all(fleet.hf.stats(TINY_REPO, FILE).auth_seen[-1:])
    for place in (
        f"cat /etc/containers/systemd/{UNIT}.container",
        "journalctl --no-pager -o cat",
        "ls -A /run/tensorless",
    ):
        assert token not in fleet.sh("gpu1", place, check=False)
    staged = f"grep -rlF {token} /tmp /var/tmp /dev/shm /run /root 2>/dev/null"
    assert fleet.sh("gpu1", staged, check=False).strip() == ""  # no copy left anywhere
    assert fleet.sh("gpu1", "ls -A /run/tensorless", check=False).strip() == ""


def test_status_reports_health_tuning_and_drift_and_stop_purges(fleet: Fleet) -> None:
    rc, report, out = fleet.deploy("gpu1", "legacy1")
    assert rc == 0, out
    digest = fleet.by_host(report)["gpu1"]["recipe_digest"]

    def status(code: int = 0, hosts: tuple[str, ...] = ("gpu1", "legacy1")) -> Any:
        limits = [a for h in hosts for a in ("--limit", h)]
        proc = cli(
            "status", "-i", str(fleet.inventory), "--recipes", str(fleet.catalog), *limits, "--json"
        )
        assert proc.returncode == code, proc.stdout + proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["exit_code"] == code and doc["ok"] is (code == 0)
        return {h["host"]: h["units"] for h in doc["hosts"]}

    # a host read that serves nothing of this tool: its own state and exit 4 (ahead of drift)
    units = status(4, ("gpu1", "legacy1", "gpu2"))
    assert units["gpu2"] == []
    for name, kind in (("gpu1", "quadlet"), ("legacy1", "service")):
        (u,) = units[name]
        assert (u["unit"], u["kind"], u["model"], u["card"]) == (UNIT, kind, TINY_REPO, "p100")
        assert u["healthy"] and u["tuned"] is True and u["recipe_digest"] == digest
        assert u["address"] == "127.0.0.1:8080" and u["drift"] == []
        assert u["image"] == fleet.hosts_json["image"]["ref"]
        assert u["state"] == "serving" and u["rollback_available"] is False
    fleet.write(context=1024)  # the catalog moves on; the hosts do not: drift, exit 3
    units = status(3)
    for name in ("gpu1", "legacy1"):
        (u,) = units[name]
        assert u["healthy"] and {d["field"]: (d["deployed"], d["wanted"]) for d in u["drift"]} == {
            "context": ("4096", "1024")
        }, u["drift"]
    rc, _, out = fleet.deploy("gpu1", "legacy1")  # converge again: no drift, exit 0
    assert rc == 0, out
    units = status()
    assert all(u["drift"] == [] and u["rollback_available"] for us in units.values() for u in us)

    proc = cli(
        "stop",
        "tiny",
        "-i",
        str(fleet.inventory),
        "--recipes",
        str(fleet.catalog),
        "--limit",
        "gpu1",
        "--purge",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert status(4)["gpu1"] == []  # stopped: nothing deployed there now
    repo_dir = "/var/lib/tensorless/models/models--tensorless-test--tiny-llama-GGUF"
    assert fleet.sh("gpu1", f"ls -A {repo_dir} 2>/dev/null", check=False) == ""
    assert fleet.sh("gpu1", "ss -Hltn 'sport = :8080'") == ""
    assert status(0, ("legacy1",))["legacy1"][0]["healthy"]  # the other host keeps serving


def test_bench_through_ssh_tunnel_against_the_receipt(fleet: Fleet) -> None:
    rc, _report, out = fleet.deploy("gpu1")
    assert rc == 0, out
    args = [
        "bench",
        "tiny",
        "-i",
        str(fleet.inventory),
        "--recipes",
        str(fleet.catalog),
        "--limit",
        "gpu1",
        "--runs",
        "3",
        "--json",
    ]
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    (res,) = json.loads(proc.stdout)["results"]
    assert res["runs"] == 3 and res["generated_tokens"] == 256 and res["tuned"] is True
    d = res["decode_tps"]
    assert d["min"] <= d["median"] <= d["max"] and d["median"] > 0
    (c,) = res["comparisons"]
    assert c["key"] == "decode_tps.short" and c["receipt"] == 100.0
    assert c["ratio"] == pytest.approx(d["median"] / 100.0)
    # the API never listened beyond the host's loopback: the bench went through SSH
    assert fleet.sh("gpu1", "ss -Hltn 'sport = :8080'").split()[3] == "127.0.0.1:8080"
    # a receipt the CPU cannot meet: the verdict says so, exit 1
    fleet.write(context=4096)
    recipe = fleet.recipe()
    recipe["receipt"]["decode_tps"] = {"short": 1e9}
    write_catalog(fleet.catalog, recipe)
    rc, _report, out = fleet.deploy("gpu1")
    assert rc == 0, out
    proc = cli(*args[:-1])
    assert proc.returncode == 1 and "BELOW" in proc.stdout
    # a host that does not serve it: one clear line
    proc = cli(
        "bench",
        "tiny",
        "-i",
        str(fleet.inventory),
        "--recipes",
        str(fleet.catalog),
        "--limit",
        "gpu2",
    )
    assert proc.returncode == 1 and "gpu2: tensorless-tiny-p100 is not deployed here" in proc.stderr


def _on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """The CLI with its stderr on a pseudo-terminal (as an operator's shell gives it) and its
    stdout on a pipe: (exit code, stdout, what the terminal received)."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    full = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", "NO_COLOR": "1", **env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorless_deploy", *argv],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=full,
        text=True,
    )
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out = proc.stdout.read() if proc.stdout else ""
    return proc.wait(timeout=300), out, seen.decode(errors="replace")


def test_transfers_show_progress_on_a_terminal_and_never_in_json(fleet: Fleet) -> None:
    """A host's own download (polled on its SSH connection while it runs) and a push from this
    machine each draw one line on a terminal: hosts, MB of the total, and at the end 100 %."""
    size = fleet.recipe()["model"]["size_bytes"]
    total = f"{size / 1e6:,.1f}"
    base = ["-i", str(fleet.inventory), "tiny", "--recipes", str(fleet.catalog), "--limit", "gpu1"]
    # slow the download so the poll sees it run
    fleet.hf.add_fault("stall", repo_id=TINY_REPO, filename=FILE, after_bytes=1000, seconds=3)
    rc, out, term = _on_a_terminal(["deploy", *base], fleet.env)
    assert rc == 0, out + term
    drawn = [seg.split("\r")[-1].strip() for seg in term.replace("\r\n", "\n").split("\n")]
    downloads = [line for line in drawn if line.startswith("download model: 1 host(s), ")]
    assert downloads and downloads[-1].startswith(
        f"download model: 1 host(s), {total}/{total} MB"
    ), term
    assert "\r" in term  # redrawn in place while it ran
    fleet.hf.clear_faults()

    stop = cli("stop", "tiny", "-i", str(fleet.inventory), "--limit", "gpu1", "--purge",
               "--recipes", str(fleet.catalog), env=fleet.env)  # fmt: skip
    assert stop.returncode == 0, stop.stdout + stop.stderr
    rc, out, term = _on_a_terminal(["deploy", *base, "--transfer", "push"], fleet.env)
    assert rc == 0, out + term
    assert f"push model: 1 host(s), {total}/{total} MB (100%)" in term, term

    fleet.sh("gpu1", f"systemctl stop {UNIT}; rm -f /var/lib/tensorless/models/*/blobs/*")
    fleet.hf.add_fault("stall", repo_id=TINY_REPO, filename=FILE, after_bytes=1000, seconds=2)
    rc, out, term = _on_a_terminal(["--json", "deploy", *base], fleet.env)
    assert rc == 0 and out.startswith("{"), out + term
    assert "MB" not in term and "host(s)" not in term, term
