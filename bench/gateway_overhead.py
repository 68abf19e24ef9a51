#!/usr/bin/env python3
"""The front door's overhead per request: the same small completion sent through the door and
straight to one instance, interleaved, in one run; medians and their ratio.

Each round sends one request each way (order alternating), non-streaming, max_tokens 1, so the
model's own time is as small as it gets and what differs is the door (HAProxy's parsing of the
body, the route by model, the per-instance listener that sets the instance's key).

Usage: python bench/gateway_overhead.py --door URL --door-key FILE --direct URL
           --direct-key FILE --model ID [--runs 101] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
import urllib.parse
from pathlib import Path


def _key(path: str) -> str:
    return Path(path).read_text(encoding="ascii").strip()


class Client:
    """One kept-alive HTTP connection to a base URL, as a client library holds one."""

    def __init__(self, base: str, key: str) -> None:
        u = urllib.parse.urlsplit(base)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.key = key
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)

    def completion(self, model: str) -> float:
        body = json.dumps({"model": model, "prompt": "Hi", "max_tokens": 1})
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        t0 = time.perf_counter()
        self.conn.request("POST", "/v1/completions", body, headers)
        resp = self.conn.getresponse()
        resp.read()
        took = time.perf_counter() - t0
        if resp.status != 200:
            raise SystemExit(f"{self.host}:{self.port}: HTTP {resp.status}")
        return took


def measure(door: Client, direct: Client, model: str, runs: int) -> dict[str, float]:
    for c in (door, direct):  # warm: the connection, the instance's first request
        c.completion(model)
    via, straight = [], []
    for i in range(runs):
        pair = ((door, via), (direct, straight))
        for c, out in pair if i % 2 == 0 else reversed(pair):
            out.append(c.completion(model))
    d, s = statistics.median(via), statistics.median(straight)
    return {
        "runs": runs,
        "door_median_ms": round(d * 1000, 2),
        "direct_median_ms": round(s * 1000, 2),
        "added_ms": round((d - s) * 1000, 2),
        "ratio": round(d / s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--door", required=True)
    p.add_argument("--door-key", required=True, metavar="FILE")
    p.add_argument("--direct", required=True)
    p.add_argument("--direct-key", required=True, metavar="FILE")
    p.add_argument("--model", required=True)
    p.add_argument("--runs", type=int, default=101)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    door = Client(a.door, _key(a.door_key))
    direct = Client(a.direct, _key(a.direct_key))
    out = measure(door, direct, a.model, a.runs)
    if a.json:
        print(json.dumps(out))
    else:
        print(
            f"{out['runs']} requests each way: door {out['door_median_ms']} ms, direct "
            f"{out['direct_median_ms']} ms (median); +{out['added_ms']} ms, ratio {out['ratio']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
