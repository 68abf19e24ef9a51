#!/usr/bin/env python3
"""A bounded load against llama-server instances while a command runs (a roll: `deploy
--serial 1 ...`), against the same load straight to one instance while nothing changes.

Each request is a /v1/completions of a few tokens, every other one streamed (read to its
[DONE]), sent by --concurrency workers over http.client, each worker on its own connection
per request. The baseline sends --requests requests to the first --url; then COMMAND starts and
the same load goes on, the URLs taken in turn (a client that spreads over the instances itself,
no door before them), until COMMAND has ended and at least --requests were sent. A request
fails on a refused or dropped connection, a status other than 200, or a stream cut before its
[DONE]. Prints, for both: requests, failures (by kind), latency p50 and p99, and the roll's
added p50 and p99 against the baseline; --json for a script.

Usage (needs hosts that serve on addresses this machine reaches):
  .venv/bin/python bench/roll_load.py --url http://10.253.2.11:8080 --url http://10.253.2.11:8081 \\
      [--requests 300] [--concurrency 4] [--api-key-file F] -- \\
      .venv/bin/python -m tensorless_deploy deploy -i INV tiny --serial 1
  .venv/bin/python bench/roll_load.py --test-hosts [--door]  (root; TL_SET=N for a host set)
      the tiny recipe on gpu1 (two P100 stand-ins) and gpu2 (one): three instances on two
      hosts, bound where this machine reaches them, then the load while `deploy --serial 1`
      rolls a changed recipe (another context) over all three; the hosts are reset after
      (units, door, models) and put back as found (profile, images), the work folder removed.
      --door: `gateway --on gpu1` before them (HAProxy from gpu1's packages, its own key),
      and the load during the roll goes through the door (one URL, the model named in each
      request), deploy draining each instance there; the baseline stays straight to one.
  --url URL --model NAME: each request names the model (a door routes by it).
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

DOOR_PORT = 8000  # --test-hosts --door: the door's port on gpu1


@dataclass
class Tally:
    """What one phase of the load saw."""

    latencies: list[float] = field(default_factory=list)  # seconds, the requests that worked
    failures: dict[str, int] = field(default_factory=dict)  # kind -> count
    sent: int = 0

    def add(self, ok: bool, took: float, why: str = "") -> None:
        self.sent += 1
        if ok:
            self.latencies.append(took)
        else:
            self.failures[why] = self.failures.get(why, 0) + 1

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    def json(self) -> dict[str, Any]:
        return {
            "requests": self.sent,
            "failed": sum(self.failures.values()),
            "failures": self.failures,
            "p50_ms": round(self.pct(0.50) * 1000, 1),
            "p99_ms": round(self.pct(0.99) * 1000, 1),
            "mean_ms": round(statistics.fmean(self.latencies) * 1000, 1)
            if self.latencies
            else None,
        }


def one(
    url: str, stream: bool, key: str | None, timeout: float, model: str | None = None
) -> tuple[bool, str]:
    """One completion: (worked, why not)."""
    u = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname or "127.0.0.1", u.port, timeout=timeout)
    body: dict[str, Any] = {"prompt": "The quick brown fox", "max_tokens": 8, "stream": stream}
    if model:
        body["model"] = model
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), headers)
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            return False, f"HTTP {r.status}"
        if stream and b"[DONE]" not in data:
            return False, "stream cut"
        return True, ""
    except ConnectionRefusedError:
        return False, "connection refused"
    except (ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError):
        return False, "connection dropped"
    except (OSError, http.client.HTTPException) as exc:
        return False, type(exc).__name__
    finally:
        conn.close()


def load(
    urls: list[str],
    requests: int,
    concurrency: int,
    key: str | None,
    until: threading.Event | None = None,
    model: str | None = None,
) -> Tally:
    """requests requests over concurrency workers (and, with until, on until it is set)."""
    tally = Tally()
    lock = threading.Lock()
    turn = itertools.count()

    def worker() -> None:
        while True:
            with lock:
                n = next(turn)
                if n >= requests and (until is None or until.is_set()):
                    return
            t0 = time.perf_counter()
            ok, why = one(urls[n % len(urls)], n % 2 == 1, key, 30, model)
            took = time.perf_counter() - t0
            with lock:
                tally.add(ok, took, why)
            if not ok:
                time.sleep(0.05)  # a refused connection comes back at once: do not spin

    workers = [threading.Thread(target=worker) for _ in range(concurrency)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return tally


def line(name: str, t: Tally) -> str:
    j = t.json()
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(t.failures.items()))
    return (
        f"{name}: {j['requests']} requests, {j['failed']} failed"
        + (f" ({kinds})" if kinds else "")
        + f", p50 {j['p50_ms']} ms, p99 {j['p99_ms']} ms"
    )


def on_test_hosts(requests: int, concurrency: int, as_json: bool, door: bool = False) -> int:
    """The roll of three instances on two test hosts under the load (see the usage above)."""
    from contextlib import ExitStack
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    from tests.hosts.harness import base_dir, load_hosts_json

    if not (base_dir() / "hosts.json").exists():
        print("bench: no test hosts (run tests/hosts/setup.sh first); skipped")
        return 0
    with ExitStack() as stack:
        return _on_test_hosts(stack, requests, concurrency, as_json, door, load_hosts_json())


def _on_test_hosts(
    stack: Any, requests: int, concurrency: int, as_json: bool, door: bool, hosts_json: Any
) -> int:
    """on_test_hosts within stack: its work folder removed and the hosts reset, then put back
    as found (profile, images), on every way out."""
    import os
    from pathlib import Path

    from tests.hosts.benchkit import found, restore, work_dir
    from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
    from tests.hosts.harness import apply_profile, base_dir, load_hosts, reset_host
    from tests.hosts.hf_server import HFServer
    from tests.hosts.plugin import TINY_COMMIT

    hosts = load_hosts()
    gpu1, gpu2 = hosts["gpu1"], hosts["gpu2"]
    before = found([gpu1, gpu2])
    image = hosts_json["image"]["ref"]
    stack.callback(restore, [gpu1, gpu2], before, image)  # last: profiles and images as found
    # first: the units, the door, its files, the models the roll made (a reset keeps images)
    stack.callback(lambda: [reset_host(h) for h in (gpu1, gpu2)])
    work = stack.enter_context(work_dir("roll-load-", base_dir()))
    apply_profile(gpu1, "p100x2")
    apply_profile(gpu2, "p100")
    opened = {"tensorless_bind": "0.0.0.0", "tensorless_insecure_open": True}
    inv = write_inventory(
        work / "inventory.py", [gpu1, gpu2], data={gpu1.name: opened, gpu2.name: opened}
    )
    catalog = work / "recipes"
    with HFServer(host=hosts_json["gateway"]) as hf:
        hf.publish(
            hosts_json["tiny_gguf"]["hf_repo"],
            {hosts_json["tiny_gguf"]["hf_file"]: Path(hosts_json["tiny_gguf"]["path"])},
            commit=TINY_COMMIT,
        )
        env = {"HF_ENDPOINT": hf.url}
        deploy = ["deploy", "-i", str(inv), "tiny", "--recipes", str(catalog)]
        try:
            write_catalog(catalog, tiny_recipe(hosts_json, TINY_COMMIT))
            first = cli(*deploy, env=env)
            if first.returncode != 0:
                print(first.stdout + first.stderr, file=sys.stderr)
                return 1
            urls = [f"http://{gpu1.ip}:8080", f"http://{gpu1.ip}:8081", f"http://{gpu2.ip}:8080"]
            direct = urls[0]
            key = None
            if door:
                key_file = work / "door.key"
                key_file.write_text("door-" + os.urandom(16).hex() + "\n")
                key_file.chmod(0o600)
                key = key_file.read_text().strip()
                gw = ["gateway", "-i", str(inv), "--on", gpu1.name, "tiny"]
                gw += ["--recipes", str(catalog), "--bind", "0.0.0.0", "--port", str(DOOR_PORT)]
                made = cli(*gw, "--api-key-file", str(key_file), env=env)
                if made.returncode != 0:
                    print(made.stdout + made.stderr, file=sys.stderr)
                    return 1
                urls = [f"http://{gpu1.ip}:{DOOR_PORT}"]
            write_catalog(catalog, tiny_recipe(hosts_json, TINY_COMMIT, context=2048))
            command = [sys.executable, "-m", "tensorless_deploy", *deploy, "--serial", "1"]
            command += ["--json"]  # its report, with what the door did, in the bench's --json
            os.environ.update(env)
            model = TINY_REPO if door else None
            return run(urls, requests, concurrency, key, command, as_json, direct, model)
        finally:
            cli("stop", "-i", str(inv), "tiny", "--recipes", str(catalog), env=env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", action="append", help="an instance (repeatable)")
    p.add_argument("--test-hosts", action="store_true", help="set up and roll on the test hosts")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--api-key-file", help="the instances' API key, sent as a bearer token")
    p.add_argument("--door", action="store_true", help="--test-hosts: through a front door")
    p.add_argument("--model", help="the model each request names (a door routes by it)")
    p.add_argument("--json", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND: what runs meanwhile")
    args = p.parse_args(argv)
    if args.test_hosts:
        return on_test_hosts(args.requests, args.concurrency, args.json, args.door)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not args.url:
        p.error("give --url and, after --, the command to run during the load")
    key = None
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as f:
            key = f.read().strip()
    return run(args.url, args.requests, args.concurrency, key, command, args.json, model=args.model)


def run(
    urls: list[str],
    requests: int,
    concurrency: int,
    key: str | None,
    command: list[str],
    as_json: bool,
    direct: str | None = None,
    model: str | None = None,
) -> int:
    """The baseline (straight to direct, keyless, else to the first URL with key), then the
    load during the command; printed."""
    if direct is None:
        base = load(urls[:1], requests, concurrency, key, model=model)
    else:
        base = load([direct], requests, concurrency, None, model=model)
    done = threading.Event()
    t0 = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def wait() -> None:
        proc.wait()
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    during = load(urls, requests, concurrency, key, until=done, model=model)
    took = time.monotonic() - t0
    out = proc.stdout.read() if proc.stdout else ""
    report = {
        "command": command,
        "command_rc": proc.returncode,
        "command_s": round(took, 1),
        "baseline": base.json() | {"url": direct or urls[0]},
        "during": during.json() | {"urls": urls},
        "added_p50_ms": round((during.pct(0.5) - base.pct(0.5)) * 1000, 1),
        "added_p99_ms": round((during.pct(0.99) - base.pct(0.99)) * 1000, 1),
        "command_output": out[-20000:],
    }
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(line(f"baseline, straight to {direct or urls[0]}, nothing changing", base))
        print(
            line(
                f"during the command ({took:.0f} s, exit {proc.returncode}), "
                f"{len(urls)} URLs in turn",
                during,
            )
        )
        print(f"added latency: p50 {report['added_p50_ms']} ms, p99 {report['added_p99_ms']} ms")
        if proc.returncode:
            print(out[-2000:], file=sys.stderr)
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
