"""The wait before a restart or stop until an instance is idle (api.sh wait_idle, in_flight,
api_get), run by sh against a small real HTTP server standing in for llama-server's /health,
/slots and /metrics; and the drain parameters the operations pass to the unit scripts."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy import shell
from tensorless_deploy.operations.unit import _drain

KEY = "k" * 32


class Server(ThreadingHTTPServer):
    """Answers /slots (or, with slots=False, 501 there and /metrics) from a script of busy
    counts, one per read, the last repeated; with key set, 401 without it."""

    def __init__(self, busy: list[int], slots: bool = True, key: str | None = None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.busy, self.slots, self.key = busy, slots, key
        self.reads = 0

    def next_busy(self) -> int:
        n = self.busy[min(self.reads, len(self.busy) - 1)]
        self.reads += 1
        return n


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        srv = self.server
        if self.path == "/health":
            return self._send(200, '{"status":"ok"}')
        if srv.key is not None and self.headers.get("Authorization") != f"Bearer {srv.key}":
            return self._send(401, '{"error":"Invalid API Key"}')
        if self.path == "/slots":
            if not srv.slots:
                return self._send(501, '{"error":"This server does not support slots"}')
            n = srv.next_busy()
            slots = [{"id": i, "is_processing": i < n} for i in range(4)]
            return self._send(200, json.dumps(slots))
        if self.path == "/metrics" and not srv.slots:
            n = srv.next_busy()
            return self._send(
                200, f"llamacpp:requests_processing {n}\nllamacpp:requests_deferred 0\n"
            )
        return self._send(404, "")


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[Server] = []

    def start(busy: list[int], **kw: Any) -> Server:
        srv = Server(busy, **kw)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def wait_idle(srv: Server, seconds: int, key_file: str = "") -> str:
    url = f"http://127.0.0.1:{srv.server_address[1]}/health"
    libs = shell.load("tensorless_deploy", shell.HOST_LIB) + shell.load(
        "tensorless_deploy", shell.API_LIB
    )
    cmd = shell.bind(
        f'{libs}\nwait_idle "{url}" "{key_file}" {seconds} restarted', **shell.host_values()
    )
    done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_idle_instance_goes_at_once(serve: Any) -> None:
    assert wait_idle(serve([0]), 30) == "drain: idle (no request in flight)"


def test_a_busy_instance_is_waited_for_until_idle(serve: Any) -> None:
    srv = serve([2, 2, 1, 0])
    said = wait_idle(srv, 30)
    assert said.startswith("drain: idle after") and "(2 requests were in flight)" in said, said
    assert srv.reads == 5  # two busy, one busy, then idle twice in a row


def test_one_idle_read_between_queued_requests_is_not_idle(serve: Any) -> None:
    # a request queued behind the busy slot starts the moment the one before it ends: a single
    # idle read in between is not the end
    srv = serve([1, 0, 1, 1, 0, 0])
    said = wait_idle(srv, 30)
    assert said.startswith("drain: idle after") and "(1 requests were in flight)" in said
    assert srv.reads == 6


def test_a_wait_that_times_out_says_how_many_were_in_flight(serve: Any) -> None:
    said = wait_idle(serve([3]), 1)
    assert said == "drain: restarted with 3 requests in flight after 1s (drain timeout 1s)"


def test_metrics_where_slots_are_off(serve: Any) -> None:
    said = wait_idle(serve([1, 1, 0], slots=False), 30)
    assert said.startswith("drain: idle after") and "(1 requests were in flight)" in said


def test_the_key_is_sent_from_its_file(serve: Any, tmp_path: Path) -> None:
    key = tmp_path / "api-key"
    key.write_text(KEY)
    said = wait_idle(serve([1, 0], key=KEY), 30, str(key))
    assert said.startswith("drain: idle after"), said
    # without it, nothing can be read: said so, and the change goes on
    said = wait_idle(serve([1], key=KEY), 30, str(tmp_path / "missing"))
    assert (
        said == "drain: cannot tell the requests in flight (neither /slots nor /metrics answered)"
    )


def test_no_wait_asked_passes_nothing_to_the_scripts() -> None:
    assert _drain(None, "/k") == {} and _drain(0, "/k") == {}
    assert _drain(60, "/etc/tensorless-deploy/secrets/u/api-key") == {
        "idle": 60,
        "key": "/etc/tensorless-deploy/secrets/u/api-key",
    }
