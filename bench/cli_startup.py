#!/usr/bin/env python3
"""Wall time of `tensorless-deploy models --json` against `python -c pass`, side by side.

Prints the medians and their ratio. Usage: python bench/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    runs = ap.parse_args().runs
    bare = [sys.executable, "-c", "pass"]
    models = [sys.executable, "-m", "tensorless_deploy", "models", "--json"]
    wall(models)  # warm the page cache and bytecode
    a: list[float] = []
    b: list[float] = []
    for _ in range(runs):  # interleaved, so drift on a noisy machine hits both alike
        a.append(wall(bare))
        b.append(wall(models))
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"python -c pass          median {ma * 1000:7.1f} ms  (n={runs})")
    print(f"models --json           median {mb * 1000:7.1f} ms  (n={runs})")
    print(f"ratio models/bare       {mb / ma:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
