#!/usr/bin/env python3
"""What `run` adds on top of the server's own start, measured inside one run so that the
server's start, which varies by more than the target, drops out of the difference.

Each round starts `tensorless-deploy run` (image and model cached) and takes:
  A: invocation to its "serving" line, from outside;
  S: the same server's start as the tool itself times it (its container command started to
     /health 200: the "healthy after S s" of that line, printed to 0.1 s);
so A - S is the launcher's overhead in that very run (interpreter, imports, decisions, image and
cache checks before the container starts; the device check after /health answers), with the
0.1 s rounding of S its only error (+-0.05 s). Then, in the same round, the exact container
command `run --dry-run --json` prints, started bare to /health 200 (B), for the side-by-side
A - B the bench printed before (two noisy starts subtracted: shown to compare, not the figure).
Prints the median of the per-round overheads, their quartiles and range, over --runs rounds.
Needs the test hosts (registry, engine image) and root: it makes this machine look like a P100
host with the same stand-ins as tests/test_local_hosts.py. Its port on this machine is 18090 +
10 x TL_SET (tests/hosts/benchkit.py), its work folder under the set's BASE, removed at the end;
the tool runs with its bytecode cached there, as an installed wheel does (the pull compiles it).
Usage: .venv/bin/python bench/run_overhead.py [--runs 11]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.hosts.benchkit import cached_bytecode, set_port, spread, work_dir
from tests.hosts.fleet import tiny_recipe, write_catalog
from tests.hosts.harness import base_dir, load_hosts_json
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT
from tests.test_local_hosts import p100_standin

PORT = set_port(18090)
SERVING = re.compile(r"^serving .* \(healthy after ([0-9.]+) s")


def healthy(url: str, deadline: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"bench: the bare container command exited {proc.returncode}: {tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise SystemExit(
        f"bench: {url} never became healthy: {log.read_text(errors='replace')[-2000:]}"
    )


def serve_once(cli: list[str], env: dict[str, str]) -> tuple[float, float]:
    """One `run` to its serving line, then stopped: (A, S) as the module docstring says."""
    t0 = time.monotonic()
    p = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdout is not None
    try:
        while not (m := SERVING.match(p.stdout.readline())):
            if p.poll() is not None:
                raise SystemExit("bench: run exited before serving")
        return time.monotonic() - t0, float(m.group(1))
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)


def bare_once(command: list[str], env: dict[str, str], url: str, log: Path) -> float:
    """The container command alone, to /health 200, then stopped: B (its output into log)."""
    with log.open("wb") as out:
        t0 = time.monotonic()
        q = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        healthy(url, t0 + 120, q, log)
        return time.monotonic() - t0
    finally:
        subprocess.run(
            [command[0], "stop", "-t", "5", command[command.index("--name") + 1]],
            env=env,
            capture_output=True,
            timeout=60,
        )
        q.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    runs = ap.parse_args().runs
    if not (base_dir() / "hosts.json").exists():
        print("bench: no test hosts (run tests/hosts/setup.sh first); skipped")
        return 0
    hosts_json = load_hosts_json()
    with (
        work_dir("run-overhead-", base_dir()) as tmp,
        p100_standin(tmp, hosts_json) as env_gpu,
        HFServer(host=hosts_json["gateway"]) as hf,
    ):
        hf.publish(
            hosts_json["tiny_gguf"]["hf_repo"],
            {hosts_json["tiny_gguf"]["hf_file"]: Path(hosts_json["tiny_gguf"]["path"])},
            commit=TINY_COMMIT,
        )
        env = {**os.environ, **env_gpu, "HF_ENDPOINT": hf.url, **cached_bytecode(tmp)}
        cat = str(write_catalog(tmp / "recipes", tiny_recipe(hosts_json, TINY_COMMIT)))
        cli = [sys.executable, "-m", "tensorless_deploy"]
        subprocess.run(
            [*cli, "pull", "tiny", "--recipes", cat],
            env=env,
            check=True,
            capture_output=True,
            timeout=600,
        )
        dry = subprocess.run(
            [*cli, "run", "tiny", "--recipes", cat, "--port", str(PORT), "--dry-run", "--json"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        command = json.loads(dry.stdout)["command"]
        url = f"http://127.0.0.1:{PORT}/health"
        run = [*cli, "run", "tiny", "--recipes", cat, "--port", str(PORT)]
        a, s, b = [], [], []
        for _ in range(runs):  # interleaved: drift on a noisy machine hits both alike
            ai, si = serve_once(run, env)
            a.append(ai)
            s.append(si)
            b.append(bare_once(command, env, url, tmp / "bare.log"))
    over = [ai - si for ai, si in zip(a, s, strict=True)]
    med, q1, q3 = spread(over)
    print(f"{runs} rounds; load average {os.getloadavg()[0]:.2f}")
    print(f"run to 'serving' (launcher + server) A    median {statistics.median(a):6.2f} s")
    print(f"its server's start, as run times it, S    median {statistics.median(s):6.2f} s")
    print(f"bare container command to /health 200, B  median {statistics.median(b):6.2f} s")
    print(
        f"launcher overhead, A - S per round         median {med:6.2f} s  quartiles "
        f"{q1:.2f}-{q3:.2f}  range {min(over):.2f}-{max(over):.2f}  (target <= 0.3 s; "
        "S to 0.1 s)"
    )
    diff = [ai - bi for ai, bi in zip(a, b, strict=True)]
    dm, d1, d3 = spread(diff)
    print(
        f"for comparison, A - B per round           median {dm:6.2f} s  quartiles "
        f"{d1:.2f}-{d3:.2f}  (two separate starts: their noise adds)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
