#!/usr/bin/env python3
"""Wall time of `tensorless-deploy doctor -i INV` (or `status`) over each test host alone
against the same hosts all at once.

doctor and status survey every host in parallel, so N hosts should cost about what one costs.
Like with like: the N-host run covers exactly the hosts timed alone (gpu1..gpuN, --hosts N;
default every GPU host of the set, never legacy1 or persist1, which run other checks), with the
same command and the same catalog, so the ratio is N hosts at once against the slowest of them
alone (a parallel survey cannot beat its slowest host) and against their median. Uses the real
test hosts (docs/test-hosts.md) of TL_SET; skips with a message (exit 0) when BASE/hosts.json is
missing; its inventories (and the tool's bytecode, cached as an installed wheel has it) live
in a work folder removed at the end. Beside it, interleaved, the survey script alone, timed on
the hosts (no SSH session, no tool): one host, then all at once, so that what the hosts' own
probes add when they share this machine's cores is told apart from what the tool adds. Other
sessions may share the hosts: run it under their lock, e.g.

    flock /var/tmp/tensorless-hosts.lock .venv/bin/python bench/doctor_parallel.py \
        [--runs 7] [--hosts 4] [--command status]

Prints the medians of interleaved runs and the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hosts.benchkit import bare_surveys, cached_bytecode, gpu_hosts, work_dir  # noqa: E402
from tests.hosts.fleet import write_inventory  # noqa: E402
from tests.hosts.harness import base_dir, load_hosts  # noqa: E402


def wall(command: str, inventory: Path) -> float:
    cmd = [sys.executable, "-m", "tensorless_deploy", command, "-i", str(inventory), "--json"]
    env = {**os.environ, **cached_bytecode(inventory.parent)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, env=env)
    took = time.perf_counter() - t0
    # doctor 1: some host not ready; status 1, 3, 4: not serving, drift, nothing served: all of
    # them a full survey
    if proc.returncode not in (0, 1, 3, 4):
        sys.exit(f"{command} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--hosts", type=int, default=0, help="gpu1..gpuN (default: every GPU host)")
    ap.add_argument("--command", choices=("doctor", "status"), default="doctor")
    opts = ap.parse_args()
    base = base_dir()
    if not (base / "hosts.json").is_file():
        print(
            f"skipped: test hosts are not set up ({base}/hosts.json missing); run "
            "`sudo bash tests/hosts/setup.sh` first"
        )
        return 0
    hosts = gpu_hosts(load_hosts(base), opts.hosts)
    with work_dir("doctor-parallel-", base) as tmp:
        alone = {h.name: write_inventory(tmp / f"{h.name}.py", [h]) for h in hosts}
        every = write_inventory(tmp / "all.py", hosts)
        for inv in (*alone.values(), every):  # warm the page cache and bytecode
            wall(opts.command, inv)
        one: dict[str, list[float]] = {name: [] for name in alone}
        together: list[float] = []
        survey_one: list[float] = []
        survey_all: list[float] = []
        for _ in range(opts.runs):  # interleaved, so drift on a noisy machine hits all alike
            for name, inv in alone.items():
                one[name].append(wall(opts.command, inv))
            together.append(wall(opts.command, every))
            survey_one += [bare_surveys([h]) for h in hosts]
            survey_all.append(bare_surveys(hosts))
    med = statistics.median
    singles = {name: med(v) for name, v in one.items()}
    slowest = max(singles.values())
    mb = med(together)
    n = len(hosts)
    print(f"{opts.command}, each host alone (median of {opts.runs}):")
    for name, t in singles.items():
        print(f"  {name:8s} {t * 1000:7.0f} ms")
    print(f"{opts.command}, all {n} at once ({', '.join(singles)})  {mb * 1000:7.0f} ms")
    print(
        f"ratio {n} hosts / slowest alone {mb / slowest:.2f}x, / median alone "
        f"{mb / med(singles.values()):.2f}x  (1.00x: fully parallel; {n}.00x: one after another)"
    )
    s1, sn = med(survey_one), med(survey_all)
    print(
        f"the survey alone on the hosts (its shell and probes, no SSH, no tool): one host "
        f"{s1 * 1000:.0f} ms, {n} at once {sn * 1000:.0f} ms (the last to finish): "
        f"{sn / s1:.2f}x, {(sn - s1) * 1000:.0f} ms more"
    )
    what = "" if opts.command == "doctor" else " (the first of status's reads; its units next)"
    print(
        f"  so of the {(mb - med(singles.values())) * 1000:.0f} ms the {n}-host run adds, "
        f"{(sn - s1) * 1000:.0f} ms are the survey's own probes{what} on hosts sharing this "
        f"machine's {os.cpu_count()} cores (separate machines do not share them)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
