#!/usr/bin/env python3
"""What `run` adds on top of the server's own start, measured side by side in one run.

A: `tensorless-deploy run` from invocation to its "serving" line (image and model cached).
B: the exact container command `run --dry-run --json` prints, started bare, to /health 200.
Prints the medians and A - B, the launcher's overhead (GPU detection, decisions, cache check,
health wait). Needs the test hosts (registry, engine image) and root: it makes this machine look
like a P100 host with the same stand-ins as tests/test_local_hosts.py.
Usage: .venv/bin/python bench/run_overhead.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.hosts.fleet import tiny_recipe, write_catalog
from tests.hosts.harness import base_dir, load_hosts_json
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT
from tests.test_local_hosts import p100_standin

PORT = 18090


def healthy(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise SystemExit(f"bench: {url} never became healthy")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_args().runs
    if not (base_dir() / "hosts.json").exists():
        print("bench: no test hosts (run tests/hosts/setup.sh first); skipped")
        return 0
    hosts_json = load_hosts_json()
    tmp = Path(tempfile.mkdtemp(prefix="run-overhead-"))
    with p100_standin(tmp, hosts_json) as env_gpu, HFServer(host=hosts_json["gateway"]) as hf:
        hf.publish(
            hosts_json["tiny_gguf"]["hf_repo"],
            {hosts_json["tiny_gguf"]["hf_file"]: Path(hosts_json["tiny_gguf"]["path"])},
            commit=TINY_COMMIT,
        )
        env = {**os.environ, **env_gpu, "HF_ENDPOINT": hf.url}
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
        a, b = [], []
        for _ in range(runs):
            t0 = time.monotonic()
            p = subprocess.Popen(
                [*cli, "run", "tiny", "--recipes", cat, "--port", str(PORT)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert p.stdout is not None
            while not p.stdout.readline().startswith("serving"):
                if p.poll() is not None:
                    raise SystemExit("bench: run exited early")
            a.append(time.monotonic() - t0)
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=60)
            t0 = time.monotonic()
            q = subprocess.Popen(
                command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            healthy(url, t0 + 120)
            b.append(time.monotonic() - t0)
            subprocess.run(
                [command[0], "stop", "-t", "5", "tensorless-tiny-p100"],
                env=env,
                capture_output=True,
                timeout=60,
            )
            q.wait(timeout=60)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"run to 'serving' (launcher + server)   median {ma:6.2f} s  (n={runs})")
    print(f"bare container command to /health 200 median {mb:6.2f} s  (n={runs})")
    print(f"launcher overhead                             {ma - mb:6.2f} s  (target <= 0.3 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
