#!/usr/bin/env python3
"""What a push to 16 hosts costs, simulated on the test hosts there are: the push's own sender
(fleet.push.fan_out: one writer per host, each on its own SSH connection and channel, into the
host's real model-receive.sh, hashed on arrival, capped at the size) to N receivers, N = 1, 4,
8, 16, each receiver its own SSH connection (the inventory names each test host several times),
so the controller encrypts N streams exactly as it would for N machines.

Prints per N: the wall time of the send, the aggregate throughput, the controller's CPU seconds
(this process) and the bytes it read from the file (each writer reads at its own offset: N x
size, served by the page cache after the first). If the aggregate stays flat while N grows, the
send is bound by the controller (one core encrypting every stream, as gevent runs the writers)
or by the link, and later hosts fetching from the first would pay; if it grows, it is not.
All receivers share this machine's 2 cores with the controller (sshd, head, tee and openssl run
here too), so the figures bound the controller's side from above.
With --relay the same N receivers get the file through fleet.relay instead (the controller sends
it to one host, hosts that hold it verified pass it on, one key per hop): N is at most the number
of distinct test hosts (a host does not relay to itself), and the line adds the controller's
bytes sent divided by the file's size (target <= 1.1x) and each hop's mean time.
Usage: .venv/bin/python bench/push_fanout.py [--mib 64] [--counts 1,4,8,16] [--relay]   (root)
"""

from __future__ import annotations

import argparse
import atexit
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.hosts.fleet import write_inventory
from tests.hosts.harness import base_dir, load_hosts, ssh_run

REMOTE = "/var/lib/tensorless/bench-fanout"


def controller_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--counts", default="1,4,8,16")
    ap.add_argument("--relay", action="store_true", help="through fleet.relay, host to host")
    opts = ap.parse_args()
    counts = [int(c) for c in opts.counts.split(",")]
    if not (base_dir() / "hosts.json").exists():
        print("bench: no test hosts (run tests/hosts/setup.sh first); skipped")
        return 0
    hosts = [h for n, h in sorted(load_hosts().items()) if n.startswith(("gpu", "legacy"))]
    work = Path(tempfile.mkdtemp(prefix="fanout-", dir=base_dir()))
    atexit.register(shutil.rmtree, work, True)  # on every way out, sys.exit and errors too
    source = work / "payload.bin"
    with source.open("wb") as f:
        for _ in range(opts.mib):
            f.write(os.urandom(1 << 20))
    size = source.stat().st_size
    if opts.relay and max(counts) > len(hosts):
        sys.exit(f"bench: --relay needs distinct hosts: at most {len(hosts)} receivers here")
    per_host = -(-max(counts) // len(hosts))
    # each test host named per_host times: one SSH connection per name, as N machines would
    entries = [(h, k) for k in range(per_host) for h in hosts]
    inv_path = work / "inventory.py"
    write_inventory(inv_path, hosts)  # one row per host; then each repeated under new names
    rows: dict[str, Any] = {}
    exec(inv_path.read_text(), rows)
    by_name = dict(rows["hosts"])
    named = [(f"{h.name}-{k}" if k else h.name, by_name[h.name]) for h, k in entries]
    inv_path.write_text(f"hosts = {named!r}\n", encoding="utf-8")

    from tensorless_deploy.fleet.connect import disconnect, new_state, on_each_host
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.fleet.push import Receiver, fan_out, receive_command

    inventory = load_inventory(str(inv_path), False)
    targets = select_hosts(inventory, [])
    state = new_state(inventory)
    on_each_host(state, targets, lambda h: None, keep_connected=True)
    print(
        f"payload {size >> 20} MiB; receivers on {', '.join(h.name for h in hosts)} "
        f"({per_host} SSH connections each at most); load average {os.getloadavg()[0]:.2f}"
    )
    base_rate = None
    try:
        for n in counts:
            for h in hosts:
                ssh_run(h, f"rm -rf {REMOTE}; mkdir -p {REMOTE}", timeout=60)
            chosen = targets[:n]
            receivers = [Receiver(t.name, t, f"{REMOTE}/{t.name}.part") for t in chosen]
            commands = [
                receive_command(state, t, r.path, size)
                for t, r in zip(chosen, receivers, strict=True)
            ]
            cpu0, read0, t0 = controller_cpu(), read_bytes(), time.perf_counter()
            if opts.relay:
                relayed = _relay(state, chosen, source, receivers)
            else:
                fan_out(source, receivers, commands)
            wall = time.perf_counter() - t0
            cpu, read = controller_cpu() - cpu0, read_bytes() - read0
            bad = [r.error for r in receivers if r.error]
            if bad:
                sys.exit(f"bench: {bad[0]}")
            rate = n * size / wall / 1e6
            base_rate = base_rate or rate
            extra = ""
            if opts.relay:
                hops = [h.seconds for h in relayed.hops if h.kind == "ok"]
                extra = (
                    f"; controller sent {relayed.controller_bytes / size:4.2f} x the file, "
                    f"{len(hops)} hops of {sum(hops) / len(hops):5.2f} s each"
                )
            print(
                f"N={n:2d}: {wall:6.2f} s, {rate:6.1f} MB/s together ({rate / base_rate:4.2f}x "
                f"of N=1), {rate / n:6.1f} MB/s each; controller CPU {cpu:5.2f} s "
                f"({cpu / wall:4.2f} cores), read {read / size:4.1f} x the file{extra}"
            )
    finally:
        for h in hosts:
            ssh_run(h, f"rm -rf {REMOTE}", timeout=60, check=False)
        disconnect(targets)
    return 0


def _relay(state: Any, chosen: list[Any], source: Path, receivers: list[Any]) -> Any:
    import hashlib

    from tensorless_deploy.fleet.relay import Copy, relay

    sha = hashlib.sha256(source.read_bytes()).hexdigest()
    remote = {r.host: r.path for r in receivers}
    copy = Copy("file", source, sha, source.stat().st_size, remote)
    report = relay(state, {t.name: t for t in chosen}, copy, [t.name for t in chosen])
    for r in receivers:
        hop = report.done.get(r.host) or report.failed.get(r.host)
        r.error = report.failed[r.host].line if r.host in report.failed else None
        r.sent = hop.sent if hop else 0
    return report


if __name__ == "__main__":
    sys.exit(main())
