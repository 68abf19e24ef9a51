"""Run the unit tests as several pytest processes side by side (./check's unit step).

    python tests/run_units.py [--shards N] [-- PYTEST_ARGS...]

Most unit tests run the CLI as a subprocess (a second of imports each), so one pytest keeps one
of two cores busy. The test files are split between N processes (default TL_UNIT_SHARDS or 2)
longest first, by the seconds recorded in tests/unit_durations.json (the same split as the
host sets', tests/hosts/run_sets.py; a file not listed counts as the median), each process's
output printed whole when it ends. Exit 0 only when every process passed. Unit tests use
temporary directories and free ports only, so two processes never share a file or a port.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.hosts.run_sets import split  # noqa: E402

DURATIONS = REPO / "tests" / "unit_durations.json"
NO_TESTS = 5  # pytest's exit status when a process selected no test (all its files are hosts')


def main() -> int:
    ap = argparse.ArgumentParser(prog="run_units.py")
    ap.add_argument("--shards", type=int, default=int(os.environ.get("TL_UNIT_SHARDS", "2")))
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args()
    python = os.environ.get("PY", sys.executable)
    known: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py"))
    groups = [g for g in split(files, max(1, args.shards), known) if g]
    t0 = time.monotonic()
    procs = []
    with tempfile.TemporaryDirectory(prefix="tl-units-") as tmp:
        for k, group in enumerate(groups):
            log = Path(tmp) / f"shard-{k}.log"
            with log.open("wb") as out:
                cmd = [python, "-m", "pytest", "-q", *args.pytest_args, *sorted(group)]
                procs.append((k, subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=out), log))
        failed = []
        for k, p, log in procs:
            rc = p.wait()
            print(f"== unit shard {k}: pytest exit {rc} after {time.monotonic() - t0:.0f} s")
            sys.stdout.write(log.read_text(errors="replace"))
            sys.stdout.flush()
            if rc not in (0, NO_TESTS):
                failed.append(k)
    print(f"== unit shards: {len(procs)}; " + (f"FAILED: {failed}" if failed else "all passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
