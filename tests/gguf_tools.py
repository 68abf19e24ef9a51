"""Test helpers: write small real GGUFs with the gguf package; serve files over HTTP with Range."""

from __future__ import annotations

import http.server
import string
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf

# The tiny llama of docs/field-notes.md#a-tiny-gguf: llama-server loads it.
# one geometry and one writer for every test GGUF
from tests.hosts.tiny_gguf import N_HEAD_KV, N_LAYER, write_tiny_gguf


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    T = gguf.TokenType
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    scores: list[float] = [0.0, 0.0, 0.0]
    types: list[int] = [int(T.UNKNOWN), int(T.CONTROL), int(T.CONTROL)]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(int(T.BYTE))
    pieces = ["\u2581", *string.ascii_letters, *string.digits, *string.punctuation]
    pieces += ["\u2581" + c for c in string.ascii_lowercase]
    seen = set(tokens)
    for i, p in enumerate(pieces):
        if p in seen:
            continue
        seen.add(p)
        tokens.append(p)
        scores.append(-1000.0 + len(p) * 10 - i * 1e-3)
        types.append(int(T.NORMAL))
    return tokens, scores, types


def big_vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    tokens, scores, types = tiny_vocab()
    extra = n - len(tokens)
    tokens += [f"\u2581tok{i}" for i in range(extra)]
    scores += [-2000.0 - i for i in range(extra)]
    types += [int(gguf.TokenType.NORMAL)] * extra
    return tokens, scores, types


def write_tiny_llama(
    path: Path,
    *,
    ctx: int = 4096,
    head_count_kv: int | Sequence[int] = N_HEAD_KV,
    n_layer: int = N_LAYER,
    vocab: tuple[list[str], list[float], list[int]] | None = None,
    tensors: bool = True,
    extra: dict[str, Any] | None = None,
    arch: str = "llama",
) -> Path:
    """A llama GGUF with random weights (llama-server loads it), or only its header: the test
    harness's writer (tests/hosts/tiny_gguf.py), with this module's plain vocabulary and no chat
    template or damped special tokens, so header sizes stay what these tests compute."""
    tokens, scores, types = vocab or tiny_vocab()
    write_tiny_gguf(
        str(path),
        ctx=ctx,
        n_layer=n_layer,
        head_count_kv=head_count_kv,
        vocab=(tokens, scores, types, 0),
        tensors=tensors,
        extra=extra,
        arch=arch,
        chat_template=False,
    )
    return path


def write_header_only(path: Path, arch: str, kvs: dict[str, tuple[Any, Any]]) -> Path:
    """A GGUF with just the given key/values (value, GGUFValueType) and no tensors."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, (value, vtype) in kvs.items():
        w.add_key_value(key, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def as_version(data: bytes, version: int) -> bytes:
    """The same file claiming another GGUF version (v2 and v3 share the little-endian layout)."""
    return data[:4] + version.to_bytes(4, "little") + data[8:]


# --- an HTTP server that honours Range and counts what it sends -------------------------------


@dataclass
class ServedLog:
    bytes_sent: int = 0
    requests: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


@dataclass
class Route:
    """What the server answers for one path."""

    file: Path | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    honour_range: bool = True
    redirect_to: str | None = None


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict[str, Route]
    log: ServedLog

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self.log.requests.append({k: v for k, v in self.headers.items()})
        self.log.paths.append(self.path)
        route = self.routes.get(self.path)
        if route is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if route.redirect_to is not None:
            self.send_response(302)
            self.send_header("Location", route.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if route.file is None:
            self.send_response(route.status)
            for k, v in route.headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = route.file.stat().st_size
        rng = self.headers.get("Range")
        start, end = 0, size - 1
        status = 200
        if rng and route.honour_range:
            spec = rng.removeprefix("bytes=")
            a, _, b = spec.partition("-")
            start = int(a)
            end = min(int(b) if b else size - 1, size - 1)
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        length = end - start + 1
        self.send_header("Content-Length", str(length))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        with route.file.open("rb") as f:
            f.seek(start)
            left = length
            try:
                while left > 0:
                    chunk = f.read(min(left, 1 << 16))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    self.log.bytes_sent += len(chunk)
                    left -= len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client hung up once it had enough: that is the point


@contextmanager
def serve(routes: dict[str, Route]) -> Iterator[tuple[str, ServedLog]]:
    """Serve routes on 127.0.0.1 on a free port; yields the base URL and the traffic log."""
    log = ServedLog()
    handler = type("Handler", (_Handler,), {"routes": routes, "log": log})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
