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
And the converged re-run's import cost (issue 30: a converged deploy within 1.3x a bare
`pyinfra fact` pass): interleaved, `python -c "import <the deploy path>"` (what `deploy` imports
before its first connection: the command line, fleet.deploy and the modules cmd_deploy imports,
pyinfra's inventory loader) against `python -c "import pyinfra_cli.main"` (what the bare pyinfra
pass imports before its own), bytecode cached; the difference is what the tool's imports add to
a re-run whose SSH is one round trip, and which heavy packages the deploy path loads.
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
    converged_imports(runs, cached)
    return 0


# What `deploy` imports before it connects (cli.deploy.cmd_deploy's own imports, and
# fleet.inventory.load_inventory's pyinfra loader), and what `pyinfra INVENTORY fact ...` does.
DEPLOY_PATH = (
    "import tensorless_deploy.cli, tensorless_deploy.cli.deploy, tensorless_deploy.fleet.deploy, "
    "tensorless_deploy.fleet.inventory, tensorless_deploy.fleet.status, tensorless_deploy.hub, "
    "pyinfra_cli.inventory, pyinfra.api.state"
)
PYINFRA_CLI = "import pyinfra_cli.main"
HEAVY = ("numpy", "gguf", "jinja2", "huggingface_hub", "pydantic", "yaml", "paramiko", "gevent")


def cpu(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one run: on a shared machine the CPU seconds are
    the steadier figure (the wall time includes waiting for a core)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{cmd[-1]!r} failed")
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def converged_imports(runs: int, env: dict[str, str]) -> None:
    ours = [sys.executable, "-c", DEPLOY_PATH]
    theirs = [sys.executable, "-c", PYINFRA_CLI]
    cpu(ours, env)
    cpu(theirs, env)
    a: list[tuple[float, float]] = []
    b: list[tuple[float, float]] = []
    for _ in range(runs):
        a.append(cpu(theirs, env))
        b.append(cpu(ours, env))
    probe = f"{DEPLOY_PATH}; import sys; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, env=env
    ).stdout.split()
    for n, what in enumerate(("wall", "CPU")):
        ma, mb = statistics.median(x[n] for x in a), statistics.median(x[n] for x in b)
        print(
            f"converged re-run imports ({what}): pyinfra's CLI {ma * 1000:6.1f} ms, the deploy "
            f"path {mb * 1000:6.1f} ms: the tool adds {(mb - ma) * 1000:6.1f} ms "
            f"({mb / ma:4.2f}x)"
        )
    print(
        "  (target: the whole converged re-run <= 1.3x a bare pyinfra fact pass); heavy "
        f"packages the deploy path loads: {', '.join(loaded) or 'none'}"
    )


if __name__ == "__main__":
    sys.exit(main())
