#!/usr/bin/env python3
"""A Hugging Face Hub compatible file server for tests (stdlib only), with fault injection.

Serves repos pinned at a 40-hex commit the way the Hub answers ``huggingface_hub`` (2.x) and curl:

* ``HEAD``/``GET /{org}/{repo}/resolve/{revision}/{path}``; revision = the commit or a branch
  name (default ``main``) that resolves to it. Headers: ``X-Repo-Commit``, ``ETag`` (LFS-like
  files: the quoted sha256, also in ``X-Linked-Etag`` with ``X-Linked-Size``; other files: the
  git blob sha1), ``Content-Length``, ``Accept-Ranges: bytes``. ``Range`` gives 206 with
  ``Content-Range``; a range starting past the end gives 416 (``Content-Range: bytes */SIZE``).
* errors: 404 with ``X-Error-Code`` ``RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound``
  and ``X-Error-Message``; 401 for a repo that requires a token (see ``require_token``).
* ``GET /api/models/{org}/{repo}[/revision/{rev}]``: model info (sha, siblings with sizes/LFS).
* ``/api/agent-harnesses`` and anything else: 404.

Fault injection (global or per file, optionally for the next N requests only, optionally only
for some clients' addresses): ``drop`` the connection after K body bytes, ``corrupt`` (wrong
bytes, right length), ``404``, ``401``, ``stall`` (sleep S seconds, after K body bytes),
``short`` (status 200 with a 15-byte JSON body, ``{"status":"ok"}``, whatever was asked) and
``html`` (status 200 with an HTML page, as a captive portal or a proxy's error page answers).
Per-file counters of HEAD/GET requests, bodies and bytes served let tests prove "no bytes
re-transferred" and "metadata only". The value of an ``Authorization`` header is never stored or
logged: only whether one was present.

As a script (``--host``: the host set's gateway, hosts.json ``gateway``, 10.253.S.1 for
TL_SET=S, so the set's hosts reach it):
    python tests/hosts/hf_server.py --host 10.253.0.1 --port 8765 \
        --repo tensorless-test/tiny-llama-GGUF=/path/to/dir [--commit HEX] [--token T]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".onnx")
LFS_MIN_SIZE = 10 * 1024 * 1024
CHUNK = 64 * 1024
FAULT_KINDS = ("drop", "corrupt", "404", "401", "stall", "short", "html")
SHORT_BODY = b'{"status":"ok"}'
HTML_BODY = (
    b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n"
    b"<body><h1>Sign in to continue</h1><p>This network requires you to sign in.</p>"
    b"</body></html>\n"
)
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_API_MODEL = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")


@dataclass
class RepoFile:
    data: bytes
    sha256: str
    blob_sha1: str
    lfs: bool

    @classmethod
    def of(cls, data: bytes, lfs: bool | None = None) -> RepoFile:
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        if lfs is None:
            lfs = len(data) >= LFS_MIN_SIZE
        return cls(data, hashlib.sha256(data).hexdigest(), blob, lfs)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_sha1


@dataclass
class Repo:
    repo_id: str
    commit: str
    files: dict[str, RepoFile]
    branches: dict[str, str] = field(default_factory=dict)
    token: str | None = None


@dataclass
class Fault:
    kind: str
    after_bytes: int = 0
    seconds: float = 0.0
    times: int | None = None  # None: every matching request
    methods: tuple[str, ...] = ("GET",)
    clients: tuple[str, ...] | None = None  # only requests from these addresses; None: any
    hits: int = 0


@dataclass
class PathCounters:
    head: int = 0
    get: int = 0
    bodies: int = 0  # GET responses that started a body (200/206)
    bytes_sent: int = 0
    ranges: list[str] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    auth_seen: list[bool] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return self.head + self.get


def _file_key(repo_id: str, path: str) -> str:
    return f"{repo_id}/{path}"


class HFServer:
    """In-process HF-compatible server. ``with HFServer("127.0.0.1") as s: ... s.url``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.repos: dict[str, Repo] = {}
        self.faults: dict[str | None, list[Fault]] = {}
        self.counters: dict[str, PathCounters] = {}
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        # bumped by reset_stats: a request counts only into the epoch it started in, so the last
        # chunk of a request answered before a reset (its client gone, the count not yet taken:
        # a CI run saw one 64 KiB chunk land after the reset) never counts after it
        self.epoch = 0
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer((host, port), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> HFServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            name="hf-server",
            kwargs={"poll_interval": 0.1},
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()  # wakes stalled responses
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> HFServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ content
    def publish(
        self,
        repo_id: str,
        files: Mapping[str, bytes | Path],
        *,
        commit: str | None = None,
        branches: Mapping[str, str] | None = None,
        lfs: Mapping[str, bool] | None = None,
    ) -> Repo:
        """Publish ``files`` (name -> bytes or a file path) as ``repo_id`` at ``commit``."""
        rfiles: dict[str, RepoFile] = {}
        for name, content in files.items():
            data = content.read_bytes() if isinstance(content, Path) else bytes(content)
            is_lfs = (lfs or {}).get(name)
            if is_lfs is None and name.endswith(LFS_SUFFIXES):
                is_lfs = True
            rfiles[name] = RepoFile.of(data, is_lfs)
        if commit is None:
            h = hashlib.sha1(repo_id.encode())
            for name in sorted(rfiles):
                h.update(name.encode() + b"\0" + rfiles[name].blob_sha1.encode())
            commit = h.hexdigest()
        if not re.fullmatch(r"[0-9a-f]{40}", commit):
            raise ValueError(f"commit must be 40 lowercase hex digits, got {commit!r}")
        repo = Repo(repo_id, commit, rfiles, dict(branches or {"main": commit}))
        with self._lock:
            old = self.repos.get(repo_id)
            if old is not None:
                repo.token = old.token
            self.repos[repo_id] = repo
        return repo

    def publish_dir(self, repo_id: str, directory: Path, **kw: Any) -> Repo:
        files = {
            p.relative_to(directory).as_posix(): p
            for p in sorted(directory.rglob("*"))
            if p.is_file()
        }
        return self.publish(repo_id, files, **kw)

    def resolve_url(self, repo_id: str, filename: str, revision: str | None = None) -> str:
        rev = revision or self.repos[repo_id].commit
        return f"{self.url}/{repo_id}/resolve/{rev}/{urllib.parse.quote(filename)}"

    def require_token(self, repo_id: str, token: str | None) -> None:
        """Make ``repo_id`` private: 401 unless ``Authorization: Bearer <token>`` (None: public)."""
        with self._lock:
            self.repos[repo_id].token = token

    # ------------------------------------------------------------------ faults
    def add_fault(
        self,
        kind: str,
        *,
        repo_id: str | None = None,
        filename: str | None = None,
        after_bytes: int = 0,
        seconds: float = 0.0,
        times: int | None = None,
        methods: tuple[str, ...] | None = None,
        clients: tuple[str, ...] | None = None,
    ) -> Fault:
        """Inject a fault for one file (repo_id + filename) or for every request (neither).

        kinds: drop (close after ``after_bytes`` body bytes), corrupt (wrong bytes), 404, 401,
        stall (sleep ``seconds`` after ``after_bytes`` body bytes, or before headers when 0).
        short, html: status 200 and a body that is not the file (a JSON status, a page).
        ``times``: only the next N matching requests. ``methods``: default GET for drop,
        corrupt, short and html, HEAD and GET for the others. ``clients``: only requests from
        these IP addresses (one host of several).
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {FAULT_KINDS}, got {kind!r}")
        if (repo_id is None) != (filename is None):
            raise ValueError("give both repo_id and filename, or neither (global fault)")
        if methods is None:
            methods = ("GET",) if kind in ("drop", "corrupt", "short", "html") else ("HEAD", "GET")
        f = Fault(kind, after_bytes, seconds, times, tuple(methods), clients)
        key = None if repo_id is None or filename is None else _file_key(repo_id, filename)
        with self._lock:
            self.faults.setdefault(key, []).append(f)
        return f

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def _take_fault(self, key: str, method: str, client: str = "") -> Fault | None:
        with self._lock:
            for k in (key, None):
                for f in self.faults.get(k, []):
                    if f.clients is not None and client not in f.clients:
                        continue
                    if method in f.methods and (f.times is None or f.hits < f.times):
                        f.hits += 1
                        return f
        return None

    # ------------------------------------------------------------------ counters
    def stats(self, repo_id: str, filename: str) -> PathCounters:
        with self._lock:
            return self.counters.setdefault(_file_key(repo_id, filename), PathCounters())

    def reset_stats(self) -> None:
        with self._lock:
            self.epoch += 1
            self.counters.clear()
            self.log.clear()

    def _count(self, key: str, epoch: int, **kw: Any) -> None:
        with self._lock:
            if epoch != self.epoch:
                return
            c = self.counters.setdefault(key, PathCounters())
            for k, v in kw.items():
                if k in ("ranges", "statuses", "auth_seen"):
                    getattr(c, k).append(v)
                else:
                    setattr(c, k, getattr(c, k) + v)


def _make_handler(server: HFServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "tensorless-hf-test/1"

        def log_message(self, format: str, *args: Any) -> None:  # never print, never log auth
            return

        def _send(self, status: int, headers: Mapping[str, str], body: bytes = b"") -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD" and body:
                self.wfile.write(body)

        def _error(self, status: int, code: str | None, message: str) -> None:
            headers = {"Content-Type": "application/json", "X-Error-Message": message}
            if code:
                headers["X-Error-Code"] = code
            self._send(status, headers, json.dumps({"error": message}).encode())

        def do_HEAD(self) -> None:
            self._handle()

        def do_GET(self) -> None:
            self._handle()

        def _count(self, key: str, **kw: Any) -> None:
            server._count(key, self.epoch, **kw)

        def _record(self, status: int, key: str | None, nbytes: int = 0) -> None:
            with server._lock:
                if self.epoch != server.epoch:
                    return
                server.log.append(
                    {
                        "t": time.time(),
                        "method": self.command,
                        "path": self.path,
                        "file": key,
                        "status": status,
                        "range": self.headers.get("Range"),
                        "bytes": nbytes,
                        "auth": self.headers.get("Authorization") is not None,
                    }
                )

        def _handle(self) -> None:
            with server._lock:
                self.epoch = server.epoch
            try:
                self._dispatch()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _dispatch(self) -> None:
            path = urllib.parse.urlsplit(self.path).path
            m = _API_MODEL.match(path)
            if m and self.command == "GET":
                self._model_info(m.group("repo"), m.group("rev"))
                return
            m = _RESOLVE.match(path)
            if not m:
                self._record(404, None)
                self._error(404, None, "Not Found")
                return
            repo_id = urllib.parse.unquote(m.group("repo"))
            rev = urllib.parse.unquote(m.group("rev"))
            fname = urllib.parse.unquote(m.group("path"))
            key = _file_key(repo_id, fname)
            auth = self.headers.get("Authorization")
            self._count(
                key, **{"head" if self.command == "HEAD" else "get": 1}, auth_seen=auth is not None
            )
            fault = server._take_fault(key, self.command, self.client_address[0])
            if fault and fault.kind == "stall" and fault.after_bytes == 0:
                server._stop.wait(fault.seconds)
            if fault and fault.kind == "404":
                return self._fail(key, 404, "EntryNotFound", "Entry not found")
            if fault and fault.kind in ("short", "html"):
                return self._bogus(key, fault.kind)
            repo = server.repos.get(repo_id)
            if repo is None:
                return self._fail(key, 404, "RepoNotFound", "Repository not found")
            if (fault and fault.kind == "401") or (repo.token is not None and auth is None):
                return self._fail(key, 401, "RepoNotFound", "Invalid username or password.")
            if repo.token is not None and auth != f"Bearer {repo.token}":
                return self._fail(key, 401, None, "Invalid credentials in Authorization header")
            commit = repo.branches.get(rev, rev)
            if commit != repo.commit:
                return self._fail(key, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
            rf = repo.files.get(fname)
            if rf is None:
                return self._fail(key, 404, "EntryNotFound", "Entry not found")
            self._serve(key, repo, rf, fault)

        def _bogus(self, key: str, kind: str) -> None:
            """200 with a body that is not the file, whatever range was asked."""
            body, ctype = (
                (SHORT_BODY, "application/json")
                if kind == "short"
                else (HTML_BODY, "text/html; charset=utf-8")
            )
            self._count(key, statuses=200, bodies=1, bytes_sent=len(body))
            self._record(200, key, len(body))
            self._send(200, {"Content-Type": ctype}, body)

        def _fail(self, key: str, status: int, code: str | None, message: str) -> None:
            self._count(key, statuses=status)
            self._record(status, key)
            self._error(status, code, message)

        def _serve(self, key: str, repo: Repo, rf: RepoFile, fault: Fault | None) -> None:
            size = len(rf.data)
            headers = {
                "Content-Type": "application/octet-stream",
                "Accept-Ranges": "bytes",
                "ETag": f'"{rf.etag}"',
                "X-Repo-Commit": repo.commit,
            }
            if rf.lfs:
                headers["X-Linked-Etag"] = f'"{rf.sha256}"'
                headers["X-Linked-Size"] = str(size)
            start, end = 0, size - 1
            status = 200
            rng = self.headers.get("Range")
            if rng is not None:
                self._count(key, ranges=rng)
                m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
                if m and (m.group(1) or m.group(2)):
                    if m.group(1):
                        start = int(m.group(1))
                        end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
                    else:
                        start, end = max(0, size - int(m.group(2))), size - 1
                    if start >= size or start > end:
                        headers["Content-Range"] = f"bytes */{size}"
                        self._count(key, statuses=416)
                        self._record(416, key)
                        self._send(416, headers)
                        return
                    status = 206
                    headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            length = end - start + 1
            self._count(key, statuses=status)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            if self.command == "HEAD":
                self._record(status, key)
                return
            body = rf.data[start : end + 1]
            if fault and fault.kind == "corrupt":
                body = bytes(b ^ 0x5A for b in body)
            self._count(key, bodies=1)
            sent = 0
            limit = fault.after_bytes if fault and fault.kind in ("drop", "stall") else None
            try:
                while sent < length:
                    n = CHUNK if limit is None or sent >= limit else min(CHUNK, limit - sent)
                    chunk = body[sent : sent + n]
                    self.wfile.write(chunk)
                    sent += len(chunk)
                    self._count(key, bytes_sent=len(chunk))
                    if limit is not None and sent >= limit and fault is not None:
                        if fault.kind == "drop":
                            self.wfile.flush()
                            self.connection.shutdown(socket.SHUT_RDWR)
                            self.close_connection = True
                            break
                        server._stop.wait(fault.seconds)
                        limit = None
            finally:
                self._record(status, key, sent)

        def _model_info(self, repo_id: str, rev: str | None) -> None:
            repo = server.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
                return
            auth = self.headers.get("Authorization")
            if repo.token is not None and auth != f"Bearer {repo.token}":
                self._error(401, "RepoNotFound", "Invalid username or password.")
                return
            if rev is not None and repo.branches.get(rev, rev) != repo.commit:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return
            siblings = []
            for name, rf in sorted(repo.files.items()):
                s: dict[str, Any] = {
                    "rfilename": name,
                    "size": len(rf.data),
                    "blobId": rf.blob_sha1,
                }
                if rf.lfs:
                    s["lfs"] = {"sha256": rf.sha256, "size": len(rf.data), "pointerSize": 134}
                siblings.append(s)
            info = {
                "_id": repo.commit[:24],
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit,
                "private": repo.token is not None,
                "gated": False,
                "disabled": False,
                "tags": ["gguf"],
                "siblings": siblings,
            }
            self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode())

    return Handler


@contextmanager
def running(host: str = "127.0.0.1", port: int = 0) -> Iterator[HFServer]:
    srv = HFServer(host, port).start()
    try:
        yield srv
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description="Hugging Face compatible test file server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--repo", action="append", default=[], metavar="ORG/NAME=DIR")
    ap.add_argument("--commit", default=None, help="40-hex commit for every --repo")
    ap.add_argument("--token", default=None, help="require this bearer token")
    a = ap.parse_args()
    srv = HFServer(a.host, a.port)
    for spec in a.repo:
        repo_id, _, d = spec.partition("=")
        r = srv.publish_dir(repo_id, Path(d), commit=a.commit)
        if a.token:
            srv.require_token(repo_id, a.token)
        print(f"{repo_id} @ {r.commit}: {', '.join(sorted(r.files))}", flush=True)
    print(f"serving on {srv.url}", flush=True)
    srv.start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        srv.stop()


if __name__ == "__main__":
    main()
