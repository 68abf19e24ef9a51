"""Runs that meet a hostile world, on the real test hosts (issue 25, items 1-5 and the full
disk of item 9), each fault made the way it was found and each outcome read from outside the
tool (ssh, podman inspect, pgrep, the model server's own log):

- an SSH partition (nftables drop of port 22 inside the host's namespace, 8 s into a download)
  that never heals: the host is unreachable after its deadline, named with its step, while
  another host finishes on its own schedule; one that heals in 30 s: nothing is lost;
- --serial over hosts with one and two instances;
- two deploys of different recipes to one host at once: one holds the lock, the other refuses
  naming it (or waits with --wait-lock); each report names the digest read back; gate run
  and maintain begin take the same lock;
- Ctrl-C (or SIGKILL) of the controller mid-download and mid-push: one line, nothing left
  running on the host, and the rerun resumes safely;
- a model server that answers 200 with a short JSON body or a page: nothing of it is kept;
- a disk that fills up mid-download: said so, with the filesystem, what is free and needed.
"""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.hub import DEFAULT_MODELS_DIR, cache_paths, host_state_dir
from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner

pytestmark = pytest.mark.hosts

UNIT = "tensorless-tiny-p100"
LABEL = "io.tensorless.recipe-digest"
PARTITION = "tl_partition"


@dataclass
class Fleet:
    hosts: dict[str, Host]
    inventory: Path
    catalog: Path
    env: dict[str, str]
    hf: HFServer
    ssh: SshRunner
    hosts_json: dict[str, Any]
    tmp: Path

    @property
    def file(self) -> str:
        return str(self.hosts_json["tiny_gguf"]["hf_file"])

    @property
    def paths(self) -> Any:
        g = self.hosts_json["tiny_gguf"]
        models = DEFAULT_MODELS_DIR
        return cache_paths(
            models, host_state_dir(models), TINY_REPO, TINY_COMMIT, g["hf_file"], g["sha256"]
        )

    def args(self, *extra: str, catalog: Path | None = None) -> list[str]:
        return [
            "deploy",
            "-i",
            str(self.inventory),
            "tiny",
            "--recipes",
            str(catalog or self.catalog),
            "--json",
            *extra,
        ]

    def start(self, *extra: str, catalog: Path | None = None) -> subprocess.Popen[str]:
        """deploy as its own process, the way an operator's shell starts it."""
        import os

        return subprocess.Popen(
            [sys.executable, "-m", "tensorless_deploy", *self.args(*extra, catalog=catalog)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **self.env},
        )

    def deploy(self, *extra: str, catalog: Path | None = None) -> tuple[int, dict[str, Any], str]:
        proc = cli(*self.args(*extra, catalog=catalog), env=self.env)
        return _report(proc.returncode, proc.stdout, proc.stderr)

    def sh(self, host: str, cmd: str, check: bool = True) -> str:
        return str(self.ssh(host, cmd, check=check).stdout).strip()

    def size(self, host: str, path: str) -> int:
        out = self.sh(host, f"stat -c %s {path} 2>/dev/null || echo 0")
        return int(out)

    def wait_partial(self, host: str, at_least: int = 90_000, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            have = self.size(host, self.paths.partial)
            if have >= at_least:
                return have
            time.sleep(0.3)
        raise AssertionError(f"{host}: the download never reached {at_least} bytes")

    def running_digest(self, host: str, unit: str = UNIT) -> str:
        fmt = "'{{index .Config.Labels \"" + LABEL + "\"}}'"
        return self.sh(host, f"podman inspect {unit} --format {fmt}")

    def left_running(self, host: str) -> str:
        """What of a run is still running on the host: curl, the lock's holder, a receive."""
        return self.sh(
            host,
            "pgrep -a -x curl; pgrep -af 'lock=/run/tensorless-deploy/' | grep -v pgrep; "
            "pgrep -af 'model-receive|partial=' | grep -v pgrep; true",
        )

    def blob_ok(self, host: str) -> bool:
        want = self.hosts_json["tiny_gguf"]["sha256"]
        return self.sh(host, f"sha256sum {self.paths.blob} | cut -d' ' -f1", check=False) == want


def _report(code: int, out: str, err: str) -> tuple[int, dict[str, Any], str]:
    assert "Traceback" not in err, err
    assert out.startswith("{"), out + err
    return code, json.loads(out), out + err


def _by_host(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in report["hosts"]}


@pytest.fixture
def fleet(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    hf: HFServer,
    ssh: SshRunner,
) -> Fleet:
    names = ["gpu1", "gpu3"]
    if any(n not in test_hosts for n in names):
        pytest.skip("needs gpu1 and gpu3: tests/hosts/setup.sh 3")
    chosen = {n: test_hosts[n] for n in names}
    inventory = write_inventory(tmp_path / "inventory.py", list(chosen.values()))
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    return Fleet(chosen, inventory, catalog, {"HF_ENDPOINT": hf.url}, hf, ssh, hosts_json, tmp_path)


@pytest.fixture
def partition(fleet: Fleet) -> Iterator[Callable[[str], None]]:
    """partition(host): drop every packet to the host's port 22 inside its own network
    namespace (from the outer machine: the host's SSH cannot undo it); always healed after."""
    cut: list[Host] = []

    def nft(h: Host, *words: str) -> None:
        subprocess.run(["ip", "netns", "exec", h.netns, "nft", *words], check=True)

    def apply(name: str) -> None:
        h = fleet.hosts[name]
        nft(h, "add", "table", "inet", PARTITION)
        nft(h, "add", "chain", "inet", PARTITION, "input",
            "{ type filter hook input priority -10 ; }")  # fmt: skip
        nft(h, "add", "rule", "inet", PARTITION, "input", "tcp", "dport", "22", "drop")
        cut.append(h)

    yield apply
    for h in cut:
        heal(h)


def heal(h: Host) -> None:
    subprocess.run(
        ["ip", "netns", "exec", h.netns, "nft", "delete", "table", "inet", PARTITION],
        check=False,
        capture_output=True,
    )


def _first_healthy(fleet: Fleet, host: str, seen: dict[str, float], stop: threading.Event) -> None:
    """When the host's unit first answers /health 200 (read over ssh, every half second)."""
    while not stop.is_set():
        got = fleet.ssh(
            host, "curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:8080/health", check=False
        )
        if got.stdout.strip() == "200":
            seen[host] = time.monotonic()
            return
        stop.wait(0.5)


def _watch_health(fleet: Fleet, host: str) -> tuple[dict[str, float], threading.Event]:
    seen: dict[str, float] = {}
    stop = threading.Event()
    threading.Thread(target=_first_healthy, args=(fleet, host, seen, stop), daemon=True).start()
    return seen, stop


def _stall(fleet: Fleet, host: str, seconds: float, times: int | None = 1) -> None:
    fleet.hf.add_fault(
        "stall",
        repo_id=TINY_REPO,
        filename=fleet.file,
        after_bytes=100_000,
        seconds=seconds,
        times=times,
        methods=("GET",),
        clients=(fleet.hosts[host].ip,),
    )


# ----------------------------------------------------------------------- item 1: deadlines


def test_a_partition_that_never_heals(fleet: Fleet, partition: Callable[[str], None]) -> None:
    """Port 22 of gpu1 dropped while its download is in flight, for good: gpu1 is unreachable
    after its deadline (20 s here; the default is 60), named with the step it was in; gpu3,
    which had its model already, restarts and serves without waiting for gpu1; the run ends;
    the download gpu1 was running stops by itself, and a rerun resumes it."""
    _stall(fleet, "gpu1", seconds=600)
    run = fleet.start("--host-timeout", "20")
    try:
        fleet.wait_partial("gpu1")
        deadline = time.monotonic() + 60
        while not fleet.sh("gpu3", f"test -f {fleet.paths.blob} && echo yes", check=False):
            assert time.monotonic() < deadline, "gpu3 never had its model"
            time.sleep(0.3)
        seen, stop = _watch_health(fleet, "gpu3")
        partition("gpu1")
        cut = time.monotonic()
        out, err = run.communicate(timeout=120)
        ended = time.monotonic()
        stop.set()
    finally:
        run.kill()
    code, report, text = _report(run.returncode, out, err)
    hosts = _by_host(report)
    # gpu3 served before gpu1's deadline could have passed: it did not wait for gpu1
    assert "gpu3" in seen and seen["gpu3"] - cut < 20, (seen, cut)
    assert code == 1, text
    assert hosts["gpu1"]["outcome"] == "unreachable", text
    assert "no answer over SSH for 20 s, during the model step" in hosts["gpu1"]["reason"]
    assert hosts["gpu3"]["outcome"] == "changed", text
    assert ended - cut < 20 + 5 + 10, ended - cut  # the deadline, one keepalive, the rest
    assert hosts["gpu3"]["serving_digest"] == fleet.running_digest("gpu3")
    heal(fleet.hosts["gpu1"])
    # the holder on gpu1 heard no heartbeat for 20 s: it let go, and the download stopped
    deadline = time.monotonic() + 15
    while (left := fleet.left_running("gpu1")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == "", left[:600]
    kept = fleet.size("gpu1", fleet.paths.partial)
    assert kept >= 90_000
    fleet.hf.clear_faults()
    fleet.hf.reset_stats()
    code, report, text = fleet.deploy("--limit", "gpu1")
    assert code == 0 and _by_host(report)["gpu1"]["outcome"] == "changed", text
    assert f"bytes={kept}-" in fleet.hf.stats(TINY_REPO, fleet.file).ranges  # resumed
    assert fleet.blob_ok("gpu1")


def test_a_partition_that_heals_in_30_s(fleet: Fleet, partition: Callable[[str], None]) -> None:
    """The same cut, healed after 30 s, under the default deadline (60 s): gpu1's run goes on
    where it was and ends serving; gpu3 served long before the heal, on its own schedule."""
    _stall(fleet, "gpu1", seconds=40)
    run = fleet.start()
    try:
        fleet.wait_partial("gpu1")
        seen, stop = _watch_health(fleet, "gpu3")
        partition("gpu1")
        cut = time.monotonic()
        timer = threading.Timer(30, heal, args=(fleet.hosts["gpu1"],))
        timer.start()
        out, err = run.communicate(timeout=180)
        stop.set()
        timer.join()
    finally:
        run.kill()
    code, report, text = _report(run.returncode, out, err)
    hosts = _by_host(report)
    assert code == 0, text
    assert [hosts[n]["outcome"] for n in ("gpu1", "gpu3")] == ["changed", "changed"], text
    assert "gpu3" in seen and seen["gpu3"] - cut < 30, (seen, cut)  # before the heal
    for name in ("gpu1", "gpu3"):
        assert hosts[name]["serving_digest"] == fleet.running_digest(name)
    assert fleet.blob_ok("gpu1")


@pytest.mark.parametrize("command", ["doctor", "plan"])
def test_read_only_commands_keep_the_deadline_given(
    fleet: Fleet, partition: Callable[[str], None], command: str
) -> None:
    """doctor and plan of a partitioned gpu1 under --host-timeout 3: gpu1 is unreachable
    after 3 s, said with the deadline given (without a deadline on the session, the TCP
    connect's own 10 s timeout would say "cannot connect"); gpu3 is read as usual."""
    partition("gpu1")
    started = time.monotonic()
    proc = cli(
        command, "-i", str(fleet.inventory), "tiny", "--recipes", str(fleet.catalog),
        "--host-timeout", "3", "--json", env=fleet.env,
    )  # fmt: skip
    took = time.monotonic() - started
    text = proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    # doctor: gpu1 not ready (exit 1); plan: the model is placed on gpu3 (exit 0)
    assert proc.returncode == (1 if command == "doctor" else 0), text
    assert "unreachable: no SSH session within 3 s (connect;" in text, text
    assert "gpu3" in proc.stdout, text
    assert took < 10, took


# ----------------------------------------------------------------------- item 2: --serial


@pytest.mark.parametrize("serial", ["1", "2"])
def test_a_roll_over_hosts_with_one_and_two_instances(
    fleet: Fleet, test_hosts: dict[str, Host], profile: Any, serial: str
) -> None:
    """gpu1 with two P100s (two instances) in the first batch, hosts with one after it: every
    batch runs (before: KeyError in pyinfra's get_op_order, later hosts untouched)."""
    if "legacy1" not in test_hosts:
        pytest.skip("needs legacy1")
    profile("gpu1", "p100x2")  # two free P100s: two instances of the p100 recipe
    order = [test_hosts["gpu1"], test_hosts["gpu3"], test_hosts["legacy1"]]
    write_inventory(fleet.inventory, order)
    proc = cli(*fleet.args("--serial", serial), env=fleet.env)
    code, report, text = _report(proc.returncode, proc.stdout, proc.stderr)
    hosts = _by_host(report)
    assert code == 0, text
    assert [hosts[h.name]["outcome"] for h in order] == ["changed"] * 3, text
    assert report["ok"] is True  # the whole report (before: a traceback, no summary)
    for h, units in (("gpu1", (UNIT, f"{UNIT}-1")), ("gpu3", (UNIT,)), ("legacy1", (UNIT,))):
        for unit in units:
            assert fleet.sh(h, f"systemctl is-active {unit}") == "active", (h, unit)
        assert hosts[h]["serving_digest"] == fleet.running_digest(h)
    assert len(hosts["gpu1"]["addresses"]) == 2


# ----------------------------------------------------------------------- item 3: the lock


def _second_catalog(fleet: Fleet) -> Path:
    """Another version of the tiny recipe (another context): another recipe digest."""
    v2 = copy.deepcopy(tiny_recipe(fleet.hosts_json, TINY_COMMIT, context=2048))
    return write_catalog(fleet.tmp / "recipes-v2", v2)


def test_two_deploys_at_once_one_holds_the_lock(fleet: Fleet) -> None:
    """v1 is downloading on gpu1 when v2 is deployed to it: v2 refuses, naming v1's run, and
    appends nothing to the partial; v1 ends serving, and says the digest gpu1 runs. Then v2
    with --wait-lock while v1 is deployed again: it waits, deploys, and names v2's digest,
    which is what runs."""
    v2 = _second_catalog(fleet)
    _stall(fleet, "gpu1", seconds=8)
    first = fleet.start("--limit", "gpu1")
    try:
        fleet.wait_partial("gpu1")
        gets = fleet.hf.stats(TINY_REPO, fleet.file).get
        code, report, text = fleet.deploy("--limit", "gpu1", catalog=v2)
        assert code == 1, text
        gpu1 = _by_host(report)["gpu1"]
        assert gpu1["outcome"] == "skipped", text
        assert "locked by another run: deploy tiny by " in gpu1["reason"]
        assert f"(pid {first.pid})" in gpu1["reason"], gpu1["reason"]
        assert fleet.hf.stats(TINY_REPO, fleet.file).get == gets  # no second download
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    code, report, text = _report(first.returncode, out, err)
    assert code == 0, text
    v1_digest = _by_host(report)["gpu1"]["serving_digest"]
    assert v1_digest and v1_digest == fleet.running_digest("gpu1")
    assert fleet.blob_ok("gpu1")

    # the second run waits for the first, then changes the host: each names what runs
    holder = fleet.start("--limit", "gpu1", catalog=v2)
    try:
        deadline = time.monotonic() + 30
        while not fleet.sh("gpu1", "cat /run/tensorless-deploy/deploy.lock.who", check=False):
            assert time.monotonic() < deadline, "the first run never held the lock"
            time.sleep(0.1)
        code, report, text = fleet.deploy("--limit", "gpu1", "--wait-lock", "120")
        out, err = holder.communicate(timeout=120)
    finally:
        holder.kill()
    assert code == 0, text
    waited_digest = _by_host(report)["gpu1"]["serving_digest"]
    hcode, hreport, htext = _report(holder.returncode, out, err)
    assert hcode == 0, htext
    v2_digest = _by_host(hreport)["gpu1"]["serving_digest"]
    assert v2_digest and v2_digest != v1_digest
    assert waited_digest == v1_digest == fleet.running_digest("gpu1")  # the last change won
    assert fleet.sh("gpu1", "test -e /run/tensorless-deploy/deploy.lock.who || echo free") == "free"


def test_gate_run_refuses_a_host_a_deploy_holds(fleet: Fleet) -> None:
    """gate run on gpu1 while a deploy is downloading there: it takes the same lock, so it
    refuses the host naming the deploy's run (before: it surveyed gpu1, found its card idle
    and set out to fetch the model the deploy was still appending to); the deploy ends
    serving, and the lock is free after both."""
    _stall(fleet, "gpu1", seconds=20)
    first = fleet.start("--limit", "gpu1")
    try:
        fleet.wait_partial("gpu1")
        gets = fleet.hf.stats(TINY_REPO, fleet.file).get
        gate = cli(
            "gate", "run", "-i", str(fleet.inventory), "--limit", "gpu1", "tiny",
            "--recipes", str(fleet.catalog), env=fleet.env,
        )  # fmt: skip
        assert gate.returncode == 1, gate.stdout + gate.stderr
        assert "Traceback" not in gate.stderr, gate.stderr
        assert "gpu1: locked by another run: deploy tiny by " in gate.stderr, gate.stderr
        assert f"(pid {first.pid})" in gate.stderr, gate.stderr
        assert fleet.hf.stats(TINY_REPO, fleet.file).get == gets  # gate run fetched nothing
        units = fleet.sh(
            "gpu1", "systemctl list-units --all --no-legend --plain 'tensorless-gate-*'"
        )
        assert units == "", units
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    code, report, text = _report(first.returncode, out, err)
    assert code == 0 and _by_host(report)["gpu1"]["outcome"] == "changed", text
    assert fleet.blob_ok("gpu1")
    assert fleet.sh("gpu1", "test -e /run/tensorless-deploy/deploy.lock.who || echo free") == "free"


def test_a_deploy_while_gate_run_measures_is_refused(fleet: Fleet) -> None:
    """gate run measuring on gpu1 holds gpu1's lock: a deploy to gpu1 meanwhile is refused,
    naming the gate run; gate run ends as usual, its scratch instance gone and the lock with
    it."""
    import os

    gate = subprocess.Popen(
        [sys.executable, "-m", "tensorless_deploy", "gate", "run", "-i", str(fleet.inventory),
         "--limit", "gpu1", "tiny", "--recipes", str(fleet.catalog)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **fleet.env},
    )  # fmt: skip
    record = "/run/tensorless-deploy/deploy.lock.who"
    try:
        deadline = time.monotonic() + 60
        while "who=gate run " not in fleet.sh("gpu1", f"cat {record}", check=False):
            assert gate.poll() is None, gate.communicate()
            assert time.monotonic() < deadline, "gate run never held gpu1's lock"
            time.sleep(0.2)
        code, report, text = fleet.deploy("--limit", "gpu1")
        out, err = gate.communicate(timeout=300)
    finally:
        gate.kill()
    assert code == 1, text
    gpu1 = _by_host(report)["gpu1"]
    assert gpu1["outcome"] == "skipped", text
    assert f"locked by another run: gate run {TINY_REPO} by " in gpu1["reason"], text
    assert f"(pid {gate.pid})" in gpu1["reason"], text
    assert "Traceback" not in err, err
    assert gate.returncode == 0, out + err
    assert "gone: unit tensorless-gate-" in out, out
    units = fleet.sh("gpu1", "systemctl list-units --all --no-legend --plain 'tensorless-gate-*'")
    assert units == "", units
    assert fleet.sh("gpu1", f"test -e {record} || echo free") == "free"


def test_maintain_begin_refuses_a_host_a_deploy_holds(fleet: Fleet) -> None:
    """maintain begin on gpu1 while a deploy is downloading there: it takes the same lock, so
    it refuses the host naming the deploy's run and opens no window (before: it wrote the
    record and held units while the deploy went on to start its own); the deploy ends
    serving, unheld."""
    _stall(fleet, "gpu1", seconds=20)
    first = fleet.start("--limit", "gpu1")
    try:
        fleet.wait_partial("gpu1")
        begun = cli(
            "maintain", "begin", "-i", str(fleet.inventory), "--limit", "gpu1",
            "--recipes", str(fleet.catalog), "--json", env=fleet.env,
        )  # fmt: skip
        code, report, text = _report(begun.returncode, begun.stdout, begun.stderr)
        assert code == 1, text
        gpu1 = _by_host(report)["gpu1"]
        assert gpu1["outcome"] == "failed", text
        assert "locked by another run: deploy tiny by " in gpu1["reason"], text
        assert f"(pid {first.pid})" in gpu1["reason"], text
        record = "/var/lib/tensorless-deploy/maintenance.json"
        assert fleet.sh("gpu1", f"test -e {record} || echo none") == "none"
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    code, report, text = _report(first.returncode, out, err)
    assert code == 0 and _by_host(report)["gpu1"]["outcome"] == "changed", text
    assert fleet.sh("gpu1", f"systemctl is-active {UNIT}") == "active"
    assert fleet.sh("gpu1", "test -e /run/tensorless-deploy/deploy.lock.who || echo free") == "free"


# ----------------------------------------------------------------------- item 4: Ctrl-C


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_an_interrupted_download_stops_and_the_rerun_resumes(
    fleet: Fleet, sig: signal.Signals
) -> None:
    """The controller is interrupted mid-download (the host's curl is stalled after 100 KB):
    Ctrl-C prints one line; on the host nothing of the run keeps running (its lock's holder
    saw EOF, the download its owner go); the immediate rerun resumes the partial and verifies
    the file (before: the orphan kept appending and the rerun's hash failed)."""
    _stall(fleet, "gpu1", seconds=600)
    run = fleet.start("--limit", "gpu1")
    try:
        fleet.wait_partial("gpu1")
        run.send_signal(sig)
        out, err = run.communicate(timeout=30)
    finally:
        run.kill()
    if sig == signal.SIGINT:
        assert run.returncode == 130
        assert err.splitlines() == ["interrupted"], err
        assert out == ""
    deadline = time.monotonic() + 10
    while (left := fleet.left_running("gpu1")) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert left == "", left[:600]
    kept = fleet.size("gpu1", fleet.paths.partial)
    time.sleep(2)
    assert fleet.size("gpu1", fleet.paths.partial) == kept >= 90_000  # nothing appends
    fleet.hf.clear_faults()
    fleet.hf.reset_stats()
    code, report, text = fleet.deploy("--limit", "gpu1")
    assert code == 0 and _by_host(report)["gpu1"]["outcome"] == "changed", text
    assert f"bytes={kept}-" in fleet.hf.stats(TINY_REPO, fleet.file).ranges
    assert fleet.blob_ok("gpu1")


def test_ctrl_c_during_a_push_is_one_line_and_the_rerun_resumes(fleet: Fleet) -> None:
    """A push slowed to 40 KB/s (an nft rate limit on gpu1's port 22), Ctrl-C two seconds in:
    one line (before: two tracebacks); the host's receive ends with the stream; the rerun
    resumes the partial it left and the file is verified."""
    h = fleet.hosts["gpu1"]
    table = "tl_slow"

    def nft(*words: str) -> None:
        subprocess.run(["ip", "netns", "exec", h.netns, "nft", *words], check=True)

    nft("add", "table", "inet", table)
    try:
        nft("add", "chain", "inet", table, "input", "{ type filter hook input priority -10 ; }")
        nft("add", "rule", "inet", table, "input", "tcp", "dport", "22",
            "limit", "rate", "over", "40", "kbytes/second", "drop")  # fmt: skip
        run = fleet.start("--limit", "gpu1", "--transfer", "push")
        try:
            fleet.wait_partial("gpu1", at_least=60_000)
            run.send_signal(signal.SIGINT)
            _out, err = run.communicate(timeout=30)
        finally:
            run.kill()
        assert run.returncode == 130 and err.splitlines() == ["interrupted"], err
        deadline = time.monotonic() + 30  # what was in flight drains at 40 KB/s, then EOF
        while (left := fleet.left_running("gpu1")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == "", left[:600]
    finally:
        subprocess.run(["ip", "netns", "exec", h.netns, "nft", "delete", "table", "inet", table])
    kept = fleet.size("gpu1", fleet.paths.partial)
    assert kept > 0
    code, report, text = fleet.deploy("--limit", "gpu1", "--transfer", "push")
    assert code == 0, text
    assert f"(resumed from {kept})" in _by_host(report)["gpu1"]["transfer"], text
    assert fleet.blob_ok("gpu1")


# ----------------------------------------------------------------------- item 5: short bodies


@pytest.mark.parametrize("kind", ["short", "html"])
def test_a_short_or_html_200_is_not_kept(fleet: Fleet, kind: str) -> None:
    """The model server answers gpu1's GETs with 200 and a 15-byte JSON body (or a sign-in
    page) for the whole run: the run fails saying why, the partial keeps nothing of it; the
    server mended, the next run serves (before: it resumed from the body, failed the hash, and
    a third run was needed)."""
    fleet.hf.add_fault(
        kind, repo_id=TINY_REPO, filename=fleet.file, clients=(fleet.hosts["gpu1"].ip,)
    )
    code, report, text = fleet.deploy("--limit", "gpu1")
    assert code == 1, text
    steps = {s["name"]: s for s in _by_host(report)["gpu1"]["steps"]}
    said = " ".join(steps["model"]["output"])
    assert steps["model"]["outcome"] == "failed" and "was not the file (HTTP 200" in said, said
    assert fleet.size("gpu1", fleet.paths.partial) == 0
    fleet.hf.clear_faults()
    code, report, text = fleet.deploy("--limit", "gpu1")
    assert code == 0 and _by_host(report)["gpu1"]["outcome"] == "changed", text
    assert fleet.blob_ok("gpu1")


# ----------------------------------------------------------------------- item 9: disk full


def test_a_disk_that_fills_mid_download_is_named(fleet: Fleet) -> None:
    """gpu1's models directory on a filesystem of its own (a tmpfs with room for the model and
    the 1 GiB margin deploy checks for), filled by something else while the download stalls:
    the report says the disk is full, which filesystem, what is free and what is needed, and
    the fix; the partial keeps what arrived, and once space is freed the rerun resumes."""
    models = DEFAULT_MODELS_DIR
    size = int(fleet.hosts_json["tiny_gguf"]["size"])
    room = size + (1 << 30) + (1 << 20)
    fleet.sh("gpu1", f"mkdir -p {models} && mount -t tmpfs -o size={room} tmpfs {models}")
    try:
        _stall(fleet, "gpu1", seconds=6)
        run = fleet.start("--limit", "gpu1")
        try:
            fleet.wait_partial("gpu1")
            free = int(fleet.sh("gpu1", f"df -Pk {models} | tail -n 1 | tr -s ' ' | cut -d' ' -f4"))
            filler = f"fallocate -l {free * 1024 - 200_000} {models}/filler"
            got = fleet.ssh("gpu1", filler, check=False)
            assert got.returncode == 0, got.stdout + got.stderr
            out, err = run.communicate(timeout=120)
        finally:
            run.kill()
        code, report, text = _report(run.returncode, out, err)
        assert code == 1, text
        steps = {s["name"]: s for s in _by_host(report)["gpu1"]["steps"]}
        said = " ".join(steps["model"]["output"])
        assert f"the disk is full: {models} (tmpfs) has " in said, said
        assert "bytes free, and the model needs " in said and f"(of {size})" in said
        assert "free space there" in said and "tensorless_models_dir" in said
        assert "run deploy again to resume from" in said
        kept = fleet.size("gpu1", fleet.paths.partial)
        assert kept >= 90_000
        fleet.sh("gpu1", f"rm -f {models}/filler")
        fleet.hf.clear_faults()
        code, report, text = fleet.deploy("--limit", "gpu1")
        assert code == 0, text
        assert fleet.blob_ok("gpu1")
    finally:
        fleet.ssh("gpu1", f"systemctl stop {UNIT}; umount {models}", check=False)
