"""Read only the metadata key/value area at the start of a GGUF, from a file or over HTTP Range."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.client import HTTPMessage
from pathlib import Path
from typing import IO

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.gguf.constants import GGUF_MAGIC, GGUFValueType, Keys

# The metadata of real GGUFs is a few MiB at most (a 262k-token vocabulary with scores and
# types is about 6 MiB); anything bigger is not a model we can plan for, or not a GGUF.
MAX_METADATA_BYTES = 64 * 1024 * 1024
# Real files carry tens of keys; a count in the millions is garbage that would make us spin.
MAX_KV_COUNT = 65_536
MAX_TENSOR_COUNT = 10_000_000
MAX_KEY_BYTES = 65_536
# Arrays longer than this are refused outright (the largest vocabularies are ~262k tokens,
# merges of big BPE vocabularies ~500k); the byte bound above catches the rest.
MAX_ARRAY_LEN = 1 << 24
MAX_ARRAY_DEPTH = 4
# Numeric arrays up to this length are kept as lists (per-layer head counts, SWA patterns);
# longer ones (token scores, token types) are skipped by size without building them.
KEEP_NUMERIC_ARRAY_MAX = 4096
# Short string arrays (tags, languages) are kept; token lists and merges are skipped.
KEEP_STRING_ARRAY_MAX = 64
# First HTTP/file read, then doubled: one request for most models, a handful for big vocabularies.
FIRST_CHUNK_BYTES = 256 * 1024
HTTP_TIMEOUT_S = 30.0
DEFAULT_HF_ENDPOINT = "https://huggingface.co"

_VT = GGUFValueType
# struct format and size of each fixed-size value type, little-endian.
_SCALAR: dict[int, tuple[str, int]] = {
    _VT.UINT8: ("<B", 1),
    _VT.INT8: ("<b", 1),
    _VT.UINT16: ("<H", 2),
    _VT.INT16: ("<h", 2),
    _VT.UINT32: ("<I", 4),
    _VT.INT32: ("<i", 4),
    _VT.FLOAT32: ("<f", 4),
    _VT.BOOL: ("<?", 1),
    _VT.UINT64: ("<Q", 8),
    _VT.INT64: ("<q", 8),
    _VT.FLOAT64: ("<d", 8),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class HeaderError(TensorlessError):
    """A GGUF header could not be fetched, or is not one we accept (truncated, malformed, huge)."""


@dataclass(frozen=True)
class SkippedArray:
    """An array the reader walked past without building it; its length is still known."""

    element_type: str
    length: int


Scalar = int | float | bool | str
Value = Scalar | list[int] | list[float] | list[bool] | list[str] | SkippedArray


@dataclass(frozen=True)
class GGUFHeader:
    """The metadata of one GGUF: its key/values, and what reading them cost."""

    source: str
    version: int
    tensor_count: int
    metadata: dict[str, Value]
    metadata_bytes: int  # offset where the key/value area ends (tensor infos follow)
    sha256: str  # of the bytes [0, metadata_bytes): names this exact header
    bytes_fetched: int
    file_size: int | None = None  # when the source tells (stat, Content-Range)
    skipped: tuple[str, ...] = field(default=())

    @property
    def architecture(self) -> str:
        arch = self.metadata.get(Keys.General.ARCHITECTURE)
        if not isinstance(arch, str) or not arch:
            raise HeaderError(f"{self.source}: no {Keys.General.ARCHITECTURE} in the GGUF header")
        return arch

    def get(self, key: str, default: Value | None = None) -> Value | None:
        return self.metadata.get(key, default)


class _NeedMore(Exception):
    """Internal: the buffer ends before `needed` bytes; fetch more and resume."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


class _Parser:
    """Walks the key/value area; resumable at key/value boundaries as the buffer grows."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.buf: bytes = b""
        self.complete = False  # the buffer holds the whole source: running out is truncation
        self.pos = 0
        self.version = 0
        self.tensor_count = 0
        self.kv_count = -1
        self.kv_done = 0
        self.metadata: dict[str, Value] = {}
        self.skipped: list[str] = []

    def _err(self, msg: str) -> HeaderError:
        return HeaderError(f"{self.source}: {msg}")

    def _need(self, n: int) -> None:
        end = self.pos + n
        if end > MAX_METADATA_BYTES:
            raise self._err(
                f"GGUF metadata is larger than {MAX_METADATA_BYTES // (1024 * 1024)} MiB; refused"
            )
        if end > len(self.buf):
            if self.complete:
                raise self._err(
                    f"truncated GGUF header: needs {end} bytes, file has {len(self.buf)}"
                )
            raise _NeedMore(end)

    def _u32(self) -> int:
        self._need(4)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def _u64(self) -> int:
        self._need(8)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def _str(self, what: str, limit: int) -> str:
        n = self._u64()
        if n > limit:
            raise self._err(f"{what} is {n} bytes long; refused")
        self._need(n)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self._err(f"{what} is not valid UTF-8") from None

    def _value_type(self, what: str) -> int:
        t = self._u32()
        if t not in _SCALAR and t not in (_VT.STRING, _VT.ARRAY):
            raise self._err(f"{what}: unknown value type {t}")
        return t

    def parse_preamble(self) -> None:
        self.pos = 0
        self._need(4)
        (magic,) = _U32.unpack_from(self.buf, 0)
        if magic != GGUF_MAGIC:
            raise self._err("not a GGUF file (bad magic)")
        self.pos = 4
        version = self._u32()
        if version == 1:
            raise self._err("GGUF version 1 is not supported (convert the file again)")
        if version not in (2, 3):
            if version & 0xFFFF == 0 and (version >> 24) in (2, 3):
                raise self._err("big-endian GGUF files are not supported")
            raise self._err(f"unsupported GGUF version {version}")
        self.version = version
        self.tensor_count = self._u64()
        if self.tensor_count > MAX_TENSOR_COUNT:
            raise self._err(f"absurd tensor count {self.tensor_count}")
        self.kv_count = self._u64()
        if self.kv_count > MAX_KV_COUNT:
            raise self._err(f"absurd metadata key count {self.kv_count}")

    def parse_kvs(self) -> None:
        """Parse remaining key/values; on _NeedMore the state stays at the last whole pair."""
        while self.kv_done < self.kv_count:
            start = self.pos
            try:
                key = self._str("metadata key", MAX_KEY_BYTES)
                vtype = self._value_type(f"key {key!r}")
                value = self._value(key, vtype)
            except _NeedMore:
                self.pos = start
                raise
            if key in self.metadata:
                raise self._err(f"duplicate metadata key {key!r}")
            self.metadata[key] = value
            if isinstance(value, SkippedArray):
                self.skipped.append(key)
            self.kv_done += 1

    def _value(self, key: str, vtype: int) -> Value:
        if vtype == _VT.STRING:
            return self._str(f"value of {key!r}", MAX_METADATA_BYTES)
        if vtype == _VT.ARRAY:
            return self._array(key, 1)
        fmt, size = _SCALAR[vtype]
        self._need(size)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        if isinstance(v, (float, bool)):
            return v
        return int(v)

    def _array(self, key: str, depth: int) -> Value:
        if depth > MAX_ARRAY_DEPTH:
            raise self._err(f"{key!r}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        etype = self._value_type(f"array {key!r}")
        n = self._u64()
        if n > MAX_ARRAY_LEN:
            raise self._err(f"{key!r}: absurd array length {n}")
        name = _VT(etype).name
        if etype in _SCALAR:
            fmt, size = _SCALAR[etype]
            self._need(n * size)
            if n <= KEEP_NUMERIC_ARRAY_MAX and depth == 1:
                vals = list(struct.unpack_from(f"<{n}{fmt[1]}", self.buf, self.pos))
                self.pos += n * size
                return vals
            self.pos += n * size
            return SkippedArray(name, n)
        if etype == _VT.STRING:
            if n <= KEEP_STRING_ARRAY_MAX and depth == 1:
                return [self._str(f"element of {key!r}", MAX_METADATA_BYTES) for _ in range(n)]
            self._skip_strings(key, n)
            return SkippedArray(name, n)
        for _ in range(n):  # nested arrays: walk, never keep
            self._array(key, depth + 1)
        return SkippedArray(name, n)

    def _skip_strings(self, key: str, n: int) -> None:
        # Hot loop for token lists (262k entries): offsets only, no slicing or decoding.
        buf = self.buf
        end_buf = len(buf)
        pos = self.pos
        unpack = _U64.unpack_from
        for _ in range(n):
            if pos + 8 > end_buf:
                self.pos = pos
                self._need(8)
            (ln,) = unpack(buf, pos)
            pos += 8 + ln
            if pos > end_buf:
                self.pos = pos - ln
                self._need(ln)
        self.pos = pos


def parse_header_bytes(data: bytes, source: str = "<bytes>") -> GGUFHeader:
    """Parse a header from bytes that start at offset 0 (the whole file, or enough of it)."""
    p = _Parser(source)
    p.buf = bytes(data)
    p.complete = True
    p.parse_preamble()
    p.parse_kvs()
    return _result(p, bytes_fetched=len(data), file_size=None)


def _result(p: _Parser, bytes_fetched: int, file_size: int | None) -> GGUFHeader:
    return GGUFHeader(
        source=p.source,
        version=p.version,
        tensor_count=p.tensor_count,
        metadata=p.metadata,
        metadata_bytes=p.pos,
        sha256=hashlib.sha256(p.buf[: p.pos]).hexdigest(),
        bytes_fetched=bytes_fetched,
        file_size=file_size,
        skipped=tuple(p.skipped),
    )


# A fetcher returns bytes [start, start+length) (fewer at the end of the source), the source's
# total size when it knows it, and how many bytes it really transferred to get them.
Fetch = Callable[[int, int], tuple[bytes, int | None, int]]


def _read_with(fetch: Fetch, source: str, first_chunk: int) -> GGUFHeader:
    p = _Parser(source)
    fetched = 0
    file_size: int | None = None
    want = min(max(first_chunk, 64), MAX_METADATA_BYTES)
    preamble_done = False
    while True:
        if len(p.buf) < want and not p.complete:
            chunk, size, transferred = fetch(len(p.buf), want - len(p.buf))
            fetched += transferred
            if size is not None:
                file_size = size
            if len(chunk) < want - len(p.buf):
                p.complete = True
            p.buf += chunk
            if file_size is not None and len(p.buf) >= file_size:
                p.complete = True
        try:
            if not preamble_done:
                p.parse_preamble()
                preamble_done = True
            p.parse_kvs()
            return _result(p, bytes_fetched=fetched, file_size=file_size)
        except _NeedMore as more:
            want = min(max(want * 2, more.needed), MAX_METADATA_BYTES)


def read_header_file(
    path: str | os.PathLike[str], first_chunk: int = FIRST_CHUNK_BYTES
) -> GGUFHeader:
    """Read the metadata of a local GGUF, reading only the bytes the metadata spans (rounded up)."""
    source = str(path)
    try:
        f: IO[bytes] = open(path, "rb")  # noqa: SIM115 - closed below, fetch closes over it
    except OSError as e:
        raise HeaderError(f"{source}: cannot open: {e.strerror or e}") from None
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
        except OSError as e:
            raise HeaderError(f"{source}: cannot stat: {e.strerror or e}") from None

        def fetch(start: int, length: int) -> tuple[bytes, int | None, int]:
            try:
                f.seek(start)
                data = f.read(length)
                return data, size, len(data)
            except OSError as e:
                raise HeaderError(f"{source}: read failed: {e.strerror or e}") from None

        return _read_with(fetch, source, first_chunk)


class _AuthRedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but send the bearer token only to the host it was meant for.

    urllib would otherwise carry Authorization to a CDN on another host (the Hub redirects LFS
    files to one); those URLs are signed and must not see the token.
    """

    def __init__(self, token: str | None) -> None:
        super().__init__()
        self.token = token

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.remove_header("Authorization")
            same_host = (
                urllib.parse.urlsplit(newurl).netloc == urllib.parse.urlsplit(req.full_url).netloc
            )
            if self.token and same_host:
                new.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return new


def _redact(url: str) -> str:
    """The URL without user info or query (signed URLs carry credentials there)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


_CONTENT_RANGE_RE = re.compile(r"^bytes\s+(\d+)-(\d+)/(\d+|\*)$")


def read_header_url(
    url: str,
    token: str | None = None,
    first_chunk: int = FIRST_CHUNK_BYTES,
    timeout: float = HTTP_TIMEOUT_S,
) -> GGUFHeader:
    """Read the metadata of a GGUF over HTTP(S) with Range requests in growing chunks.

    The token goes in an Authorization header (never in the URL, never in messages).
    """
    source = _redact(url)
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise HeaderError(f"{source}: only http and https URLs are supported")
    opener = urllib.request.build_opener(_AuthRedirectHandler(token))

    def fetch(start: int, length: int) -> tuple[bytes, int | None, int]:
        req = urllib.request.Request(url, method="GET")
        req.add_header("Range", f"bytes={start}-{start + length - 1}")
        req.add_header("Accept-Encoding", "identity")
        if token:
            req.add_unredirected_header("Authorization", f"Bearer {token}")
        try:
            with opener.open(req, timeout=timeout) as resp:
                status = resp.status
                total: int | None = None
                if status == 206:
                    m = _CONTENT_RANGE_RE.match(resp.headers.get("Content-Range", "").strip())
                    if not m or int(m.group(1)) != start:
                        raise HeaderError(f"{source}: server answered a Range request badly")
                    if m.group(3) != "*":
                        total = int(m.group(3))
                    data = _read_exact(resp, length)
                    return data, total, len(data)
                if status == 200:
                    # The server ignored Range: read only up to what we need, then hang up.
                    cl = resp.headers.get("Content-Length")
                    total = int(cl) if cl and cl.isdigit() else None
                    skipped = len(_read_exact(resp, start))
                    data = _read_exact(resp, length)
                    return data, total, skipped + len(data)
                raise HeaderError(f"{source}: unexpected HTTP status {status}")
        except urllib.error.HTTPError as e:
            if e.code == 416:  # asked past the end: the file ends before `start`
                return b"", None, 0
            code = e.headers.get("X-Error-Code") if e.headers else None
            hint = f" ({code})" if code else ""
            fix = " (check the token)" if e.code in (401, 403) else ""
            raise HeaderError(f"{source}: HTTP {e.code}{hint}{fix}") from None
        except urllib.error.URLError as e:
            raise HeaderError(f"{source}: cannot fetch: {e.reason}") from None
        except (OSError, ValueError) as e:
            raise HeaderError(f"{source}: cannot fetch: {e}") from None

    return _read_with(fetch, source, first_chunk)


def _read_exact(resp: IO[bytes], n: int) -> bytes:
    parts: list[bytes] = []
    left = n
    while left > 0:
        chunk = resp.read(min(left, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def hub_file_url(repo: str, revision: str, filename: str, endpoint: str | None = None) -> str:
    """`{endpoint}/{repo}/resolve/{revision}/{file}`; the endpoint defaults to $HF_ENDPOINT."""
    base = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
    rev = urllib.parse.quote(revision, safe="")
    path = urllib.parse.quote(filename, safe="/")
    return f"{base}/{urllib.parse.quote(repo, safe='/')}/resolve/{rev}/{path}"


# --- cache of parsed headers, per (repo, revision, file) ---------------------------------------

CACHE_SCHEMA = 1


def _value_to_json(v: Value) -> object:
    if isinstance(v, SkippedArray):
        return {"skipped_array": v.element_type, "length": v.length}
    return v


def _value_from_json(v: object) -> Value:
    if isinstance(v, dict):
        et, n = v.get("skipped_array"), v.get("length")
        if not isinstance(et, str) or not isinstance(n, int):
            raise ValueError("bad skipped array")
        return SkippedArray(et, n)
    if isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list) and all(isinstance(x, (bool, int, float, str)) for x in v):
        return v
    raise ValueError("bad value")


def header_to_json(h: GGUFHeader) -> dict[str, object]:
    return {
        "source": h.source,
        "version": h.version,
        "tensor_count": h.tensor_count,
        "metadata_bytes": h.metadata_bytes,
        "sha256": h.sha256,
        "file_size": h.file_size,
        "metadata": {k: _value_to_json(v) for k, v in h.metadata.items()},
    }


def header_from_json(d: Mapping[str, object], bytes_fetched: int = 0) -> GGUFHeader:
    meta = d["metadata"]
    if not isinstance(meta, dict):
        raise ValueError("metadata")
    source, version, tc, mb, sha = (
        d["source"],
        d["version"],
        d["tensor_count"],
        d["metadata_bytes"],
        d["sha256"],
    )
    fs = d.get("file_size")
    if not (
        isinstance(source, str)
        and isinstance(version, int)
        and isinstance(tc, int)
        and isinstance(mb, int)
        and isinstance(sha, str)
        and (fs is None or isinstance(fs, int))
    ):
        raise ValueError("fields")
    metadata = {str(k): _value_from_json(v) for k, v in meta.items()}
    return GGUFHeader(
        source=source,
        version=version,
        tensor_count=tc,
        metadata=metadata,
        metadata_bytes=mb,
        sha256=sha,
        bytes_fetched=bytes_fetched,
        file_size=fs,
        skipped=tuple(k for k, v in metadata.items() if isinstance(v, SkippedArray)),
    )


class HeaderCache:
    """One JSON file per (repo, revision, file) under a folder; written atomically."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def _path(self, repo: str, revision: str, filename: str) -> Path:
        key = hashlib.sha256(f"{repo}\0{revision}\0{filename}".encode()).hexdigest()
        return self.directory / f"{key}.json"

    def get(self, repo: str, revision: str, filename: str) -> GGUFHeader | None:
        path = self._path(repo, revision, filename)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            if d.get("schema") != CACHE_SCHEMA or d.get("key") != [repo, revision, filename]:
                return None
            return header_from_json(d["header"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # a missing or damaged entry is a miss, never an error

    def put(self, repo: str, revision: str, filename: str, header: GGUFHeader) -> None:
        path = self._path(repo, revision, filename)
        doc = {
            "schema": CACHE_SCHEMA,
            "key": [repo, revision, filename],
            "header": header_to_json(header),
        }
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(doc, f, sort_keys=True, separators=(",", ":"))
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as e:
            raise HeaderError(
                f"{self.directory}: cannot write header cache: {e.strerror or e}"
            ) from None


def read_hub_header(
    repo: str,
    revision: str,
    filename: str,
    token: str | None = None,
    endpoint: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    first_chunk: int = FIRST_CHUNK_BYTES,
) -> GGUFHeader:
    """The header of a file on a Hugging Face compatible server, cached per pinned commit.

    Only a 40-hex commit is cached: a branch name can move, and a stale header would plan the
    wrong model.
    """
    cache = HeaderCache(cache_dir) if cache_dir is not None else None
    pinned = bool(_COMMIT_RE.match(revision))
    if cache is not None and pinned:
        hit = cache.get(repo, revision, filename)
        if hit is not None:
            return hit
    header = read_header_url(hub_file_url(repo, revision, filename, endpoint), token, first_chunk)
    if cache is not None and pinned:
        cache.put(repo, revision, filename, header)
    return header


# --- the headers a plan sizes from: many at once, through the per-commit cache ----------------

HeaderKey = tuple[str, str, str]  # (repo, revision, file)
HEADER_THREADS = 8


@dataclass(frozen=True)
class HeaderResult:
    """The GGUF header of one (repo, revision, file), or why it could not be read."""

    header: GGUFHeader | None
    error: str | None = None
    cached: bool = False


def header_cache_dir() -> Path:
    """$XDG_CACHE_HOME/tensorless-deploy/headers (default ~/.cache/...)."""
    from tensorless_deploy.hub import controller_state_dir

    return Path(controller_state_dir()) / "headers"


def read_headers(
    keys: Sequence[HeaderKey], cache_dir: Path | None, endpoint: str | None = None
) -> dict[HeaderKey, HeaderResult]:
    """Each (repo, revision, file) header once, in parallel, through the per-commit cache (a
    few hundred KiB of each file over HTTP Range, never the whole file). A token
    (huggingface_hub's) is looked up only when the server asks for one. Never raises: a header
    that cannot be read is a result carrying why, with the fix."""
    from concurrent.futures import ThreadPoolExecutor

    from tensorless_deploy.hub import endpoint as hf_endpoint
    from tensorless_deploy.hub import token as hub_token

    base = endpoint or hf_endpoint()
    cache = cache_dir
    if cache is not None:
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError:
            cache = None  # planning still works, it only reads the headers again next time

    def one(key: HeaderKey) -> HeaderResult:
        repo, revision, filename = key
        try:
            try:
                h = read_hub_header(repo, revision, filename, endpoint=base, cache_dir=cache)
            except HeaderError as exc:
                if "HTTP 401" not in exc.message and "HTTP 403" not in exc.message:
                    raise
                token = hub_token()
                if not token:
                    fix = "log in with `hf auth login` or set HF_TOKEN (gated or private repo)"
                    raise HeaderError(exc.message, fix=fix) from None
                h = read_hub_header(
                    repo, revision, filename, token=token, endpoint=base, cache_dir=cache
                )
        except TensorlessError as exc:
            if exc.fix is None and ": cannot fetch: " in exc.message:
                exc.fix = (
                    f"reach {base} (or a mirror of it: HF_ENDPOINT) once; each commit's header is "
                    f"then kept in {cache or header_cache_dir()} and planning needs no network"
                )
            return HeaderResult(None, exc.lines()[0])
        return HeaderResult(h, None, cached=h.bytes_fetched == 0)

    unique = list(dict.fromkeys(keys))
    if not unique:
        return {}
    with ThreadPoolExecutor(min(HEADER_THREADS, len(unique))) as pool:
        return dict(zip(unique, pool.map(one, unique), strict=True))
