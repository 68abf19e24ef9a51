#!/usr/bin/env python3
"""When a fresh instance is ready against when its llama-server listens, on the real test hosts.

Target (issue 30): a unit is ready when llama-server is. Deploys the tiny model to gpu1..gpuN
(--hosts N, default every GPU host), then per round stops the unit and starts it on 1 host and on
all N at once, two ways, interleaved: (tool) the very script a deploy runs (operations/scripts/
unit-activate.sh, as the serving operation binds it), (systemctl) a bare `systemctl start`,
which waits for podman's own probe timer alone (a start systemd makes by itself: boot, a
crash). Each start is timed on the host: from its start to /health first answering 200
(polled every 20 ms), and to the start ending (Notify=healthy: podman reported healthy).
Prints the medians, and the N-host / 1-host ratio of the tool's start. The hosts are left as
found (tests/hosts/benchkit.py: profile, unit, model, images), its work folder removed.
Usage: .venv/bin/python bench/unit_ready.py [--runs 5] [--hosts 4]   (root)
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tensorless_deploy.facts.device import DEVICE_LINE
from tensorless_deploy.operations._run import bound
from tests.hosts.benchkit import UNIT, found, gpu_hosts, restore, spread, work_dir
from tests.hosts.fleet import cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host, apply_profile, base_dir, load_hosts, load_hosts_json, ssh_run
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT

PATH = f"/etc/containers/systemd/{UNIT}.container"
URL = "http://127.0.0.1:8080/health"  # tiny_recipe's default address

# one start on the host: "LISTEN READY" seconds after it began
TIMED = """
systemctl stop {unit}
t0=$(date +%s.%N)
( until curl -fsS --max-time 1 {url} >/dev/null 2>&1; do sleep 0.02; done
  date +%s.%N > /tmp/bench-listen ) &
p=$!
{start} >/dev/null 2>&1 || echo "start failed" >&2
t1=$(date +%s.%N)
wait $p
awk -v a="$t0" -v b="$t1" -v l="$(cat /tmp/bench-listen)" 'BEGIN {{ print l - a, b - a }}'
rm -f /tmp/bench-listen
"""


def start_commands() -> dict[str, str]:
    tool = bound(
        "unit-activate",
        svc=f"{UNIT}.service",
        url=URL,
        timeout=120,
        path=PATH,
        kind="quadlet",
        verb="start",
        device_re=DEVICE_LINE,
    )
    return {"tool": f"sh -c {shlex.quote(tool)}", "systemctl": f"systemctl start {UNIT}"}


def timed_start(host: Host, start: str) -> tuple[float, float]:
    proc = ssh_run(host, TIMED.format(unit=UNIT, url=URL, start=start), timeout=180)
    listen, ready = (float(x) for x in proc.stdout.split())
    return listen, ready


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=0, help="gpu1..gpuN (default: every GPU host)")
    opts = ap.parse_args()
    if not (base_dir() / "hosts.json").exists():
        print("bench: no test hosts (run tests/hosts/setup.sh first); skipped")
        return 0
    hosts_json = load_hosts_json()
    gpu = gpu_hosts(load_hosts(), opts.hosts)
    image = hosts_json["image"]["ref"]
    before = found(gpu)
    # (way, hosts at once) -> per start: (listen, ready)
    got: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with ExitStack() as stack:
        work = stack.enter_context(work_dir("unit-ready-", base_dir()))
        stack.callback(restore, gpu, before, image)
        for h in gpu:
            apply_profile(h, "p100")
        hf = stack.enter_context(HFServer(host=hosts_json["gateway"]))
        hf.publish(
            hosts_json["tiny_gguf"]["hf_repo"],
            {hosts_json["tiny_gguf"]["hf_file"]: Path(hosts_json["tiny_gguf"]["path"])},
            commit=TINY_COMMIT,
        )
        env = {"HF_ENDPOINT": hf.url, "XDG_CACHE_HOME": str(work / "xdg")}
        catalog = str(write_catalog(work / "recipes", tiny_recipe(hosts_json, TINY_COMMIT)))
        inv = str(write_inventory(work / "inventory.py", gpu))
        try:
            proc = cli("deploy", "-i", inv, "tiny", "--recipes", catalog, env=env)
            if proc.returncode != 0:
                sys.exit(f"bench: deploy failed:\n{proc.stdout}\n{proc.stderr}")
            commands = start_commands()
            pool = stack.enter_context(ThreadPoolExecutor(len(gpu)))
            for _ in range(opts.runs):
                for way, start in commands.items():
                    got.setdefault((way, 1), []).append(timed_start(gpu[0], start))
                    many = pool.map(lambda h, s=start: timed_start(h, s), gpu)
                    got.setdefault((way, len(gpu)), []).extend(many)
        finally:
            cli("stop", "tiny", "-i", inv, "--recipes", catalog, "--purge", env=env)
    n = len(gpu)
    print(f"hosts: {', '.join(h.name for h in gpu)}; {opts.runs} rounds; medians (quartiles), s")
    print("start by        hosts   to listening          to ready (start ended)   ready - listen")
    for (way, count), pairs in got.items():
        listen = spread([p[0] for p in pairs])
        ready = spread([p[1] for p in pairs])
        lag = spread([p[1] - p[0] for p in pairs])
        print(
            f"{way:14s} {count:5d}   {listen[0]:5.2f} ({listen[1]:.2f}-{listen[2]:.2f})"
            f"      {ready[0]:5.2f} ({ready[1]:.2f}-{ready[2]:.2f})"
            f"        {lag[0]:5.2f} ({lag[1]:.2f}-{lag[2]:.2f})"
        )
    one = statistics.median(p[1] for p in got[("tool", 1)])
    all_ = statistics.median(p[1] for p in got[("tool", n)])
    print(f"ratio {n} hosts / 1 host, tool's start to ready: {all_ / one:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
