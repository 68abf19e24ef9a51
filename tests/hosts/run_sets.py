"""Run the host tests on several host sets side by side (./check all; docs/test-hosts.md).

    python tests/hosts/run_sets.py [--sets N] [--first S] [-- PYTEST_ARGS...]

Boots sets S..S+N-1 (tests/hosts/setup.sh 3, one after another: they share the rootfs trees),
splits the host test files between them, longest first by the seconds recorded in
tests/hosts/durations.json (a file not listed counts as the median), runs one pytest per set at
once, prints each set's output whole when it ends, and tears every set down on every way out.
Exit 0 only when every set's pytest passed. Each run writes the seconds it measured per file to
BASE/logs/durations.json of the first set, to refresh the committed table by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DURATIONS = HERE / "durations.json"


def host_test_files(python: str) -> list[str]:
    """The files that hold host tests, as pytest collects them (-m hosts)."""
    out = subprocess.run(
        [python, "-m", "pytest", "--collect-only", "-q", "-m", "hosts", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    files = sorted({line.split("::", 1)[0] for line in out.stdout.splitlines() if "::" in line})
    if not files:
        sys.exit(f"run_sets: pytest collected no host tests:\n{out.stdout}{out.stderr}")
    return files


# Files that use this machine itself, not only their set's hosts: the P100 stand-in's device
# nodes and CDI spec under /dev and /var/run/cdi, and fixed local ports (run, serve). Two sets
# must not run them at once, so they go to one set together.
THIS_MACHINE = ("tests/test_local_hosts.py", "tests/test_security_hosts.py")


def split(files: list[str], sets: int, seconds: dict[str, float]) -> list[list[str]]:
    """Longest processing time first: each file (THIS_MACHINE's as one) to the set with the
    least work so far."""
    default = statistics.median(seconds.values()) if seconds else 60.0
    together = tuple(f for f in THIS_MACHINE if f in files)
    units = [(f,) for f in files if f not in together] + ([together] if together else [])

    def cost(unit: tuple[str, ...]) -> float:
        return sum(seconds.get(f, default) for f in unit)

    groups: list[list[str]] = [[] for _ in range(sets)]
    load = [0.0] * sets
    for unit in sorted(units, key=lambda u: (-cost(u), u)):
        k = load.index(min(load))
        groups[k].extend(unit)
        load[k] += cost(unit)
    return groups


def base_of(s: int) -> Path:
    return Path("/var/tmp/tensorless-hosts" if s == 0 else f"/var/tmp/tensorless-hosts-{s}")


def main() -> int:
    ap = argparse.ArgumentParser(prog="run_sets.py")
    ap.add_argument("--sets", type=int, default=int(os.environ.get("TL_HOST_SETS", "3")))
    ap.add_argument("--first", type=int, default=int(os.environ.get("TL_SET", "0") or 0))
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args()
    if args.sets < 1 or args.first < 0 or args.first + args.sets > 8:
        sys.exit(f"run_sets: sets {args.first}..{args.first + args.sets - 1} are not within 0..7")
    python = os.environ.get("PY", str(REPO / ".venv" / "bin" / "python"))
    known: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    files = host_test_files(python)
    groups = [g for g in split(files, args.sets, known) if g]
    sets = list(range(args.first, args.first + len(groups)))
    env = {k: v for k, v in os.environ.items() if k != "TL_SET"}
    procs: list[tuple[int, list[str], subprocess.Popen[bytes], Path, float]] = []
    try:
        for s in sets:
            print(f"== host set {s}: setup", flush=True)
            subprocess.run(
                ["bash", str(HERE / "setup.sh"), "3"], env={**env, "TL_SET": str(s)}, check=True
            )
        for s, group in zip(sets, groups, strict=True):
            log = base_of(s) / "logs" / "pytest-hosts.log"
            print(f"== host set {s}: {' '.join(Path(f).name for f in group)}", flush=True)
            with log.open("wb") as out:
                cmd = [python, "-m", "pytest", "-q", "-m", "hosts", "-p", "no:cacheprovider"]
                cmd += ["--durations=0", *args.pytest_args, *group]
                p = subprocess.Popen(
                    cmd, cwd=REPO, env={**env, "TL_SET": str(s)}, stdout=out, stderr=out
                )
            procs.append((s, group, p, log, time.monotonic()))
        failed: list[int] = []
        took: dict[int, float] = {}
        pending = list(procs)
        while pending:
            for item in list(pending):
                s, group, p, log, t0 = item
                if p.poll() is None:
                    continue
                pending.remove(item)
                took[s] = time.monotonic() - t0
                print(f"\n== host set {s}: pytest exit {p.returncode} after {took[s]:.0f} s")
                sys.stdout.write(log.read_text(errors="replace"))
                sys.stdout.flush()
                if p.returncode != 0:
                    failed.append(s)
            time.sleep(1)
        measured = _file_seconds([log for _, _, _, log, _ in procs])
        if measured:
            (base_of(sets[0]) / "logs" / "durations.json").write_text(
                json.dumps(dict(sorted(measured.items())), indent=1) + "\n"
            )
        print(
            "\n== host sets: "
            + ", ".join(f"set {s} {took[s]:.0f} s" for s in sets)
            + (f"; FAILED on set(s) {', '.join(map(str, failed))}" if failed else "; all passed")
        )
        return 1 if failed else 0
    finally:
        for _s, _, p, _, _ in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        for s in sets:
            print(f"== host set {s}: teardown", flush=True)
            subprocess.run(
                ["bash", str(HERE / "teardown.sh")], env={**env, "TL_SET": str(s)}, check=False
            )


def _file_seconds(logs: list[Path]) -> dict[str, float]:
    """Seconds per test file, summed from pytest's --durations=0 table."""
    out: dict[str, float] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].endswith("s") and "::" in parts[2]:
                try:
                    sec = float(parts[0][:-1])
                except ValueError:
                    continue
                f = parts[2].split("::", 1)[0]
                out[f] = round(out.get(f, 0.0) + sec, 1)
    return out


if __name__ == "__main__":
    sys.exit(main())
