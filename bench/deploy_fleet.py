#!/usr/bin/env python3
"""deploy on the real test hosts, measured side by side in one run (needs tests/hosts/setup.sh).

Prints, as medians of --runs interleaved rounds:
  1. a converged re-run of `deploy` against a bare pyinfra fact-gathering run on the same hosts
     (`pyinfra INVENTORY fact server.Hostname`): the ratio is what convergence checking costs;
  2. a fresh deploy to 1 host against the same deploy to every gpu host at once (parallel: the
     ratio should stay near 1);
  3. model bytes hashed per run: the file once per download, zero on a converged host.
With --push, every host (legacy1 too) gets model and image pushed from this machine
(`--transfer push`), images removed between rounds, so 1 vs N measures the push fan-out.
Usage: .venv/bin/python bench/deploy_fleet.py [--runs 3] [--push]   (root; hold the hosts lock)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.hosts.fleet import cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import apply_profile, base_dir, load_hosts, load_hosts_json, ssh_run
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT


def timed(args: list[str], env: dict[str, str]) -> tuple[float, dict[str, object]]:
    t0 = time.perf_counter()
    proc = cli(*args, "--json", env=env)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    report: dict[str, object] = json.loads(proc.stdout)
    return dt, report


def hosts_hashing(report: dict[str, object]) -> int:
    """Hosts whose model step ran: each hashed the whole file once (download or verify)."""
    return sum(
        1
        for h in report["hosts"]  # type: ignore[attr-defined]
        for s in h["steps"]
        if s["name"] == "model" and s["outcome"] == "changed"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--push", action="store_true", help="--transfer push to every host")
    opts = ap.parse_args()
    runs = opts.runs
    if not (base_dir() / "hosts.json").exists():
        print("bench: no test hosts (run tests/hosts/setup.sh first); skipped")
        return 0
    hosts_json = load_hosts_json()
    hosts = load_hosts()
    gpu = [h for n, h in sorted(hosts.items()) if n.startswith("gpu") or opts.push]
    for h in gpu:
        apply_profile(h, "p100")
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=base_dir()))
    size = int(hosts_json["tiny_gguf"]["size"])
    with HFServer(host=hosts_json["gateway"]) as hf:
        hf.publish(
            hosts_json["tiny_gguf"]["hf_repo"],
            {hosts_json["tiny_gguf"]["hf_file"]: Path(hosts_json["tiny_gguf"]["path"])},
            commit=TINY_COMMIT,
        )
        env = {
            "HF_ENDPOINT": hf.url,
            "XDG_CACHE_HOME": str(work / "xdg"),
            "HF_HUB_CACHE": str(work / "hub"),
        }
        if opts.push:
            reg = work / "registries.conf"
            location = hosts_json["registry"]
            reg.write_text(f'[[registry]]\nlocation = "{location}"\ninsecure = true\n')
            env["CONTAINERS_REGISTRIES_CONF"] = str(reg)
        catalog = str(write_catalog(work / "recipes", tiny_recipe(hosts_json, TINY_COMMIT)))
        inv = str(write_inventory(work / "inventory.py", gpu))
        limit_one = ["--limit", gpu[0].name]
        deploy = [
            "deploy",
            "-i",
            inv,
            "tiny",
            "--recipes",
            catalog,
            *(["--transfer", "push"] if opts.push else []),
        ]
        purge = ["stop", "tiny", "-i", inv, "--recipes", catalog, "--purge"]
        bare = [sys.executable, "-m", "pyinfra", "-y", inv, "fact", "server.Hostname"]
        converged, facts, one, many = [], [], [], []
        hashed_fresh = hashed_converged = 0

        def fresh() -> None:
            timed(purge, env)
            if opts.push:  # the image must travel again too
                for h in gpu:
                    ssh_run(h, "podman rmi -af >/dev/null 2>&1 || true", timeout=120)

        for _ in range(runs):
            fresh()
            hf.reset_stats()
            dt, report = timed(deploy + limit_one, env)
            one.append(dt)
            fresh()
            dt, report = timed(deploy, env)
            many.append(dt)
            hashed_fresh = size * hosts_hashing(report)
            dt, report = timed(deploy, env)
            converged.append(dt)
            hashed_converged = size * hosts_hashing(report)
            t0 = time.perf_counter()
            subprocess.run(bare, check=True, capture_output=True, timeout=120)
            facts.append(time.perf_counter() - t0)
        timed(purge, env)
    for h in gpu:
        apply_profile(h, str(h.extra.get("default_profile", h.profile)))
    med = statistics.median
    n = len(gpu)
    print(f"hosts: {', '.join(h.name for h in gpu)}; {runs} rounds; medians")
    print(f"converged deploy re-run ({n} hosts)   {med(converged):6.2f} s")
    print(f"bare pyinfra fact run ({n} hosts)     {med(facts):6.2f} s")
    print(f"ratio converged/bare                {med(converged) / med(facts):6.2f}x")
    print(f"fresh deploy, 1 host                {med(one):6.2f} s")
    print(f"fresh deploy, {n} hosts               {med(many):6.2f} s")
    print(f"ratio {n} hosts / 1 host              {med(many) / med(one):6.2f}x")
    print(
        f"model bytes hashed: fresh run {hashed_fresh} ({n} x {size}), "
        f"converged run {hashed_converged}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
