#!/usr/bin/env python3
"""Wall time of `tensorless-deploy models --json` against `python -c pass`, side by side.

Target (issue 15): models --json <= 5x python -c pass. Interleaved rounds, medians, in three
settings:
  * bytecode cached: both interpreters read compiled bytecode, as an installed wheel does
    (pip compiles at install); here through a fresh PYTHONPYCACHEPREFIX, written on the warm-up;
  * no bytecode: a fresh copy of the package (no __pycache__ in it) imported from PYTHONPATH,
    run from its own folder, with PYTHONDONTWRITEBYTECODE=1, so this tool's modules are compiled
    on every run (site-packages keep their installed bytecode), as in a bare checkout; checked:
    the copy is what gets imported and it holds no bytecode after the runs;
  * cold catalog cache: a fresh XDG_CACHE_HOME every round, so every run validates the recipes
    in full (pydantic, the schema): what the first run after a recipe change costs.
Its work folder (the copy, the caches) is removed at the end, on an error too.
Usage: python bench/cli_startup.py [--runs 21]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hosts.benchkit import work_dir  # noqa: E402


def wall(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=cwd)
    return time.perf_counter() - t0


def bytecode_free_copy(tmp: Path) -> tuple[dict[str, str], Path]:
    """(environment additions, folder to run from) that import a fresh copy of this checkout's
    package, one with no bytecode and none ever written (its catalog beside it, as here)."""
    src = tmp / "src"
    shutil.copytree(
        ROOT / "tensorless_deploy",
        src / "tensorless_deploy",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    shutil.copytree(ROOT / "recipes", src / "recipes")
    return {"PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}, src


def check_no_bytecode(env: dict[str, str], cwd: Path) -> None:
    """The copy is the package imported there, and holds no bytecode: else exit naming it."""
    where = subprocess.run(
        [sys.executable, "-c", "import tensorless_deploy as t; print(t.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    ).stdout.strip()
    cached = sorted(cwd.rglob("*.pyc"))
    if not where.startswith(str(cwd)) or cached:
        sys.exit(f"bench: the no-bytecode case imported {where} and its copy holds {cached[:3]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    runs = ap.parse_args().runs
    bare = [sys.executable, "-c", "pass"]
    models = [sys.executable, "-m", "tensorless_deploy", "models", "--json"]
    with work_dir("cli-startup-") as tmp:
        base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE",)}
        base.pop("PYTHONPYCACHEPREFIX", None)
        base["XDG_CACHE_HOME"] = str(tmp / "xdg")
        cached = {**base, "PYTHONPYCACHEPREFIX": str(tmp / "pyc")}
        extra, copy = bytecode_free_copy(tmp)
        compiled_each_time = {**base, **extra}
        settings = {"bytecode cached": (cached, None), "no bytecode": (compiled_each_time, copy)}
        for env, cwd in settings.values():
            wall(models, env, cwd)  # warm the page cache, the bytecode cache and the catalog cache
            wall(bare, env, cwd)
        times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in settings}
        cold: list[float] = []
        for i in range(runs):  # interleaved, so drift on a noisy machine hits all alike
            for name, (env, cwd) in settings.items():
                times[name][0].append(wall(bare, env, cwd))
                times[name][1].append(wall(models, env, cwd))
            cold.append(wall(models, {**cached, "XDG_CACHE_HOME": str(tmp / f"cold-{i}")}))
        check_no_bytecode(compiled_each_time, copy)
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
