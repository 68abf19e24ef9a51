#!/usr/bin/env python3
"""deploy on the real test hosts, measured side by side in one run (needs tests/hosts/setup.sh).

Targets (issue 15): a converged re-run <= 1.3x a bare `pyinfra INVENTORY fact server.Hostname`
pass over the same hosts; a fresh deploy to N hosts <= 1.5x the same deploy to one host, pulled
and (--push) pushed; no read of the model file after its last byte arrived.

Prints, as medians of --runs interleaved rounds:
  1. a converged re-run of `deploy` against a bare pyinfra fact run on the same hosts, the
     same on the first host alone, and the survey the re-run waits for, timed on the hosts
     themselves (its probes, no SSH, no tool) on one host and on all at once: the part of the
     N-host figure that is the hosts sharing this machine's cores;
  2. a fresh deploy to 1 host against the same deploy to all N hosts at once, and per phase
     (median over hosts and rounds, 1 host / N hosts): transfer (push: the controller's send;
     pull: the model's download, hashed as it arrives), image (pull, or load of the pushed
     archive), model (admitting the file: its hash was taken on arrival), start (restart to
     /health 200): all N hosts share this machine's 2 cores, so host-side CPU work (podman's
     load, llama-server's start) grows with N here where separate machines would not;
  3. reads of the model file after its last byte arrived, as inotify sees them on every host
     (0: hashed on arrival), and the model bytes the hosts hashed after arrival (file size x
     hosts that read it again).
With --push every host gets model and image pushed from this machine (`--transfer push`),
the engine image removed between rounds. With --from-bundle a bundle is written once
(`bundle`), and every deploy is `deploy --from-bundle` (its verification included in the time),
the pushes taken from it, the engine image removed between rounds as with --push.
--hosts N: gpu1..gpuN (default: every GPU host of the
set; legacy1 and persist1 never, they are other kinds of host): only those deploy and count.
The hosts are left as the bench found them: each one's GPU profile put back, the bench's unit
and model purged, images it added removed and the engine image pulled back where it was there
before; a host that already holds the bench's unit or model is refused up front. Its work
folder (under the set's BASE, TL_SET) is removed, on an error too.
Usage: .venv/bin/python bench/deploy_fleet.py [--runs 3] [--push|--from-bundle] [--hosts 4]
(root)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.arrival_watch import Watch, guest_root
from tests.hosts.benchkit import (
    MODEL_DIR,
    bare_surveys,
    cached_bytecode,
    drop_images,
    found,
    gpu_hosts,
    restore,
    work_dir,
)
from tests.hosts.fleet import cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import (
    Host,
    apply_profile,
    base_dir,
    load_hosts,
    load_hosts_json,
    ssh_run,
)
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT

BLOBS = f"{MODEL_DIR}/blobs"
SENT = re.compile(r"(model|image): sent (\d+) bytes \(resumed from \d+\) in ([0-9.]+) s")


CONVERGED_EACH = 3  # converged re-runs (and bare passes beside them) per round


def timed(args: list[str], env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    proc = cli(*args, "--json", env=env)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    report: dict[str, Any] = json.loads(proc.stdout)
    return dt, report


def phases(report: dict[str, Any]) -> dict[str, list[float]]:
    """Seconds per phase, one value per host that ran it."""
    out: dict[str, list[float]] = {}
    for h in report["hosts"]:
        sent = {m.group(1): float(m.group(3)) for m in SENT.finditer(h.get("transfer") or "")}
        steps = {s["name"]: s for s in h["steps"]}
        if sent:
            out.setdefault("transfer", []).append(sum(sent.values()))
        elif steps.get("model", {}).get("seconds") is not None:
            out.setdefault("transfer", []).append(steps["model"]["seconds"])
        for name, phase in (("image", "image"), ("model", "model"), ("restart", "start")):
            if name == "model" and not sent:
                continue  # pulled: the model step is the download itself (transfer above)
            s = steps.get(name, {}).get("seconds")
            if s is not None:
                out.setdefault(phase, []).append(s)
    return out


def cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of this machine so far, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def merge(into: dict[str, list[float]], more: dict[str, list[float]]) -> None:
    for k, v in more.items():
        into.setdefault(k, []).extend(v)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--push", action="store_true", help="--transfer push to every host")
    ap.add_argument("--from-bundle", action="store_true", help="deploy --from-bundle")
    ap.add_argument("--hosts", type=int, default=0, help="gpu1..gpuN (default: every GPU host)")
    opts = ap.parse_args()
    runs = opts.runs
    if not (base_dir() / "hosts.json").exists():
        print("bench: no test hosts (run tests/hosts/setup.sh first); skipped")
        return 0
    hosts_json = load_hosts_json()
    netns = {h["name"]: h["netns"] for h in hosts_json["hosts"]}
    gpu: list[Host] = gpu_hosts(load_hosts(), opts.hosts)
    image = hosts_json["image"]["ref"]
    before = found(gpu)
    size = int(hosts_json["tiny_gguf"]["size"])
    sha = hosts_json["tiny_gguf"]["sha256"]
    with ExitStack() as stack:
        work = stack.enter_context(work_dir("bench-", base_dir()))
        stack.callback(restore, gpu, before, image)  # runs first: LIFO
        for h in gpu:
            apply_profile(h, "p100")
        hf = stack.enter_context(HFServer(host=hosts_json["gateway"]))
        hf.publish(
            hosts_json["tiny_gguf"]["hf_repo"],
            {hosts_json["tiny_gguf"]["hf_file"]: Path(hosts_json["tiny_gguf"]["path"])},
            commit=TINY_COMMIT,
        )
        env = {
            "HF_ENDPOINT": hf.url,
            "XDG_CACHE_HOME": str(work / "xdg"),
            "HF_HUB_CACHE": str(work / "hub"),
            **cached_bytecode(work),  # as installed: pyinfra's own bytecode is cached too
        }
        pushed = opts.push or opts.from_bundle
        if pushed:
            reg = work / "registries.conf"
            location = hosts_json["registry"]
            reg.write_text(f'[[registry]]\nlocation = "{location}"\ninsecure = true\n')
            env["CONTAINERS_REGISTRIES_CONF"] = str(reg)
        catalog = str(write_catalog(work / "recipes", tiny_recipe(hosts_json, TINY_COMMIT)))
        inv = str(write_inventory(work / "inventory.py", gpu))
        inv_one = str(write_inventory(work / "one.py", gpu[:1]))
        limit_one = ["--limit", gpu[0].name]
        source = ["--recipes", catalog]
        if opts.from_bundle:
            bundle = work / "tiny.bundle"
            timed(["bundle", "tiny", "--recipes", catalog, "-o", str(bundle)], env)
            source = ["--from-bundle", str(bundle)]
        deploy = [
            "deploy",
            "-i",
            inv,
            "tiny",
            *source,
            *(["--transfer", "push"] if opts.push else []),
        ]
        deploy_one = [deploy[0], "-i", inv_one, *deploy[3:]]  # the first host alone
        purge = ["stop", "tiny", "-i", inv, "--recipes", catalog, "--purge"]
        bare = [sys.executable, "-m", "pyinfra", "-y", inv, "fact", "server.Hostname"]
        bare_one = [sys.executable, "-m", "pyinfra", "-y", inv_one, "fact", "server.Hostname"]
        converged, facts, one, many = [], [], [], []
        converged_one: list[float] = []
        facts_one: list[float] = []
        survey_one: list[float] = []
        survey_all: list[float] = []
        busy: list[float] = []  # cores this machine kept busy during the N-host run
        phases_one: dict[str, list[float]] = {}
        phases_many: dict[str, list[float]] = {}
        reads_after: dict[str, int] = {}
        hashed_after = 0

        def fresh() -> None:
            timed(purge, env)
            for h in gpu:
                ssh_run(h, f"mkdir -p {BLOBS}", timeout=120)
                if pushed:  # the image must travel again too
                    drop_images(h, before[h.name].images, image)

        def watched(args: list[str], names: list[str]) -> tuple[float, dict[str, Any]]:
            nonlocal hashed_after
            watches = {n: Watch(guest_root(netns[n]) / BLOBS.lstrip("/")) for n in names}
            try:
                dt, report = timed(args, env)
                for n, w in watches.items():
                    r = w.reads_after_last_write(f"{sha}.incomplete")
                    reads_after[n] = reads_after.get(n, 0) + r
                    hashed_after += size if r else 0
            finally:
                for w in watches.values():
                    w.close()
            return dt, report

        try:
            for _ in range(runs):
                fresh()
                dt, report = watched(deploy + limit_one, [gpu[0].name])
                one.append(dt)
                merge(phases_one, phases(report))
                fresh()
                b0, t0_ = cpu_busy()
                dt, report = watched(deploy, [h.name for h in gpu])
                b1, t1_ = cpu_busy()
                busy.append((b1 - b0) / max(t1_ - t0_, 1) * (os.cpu_count() or 1))
                many.append(dt)
                merge(phases_many, phases(report))
                for _ in range(CONVERGED_EACH):  # cheap: a few per round, interleaved
                    dt, report = timed(deploy, env)
                    assert all(h["outcome"] == "unchanged" for h in report["hosts"]), report
                    converged.append(dt)
                    t0 = time.perf_counter()
                    subprocess.run(bare, check=True, capture_output=True, timeout=120)
                    facts.append(time.perf_counter() - t0)
                    # the same on the first host alone: no host shares this machine with another
                    dt, report = timed(deploy_one, env)
                    assert all(h["outcome"] == "unchanged" for h in report["hosts"]), report
                    converged_one.append(dt)
                    t0 = time.perf_counter()
                    subprocess.run(bare_one, check=True, capture_output=True, timeout=120)
                    facts_one.append(time.perf_counter() - t0)
                    # the survey a converged re-run waits for, alone on the hosts (no SSH, no
                    # tool)
                    survey_one.append(bare_surveys(gpu[:1]))
                    survey_all.append(bare_surveys(gpu))
        finally:  # the bench's unit and model leave every host, on an error too
            cli(*purge, env=env)
    med = statistics.median
    n = len(gpu)
    how = "from a bundle" if opts.from_bundle else "pushed" if opts.push else "pulled"
    print(
        f"hosts: {', '.join(h.name for h in gpu)}; {runs} rounds ({CONVERGED_EACH} converged "
        f"re-runs each); medians; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"converged deploy re-run ({n} hosts)   {med(converged):6.2f} s")
    print(f"bare pyinfra fact run ({n} hosts)     {med(facts):6.2f} s")
    print(f"ratio converged/bare                {med(converged) / med(facts):6.2f}x  (<= 1.3x)")
    print(
        f"  the same on {gpu[0].name} alone: {med(converged_one):.2f} s against "
        f"{med(facts_one):.2f} s, {med(converged_one) / med(facts_one):.2f}x"
    )
    s1, sn = med(survey_one), med(survey_all)
    print(
        f"  the survey alone on the hosts (its probes, no SSH, no tool): {s1 * 1000:.0f} ms on "
        f"one host, {sn * 1000:.0f} ms for {n} at once ({sn - s1:+.2f} s: the hosts sharing "
        f"this machine's {os.cpu_count()} cores); what the converged re-run adds to the bare "
        f"pass on {n} hosts beyond the survey alone on one host: "
        f"{med(converged) - med(facts) - s1:.2f} s"
    )
    print(f"fresh deploy ({how}), 1 host        {med(one):6.2f} s")
    print(f"fresh deploy ({how}), {n} hosts       {med(many):6.2f} s")
    print(f"ratio {n} hosts / 1 host              {med(many) / med(one):6.2f}x  (<= 1.5x)")
    print(
        f"this machine during the {n}-host run: {med(busy):.2f} of {os.cpu_count()} cores busy "
        "(hosts, controller and the other work here share them)"
    )
    print(f"per phase, s (1 host | {n} hosts, median over hosts and rounds):")
    for phase in ("transfer", "image", "model", "start"):
        a, b = phases_one.get(phase), phases_many.get(phase)
        if a and b:
            ratio = med(b) / max(med(a), 1e-9)
            print(f"  {phase:9s} {med(a):6.2f} | {med(b):6.2f}   ({ratio:.2f}x)")
    print(
        "reads of the model file after its last byte arrived (inotify): "
        + ", ".join(f"{k} {v}" for k, v in sorted(reads_after.items()))
        + f"; model bytes hashed after arrival: {hashed_after}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
