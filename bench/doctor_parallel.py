#!/usr/bin/env python3
"""Wall time of `tensorless-deploy doctor -i INV` over 1 test host against all test hosts.

doctor surveys every host in parallel, so N hosts should cost about what one costs. Uses the
real test hosts (docs/test-hosts.md); skips with a message (exit 0) when BASE/hosts.json is
missing. Other sessions may share the hosts: run it under their lock, e.g.

    flock /var/tmp/tensorless-hosts.lock .venv/bin/python bench/doctor_parallel.py [--runs 7]

Prints the medians of interleaved runs and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hosts.fleet import write_inventory  # noqa: E402
from tests.hosts.harness import Host, base_dir, load_hosts_json  # noqa: E402


def wall(inventory: Path) -> float:
    cmd = [sys.executable, "-m", "tensorless_deploy", "doctor", "-i", str(inventory), "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    if proc.returncode not in (0, 1):  # 1: some host not ready, still a full survey
        sys.exit(f"doctor failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    runs = ap.parse_args().runs
    base = base_dir()
    if not (base / "hosts.json").is_file():
        print(
            f"skipped: test hosts are not set up ({base}/hosts.json missing); run "
            "`sudo bash tests/hosts/setup.sh` first"
        )
        return 0
    hosts = [Host.from_json(h) for h in load_hosts_json(base)["hosts"]]
    with tempfile.TemporaryDirectory() as tmp:
        one = write_inventory(Path(tmp) / "one.py", hosts[:1])
        every = write_inventory(Path(tmp) / "all.py", hosts)
        wall(one), wall(every)  # warm the page cache and bytecode
        a: list[float] = []
        b: list[float] = []
        for _ in range(runs):  # interleaved, so drift on a noisy machine hits both alike
            a.append(wall(one))
            b.append(wall(every))
    ma, mb = statistics.median(a), statistics.median(b)
    n = len(hosts)
    print(f"doctor, 1 host ({hosts[0].name})      median {ma * 1000:7.0f} ms  (n={runs})")
    print(
        f"doctor, {n} hosts ({', '.join(h.name for h in hosts)})  "
        f"median {mb * 1000:7.0f} ms  (n={runs})"
    )
    print(
        f"ratio {n} hosts / 1 host   {mb / ma:.2f}x  "
        f"(1.00x: fully parallel; {n}.00x: one host after another)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
