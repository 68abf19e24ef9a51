#!/usr/bin/env python3
"""Wall time of `tensorless-deploy models --json` against `python -c pass`, side by side.

Target (issue 15): models --json <= 5x python -c pass. Interleaved rounds, medians, in three
settings:
  * bytecode cached: both interpreters read compiled bytecode, as an installed wheel does
    (pip compiles at install); here through a fresh PYTHONPYCACHEPREFIX, written on the warm-up;
  * no bytecode: PYTHONDONTWRITEBYTECODE=1 and no cache, so this checkout's own modules are
    compiled on every run (site-packages keep their installed bytecode), as in a bare checkout;
  * cold catalog cache: a fresh XDG_CACHE_HOME every round, so every run validates the recipes
    in full (pydantic, the schema): what the first run after a recipe change costs.
Usage: python bench/cli_startup.py [--runs 21]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wall(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    runs = ap.parse_args().runs
    bare = [sys.executable, "-c", "pass"]
    models = [sys.executable, "-m", "tensorless_deploy", "models", "--json"]
    tmp = Path(tempfile.mkdtemp(prefix="cli-startup-"))
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE",)}
    base.pop("PYTHONPYCACHEPREFIX", None)
    base["XDG_CACHE_HOME"] = str(tmp / "xdg")
    cached = {**base, "PYTHONPYCACHEPREFIX": str(tmp / "pyc")}
    compiled_each_time = {**base, "PYTHONDONTWRITEBYTECODE": "1"}
    for env in (cached, compiled_each_time):
        wall(models, env)  # warm the page cache, the bytecode cache and the catalog cache
        wall(bare, env)
    settings = {"bytecode cached": cached, "no bytecode": compiled_each_time}
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in settings}
    cold: list[float] = []
    for i in range(runs):  # interleaved, so drift on a noisy machine hits all alike
        for name, env in settings.items():
            times[name][0].append(wall(bare, env))
            times[name][1].append(wall(models, env))
        cold.append(wall(models, {**cached, "XDG_CACHE_HOME": str(tmp / f"cold-{i}")}))
    load = os.getloadavg()[0]
    print(f"{runs} interleaved rounds, medians; load average {load:.2f}")
    for name, (a, b) in times.items():
        ma, mb = statistics.median(a), statistics.median(b)
        print(
            f"{name:16s} python -c pass {ma * 1000:6.1f} ms   models --json {mb * 1000:6.1f} ms"
            f"   ratio {mb / ma:5.2f}x  (target <= 5x)"
        )
    mb = statistics.median(cold)
    ma = statistics.median(times["bytecode cached"][0])
    print(
        f"cold catalog cache (full validation every run) models --json {mb * 1000:6.1f} ms"
        f"   ratio {mb / ma:5.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
