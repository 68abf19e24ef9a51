"""deploy --serial on real hosts: on four, the third host's new unit fails its health check for
real (a corrupted model file that passed verification earlier), the roll stops there; on a host
with two cards, --serial 1 rolls instance by instance (the second serves while the first
restarts, a front door's calls in order around each); a busy instance is restarted only once its
request in flight finished, and a wait that times out says so."""

from __future__ import annotations

import datetime
import hashlib
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.hub import DEFAULT_MODELS_DIR, host_state_dir
from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner
from tests.hosts.tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.hosts

V2_FILE = "tiny-llama-v2.gguf"
REPO_DIR = "/var/lib/tensorless/models/models--tensorless-test--tiny-llama-GGUF"


def test_roll_stops_at_the_first_failed_host(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    hf: HFServer,
    ssh: SshRunner,
    profile: Any,
    clean_hosts: None,
) -> None:
    names = ["gpu1", "gpu2", "gpu3", "legacy1"]
    if any(n not in test_hosts for n in names):
        pytest.skip("needs four hosts: tests/hosts/setup.sh 3 (./check all boots them)")
    profile("gpu2", "p100")
    v2 = tmp_path / V2_FILE
    write_tiny_gguf(str(v2), seed=7)
    v2_bytes = v2.read_bytes()
    v2_sha = hashlib.sha256(v2_bytes).hexdigest()
    tiny = Path(hosts_json["tiny_gguf"]["path"])
    hf.publish(
        TINY_REPO, {hosts_json["tiny_gguf"]["hf_file"]: tiny, V2_FILE: v2}, commit=TINY_COMMIT
    )
    inventory = write_inventory(tmp_path / "inventory.py", [test_hosts[n] for n in names])
    catalog = tmp_path / "recipes"
    env = {"HF_ENDPOINT": hf.url}
    base = ["deploy", "-i", str(inventory), "tiny", "--recipes", str(catalog), "--json"]

    write_catalog(catalog, tiny_recipe(hosts_json, TINY_COMMIT))
    first = cli(*base, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    old = {h["host"]: h["recipe_digest"] for h in json.loads(first.stdout)["hosts"]}

    new_recipe = tiny_recipe(hosts_json, TINY_COMMIT)
    new_recipe["model"].update(file=V2_FILE, sha256=v2_sha, size_bytes=len(v2_bytes))
    write_catalog(catalog, new_recipe)
    # gpu3 already "has" the v2 file, verified earlier, and it has rotted since: same size and
    # mtime as its stamp says, so deploy trusts it, and llama-server cannot load it
    blob = f"{REPO_DIR}/blobs/{v2_sha}"
    stamp = f"{host_state_dir(DEFAULT_MODELS_DIR)}/verified/{v2_sha}"  # where deploy stamps
    ssh(
        "gpu3",
        f"mkdir -p {REPO_DIR}/blobs $(dirname {stamp}) && "
        f"head -c {len(v2_bytes)} /dev/urandom > {blob} && "
        f"echo \"$(stat -c '%s %Y' {blob}) {blob}\" > {stamp}",
    )

    proc = cli(*base, "--serial", "1", env=env)
    assert proc.returncode == 1
    hosts = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert [hosts[n]["outcome"] for n in names] == ["changed", "changed", "failed", "untouched"]
    new = hosts["gpu1"]["recipe_digest"]
    assert new != old["gpu1"]
    assert hosts["gpu1"]["serving_digest"] == new and hosts["gpu2"]["serving_digest"] == new
    assert hosts["gpu3"]["serving_digest"] == old["gpu3"]  # restored, healthy on the old recipe
    assert hosts["legacy1"]["serving_digest"] == old["legacy1"]  # untouched
    failed = hosts["gpu3"]["steps"]
    out = " ".join(line for s in failed for line in s["output"])
    assert "restored the previous unit; it is healthy again" in out


ROOT = Path(__file__).resolve().parent.parent
BASE = "tensorless-tiny-p100"
OPEN = {"tensorless_bind": "0.0.0.0", "tensorless_insecure_open": True}  # reached from here


def _complete(ip: str, port: int, body: dict[str, Any], timeout: float = 10) -> bytes:
    """One POST /v1/completions straight to an instance, its whole answer (raises on failure:
    a refused or dropped connection, a status other than 200)."""
    conn = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise OSError(f"HTTP {r.status}")
        return data
    finally:
        conn.close()


class Poller(threading.Thread):
    """Short completions to one instance, one after another, each recorded (start, end, ok)."""

    def __init__(self, ip: str, port: int) -> None:
        super().__init__(daemon=True)
        self.ip, self.port = ip, port
        self.seen: list[tuple[float, float, bool]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            t0 = time.time()
            try:
                _complete(self.ip, self.port, {"prompt": "hi", "max_tokens": 1}, timeout=5)
                ok = True
            except (OSError, http.client.HTTPException):
                ok = False
            self.seen.append((t0, time.time(), ok))
            if not ok:
                time.sleep(0.2)

    def within(self, start: float, end: float) -> list[bool]:
        """Every request that overlapped [start, end] (one wholly inside a short window may be
        none at all on a loaded machine: a CI run saw that)."""
        return [ok for t0, t1, ok in self.seen if t1 >= start and t0 <= end]

    def failed_between(self) -> tuple[float, float]:
        bad = [(t0, t1) for t0, t1, ok in self.seen if not ok]
        assert bad, f"port {self.port}: no request failed: it never went down"
        return bad[0][0], bad[-1][1]


def _started(ssh: SshRunner, host: str, name: str) -> float:
    """When the instance's container started, read from the host (podman's StartedAt)."""
    text = ssh(host, f"podman inspect --format '{{{{.State.StartedAt}}}}' {name}").stdout.strip()
    day, clock, *_ = text.split()
    whole, _, frac = clock.partition(".")
    at = datetime.datetime.fromisoformat(f"{day}T{whole}+00:00")
    return at.timestamp() + float(f"0.{frac or 0}")


def _restart_output(report: dict[str, Any], step: str) -> str:
    (host,) = report["hosts"]
    return "\n".join(line for s in host["steps"] if s["name"] == step for line in s["output"])


def test_serial_one_rolls_a_two_card_host_instance_by_instance(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    hf: HFServer,
    ssh: SshRunner,
    profile: Any,
    clean_hosts: None,
) -> None:
    gpu1 = gpu_hosts[0]
    profile(gpu1, "p100x2")
    inventory = write_inventory(tmp_path / "inventory.py", [gpu1], data={gpu1.name: OPEN})
    catalog = tmp_path / "recipes"
    env = {"HF_ENDPOINT": hf.url}
    write_catalog(catalog, tiny_recipe(hosts_json, TINY_COMMIT))
    first = cli("deploy", "-i", str(inventory), "tiny", "--recipes", str(catalog), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    write_catalog(catalog, tiny_recipe(hosts_json, TINY_COMMIT, context=2048))  # both change

    pollers = {port: Poller(gpu1.ip, port) for port in (8080, 8081)}
    for p in pollers.values():
        p.start()
    time.sleep(1)
    try:  # in this process's child: the roll with a door that records its calls
        proc = cli_door("deploy", inventory, catalog, env)
    finally:
        time.sleep(1)
        for p in pollers.values():
            p.done.set()
            p.join(timeout=10)
    assert proc["ok"], proc
    events = [(e["what"], e["port"]) for e in proc["events"]]
    assert events == [
        ("take_out", 8080),
        ("put_back", 8080),
        ("take_out", 8081),
        ("put_back", 8081),
    ]
    # taken out while it still served, put back once it served again
    assert all(e["health"] == 200 for e in proc["events"]), proc["events"]
    out0, back0, out1, back1 = (e["t"] for e in proc["events"])
    # the order as the host has it: each container started between its own take_out and
    # put_back, the second only once the first was back
    started0 = _started(ssh, gpu1.name, BASE)
    started1 = _started(ssh, gpu1.name, f"{BASE}-1")
    assert out0 < started0 < back0 <= out1 < started1 < back1, (proc["events"], started0, started1)
    # the first instance really went down, and the second served all through it
    down0 = pollers[8080].failed_between()
    assert out0 <= down0[0] and down0[1] <= back0 + 1, (down0, out0, back0)
    during = pollers[8081].within(*down0)
    assert during and all(during), f"8081 while 8080 restarted: {during}"
    down1 = pollers[8081].failed_between()
    assert down1[0] >= back0, "the second instance went down before the first was back"
    assert pollers[8080].within(*down1) and all(pollers[8080].within(*down1))
    (host,) = proc["hosts"]
    drains = [line for s in host["steps"] for line in s["output"] if line.startswith("drain:")]
    assert len(drains) == 2 and all("idle" in d for d in drains), drains

    # rollback: the same door calls around each unit's swap, one unit at a time (in the order
    # the host lists its units)
    back = cli_door("rollback", inventory, catalog, env)
    assert back["ok"], back
    swapped = [(e["what"], e["port"]) for e in back["events"]]
    a, b = swapped[0][1], swapped[2][1]
    assert swapped == [("take_out", a), ("put_back", a), ("take_out", b), ("put_back", b)]
    assert {a, b} == {8080, 8081}
    assert all(e["health"] == 200 for e in back["events"]), back["events"]
    # stop: every unit taken out, while it still served, before any is removed
    gone = cli_door("stop", inventory, catalog, env)
    assert gone["ok"], gone
    assert sorted((e["what"], e["port"], e["health"]) for e in gone["events"]) == [
        ("take_out", 8080, 200),
        ("take_out", 8081, 200),
    ]
    (host,) = gone["hosts"]
    assert any(s["name"] == "door" for s in host["steps"]), host


def cli_door(command: str, inventory: Path, catalog: Path, env: dict[str, str]) -> dict[str, Any]:
    """tests/hosts/roll_door.py: COMMAND in a process of its own, with a door that records."""
    import os
    import subprocess

    argv = [sys.executable, "-m", "tests.hosts.roll_door", command, str(inventory), str(catalog)]
    proc = subprocess.run(
        [*argv, "tiny"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", **env},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found: dict[str, Any] = json.loads(proc.stdout)
    return found


# a stream until the context is full: 2 to 20 s of generation on the test hosts' CPU (2,200
# tokens/s on an idle machine, 175 under a loaded one) on the recipe's one slot (-np 1). Busy
# keeps one in flight, the next sent as one ends, until the deploy is seen at its restart on
# the host and then some: the instance is busy when the drain begins and while it reads,
# however long the deploy took to reach it
LONG = {"prompt": "Once upon a time", "max_tokens": 10000, "stream": True, "ignore_eos": True}
CONTEXTS = (4096, 3968, 3840)  # each a change of the recipe
# the restart's script running on the host, about to drain (unit-activate, in its sh -c:
# "${was:-$url}" is in no other script); the class keeps the probe's own shell, whose text
# says wa[s]:-, from matching itself
DRAINING = "pgrep -f 'wa[s]:-' >/dev/null"


class LongStream:
    """One long streaming completion: how it ended and when."""

    def __init__(self, ip: str, port: int) -> None:
        self.error: str | None = None
        self.text = b""
        self.began = time.time()
        try:
            self.text = _complete(ip, port, LONG, timeout=600)
        except (OSError, http.client.HTTPException) as exc:
            self.error = repr(exc)
        self.ended = time.time()

    @property
    def finished(self) -> bool:
        return self.error is None and b"[DONE]" in self.text


class Busy(threading.Thread):
    """Long streams to one instance one after another (one always in flight) until released;
    the one in flight then runs to its end."""

    def __init__(self, ip: str, port: int) -> None:
        super().__init__(daemon=True)
        self.ip, self.port = ip, port
        self.streams: list[LongStream] = []
        self.released = threading.Event()

    def run(self) -> None:
        while not self.released.is_set():
            self.streams.append(LongStream(self.ip, self.port))


def _deploy_while_busy(
    args: list[str], env: dict[str, str], ip: str, ssh: SshRunner, host: str, hold_s: float
) -> tuple[subprocess.CompletedProcess[str], list[LongStream]]:
    """deploy ARGS while the instance is busy; the load released hold_s after the restart's
    script is seen on the host (0: once the deploy ended), then the deploy's result and every
    stream, each ended."""
    busy = Busy(ip, 8080)
    busy.start()
    _busy(ip, 8080)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorless_deploy", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", **env},
    )
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        if ssh(host, DRAINING, check=False).returncode == 0:
            break
        time.sleep(0.3)
    if hold_s:
        time.sleep(hold_s)
        busy.released.set()
    out, err = proc.communicate(timeout=600)
    busy.released.set()
    busy.join(timeout=600)
    return subprocess.CompletedProcess(args, proc.returncode, out, err), busy.streams


def _busy(ip: str, port: int) -> None:
    """Until the instance says (/slots) that a slot is processing."""
    deadline = time.time() + 30
    while time.time() < deadline:
        conn = http.client.HTTPConnection(ip, port, timeout=5)
        conn.request("GET", "/slots")
        slots = json.loads(conn.getresponse().read())
        conn.close()
        if any(s.get("is_processing") for s in slots):
            return
        time.sleep(0.2)
    raise AssertionError("the long request never showed in /slots")


def test_a_busy_instance_restarts_once_idle_and_a_timeout_says_so(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    hf: HFServer,
    ssh: SshRunner,
    clean_hosts: None,
) -> None:
    gpu1 = gpu_hosts[0]
    inventory = write_inventory(tmp_path / "inventory.py", [gpu1], data={gpu1.name: OPEN})
    catalog = tmp_path / "recipes"
    env = {"HF_ENDPOINT": hf.url}
    base = ["deploy", "-i", str(inventory), "tiny", "--recipes", str(catalog), "--json"]
    write_catalog(catalog, tiny_recipe(hosts_json, TINY_COMMIT, context=CONTEXTS[0]))
    first = cli(*base, env=env)
    assert first.returncode == 0, first.stdout + first.stderr

    # a long stream in flight when the drain begins: the restart waits for it, each ends whole
    write_catalog(catalog, tiny_recipe(hosts_json, TINY_COMMIT, context=CONTEXTS[1]))
    args = [*base, "--serial", "1", "--drain-timeout", "300"]
    # held 3 s past the restart's start: the drain has read it busy, then waits for the last
    proc, streams = _deploy_while_busy(args, env, gpu1.ip, ssh, gpu1.name, 3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(s.finished for s in streams), [s.error for s in streams]
    said = _restart_output(json.loads(proc.stdout), "restart")
    assert "drain: idle after" in said and "(1 requests were in flight)" in said, said
    last = max(s.ended for s in streams)
    assert _started(ssh, gpu1.name, BASE) >= last - 1  # restarted once the last one ended

    # the same with a bound too short for it: restarted anyway, and the report says so
    write_catalog(catalog, tiny_recipe(hosts_json, TINY_COMMIT, context=CONTEXTS[2]))
    args = [*base, "--drain-timeout", "2"]
    # busy until the deploy ended: in flight when the drain's bound runs out
    proc, streams = _deploy_while_busy(args, env, gpu1.ip, ssh, gpu1.name, 0)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = _restart_output(json.loads(proc.stdout), "restart")
    assert "drain: restarted with 1 requests in flight after 2s (drain timeout 2s)" in said, said
    started = _started(ssh, gpu1.name, BASE)
    cut = [s for s in streams if not s.finished]
    assert cut, "no stream was cut, yet the report said one was in flight at the restart"
    # only what was in flight across the restart was cut: each that finished ended before the
    # new instance started, or began once it served
    spans = [(s.began, s.ended) for s in streams if s.finished]
    assert all(end <= started + 1 or began >= started - 1 for began, end in spans), spans
