"""The GGUF header reader: real files written by the gguf package, a real HTTP server."""

from __future__ import annotations

import contextlib
import json
import struct
import time
from pathlib import Path

import gguf
import pytest
from gguf import GGUFValueType as VT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.gguf.header import (
    FIRST_CHUNK_BYTES,
    HeaderCache,
    HeaderError,
    SkippedArray,
    hub_file_url,
    parse_header_bytes,
    read_header_file,
    read_header_url,
    read_hub_header,
)

from .gguf_tools import Route, as_version, big_vocab, serve, write_header_only, write_tiny_llama

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="session")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """262,144-token vocabulary, like Gemma 3: metadata of several MiB."""
    return write_tiny_llama(
        tmp_path_factory.mktemp("big") / "big.gguf", vocab=big_vocab(262_144), tensors=True
    )


def test_tiny_llama_header(tiny: Path) -> None:
    h = read_header_file(tiny)
    assert h.version == 3
    assert h.architecture == "llama"
    assert h.metadata["llama.block_count"] == 2
    assert h.metadata["llama.embedding_length"] == 64
    assert h.metadata["llama.attention.head_count"] == 2
    assert h.metadata["llama.attention.head_count_kv"] == 1
    assert h.metadata["llama.context_length"] == 4096
    assert h.metadata["tokenizer.ggml.model"] == "llama"
    assert h.metadata["tokenizer.ggml.add_bos_token"] is True
    tokens = h.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, SkippedArray)
    assert tokens.element_type == "STRING"
    assert "tokenizer.ggml.tokens" in h.skipped
    assert h.file_size == tiny.stat().st_size
    assert h.tensor_count == 3 + 9 * 2
    # GGUFReader agrees on every value we kept, and on where the key/values end.
    r = gguf.GGUFReader(tiny)
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        ours = h.metadata[key]
        if isinstance(ours, SkippedArray):
            assert ours.length == len(field.data)
        else:
            assert ours == pytest.approx(field.contents())
    assert h.metadata_bytes == max(
        f.offset + sum(p.nbytes for p in f.parts) for f in r.fields.values()
    )


def test_v2_file_reads_the_same(tiny: Path) -> None:
    data = tiny.read_bytes()
    v3 = parse_header_bytes(data)
    v2 = parse_header_bytes(as_version(data, 2))
    assert v2.version == 2
    assert v2.metadata == v3.metadata


@pytest.mark.parametrize(
    ("version", "message"),
    [(1, "version 1 is not supported"), (4, "unsupported GGUF version 4")],
)
def test_other_versions_refused(tiny: Path, version: int, message: str) -> None:
    with pytest.raises(HeaderError, match=message):
        parse_header_bytes(as_version(tiny.read_bytes(), version))


def test_big_endian_refused(tiny: Path) -> None:
    data = tiny.read_bytes()
    with pytest.raises(HeaderError, match="big-endian"):
        parse_header_bytes(data[:4] + (3).to_bytes(4, "big") + data[8:])


def test_header_error_is_a_project_error() -> None:
    assert issubclass(HeaderError, TensorlessError)


def test_bad_magic(tmp_path: Path) -> None:
    with pytest.raises(HeaderError, match="not a GGUF"):
        parse_header_bytes(b"GGML" + bytes(60))


def test_truncated_everywhere(tiny: Path) -> None:
    data = tiny.read_bytes()
    end = read_header_file(tiny).metadata_bytes
    for cut in [0, 3, 4, 7, 8, 15, 16, 23, 24, 30, end // 3, end // 2, end - 9, end - 1]:
        with pytest.raises(HeaderError, match=r"truncated|not a GGUF"):
            parse_header_bytes(data[:cut])


def test_truncated_file_on_disk(tiny: Path, tmp_path: Path) -> None:
    end = read_header_file(tiny).metadata_bytes
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[: end - 100])
    with pytest.raises(HeaderError, match="truncated"):
        read_header_file(cut, first_chunk=1024)


def _preamble(version: int, n_tensors: int, n_kv: int) -> bytes:
    return struct.pack("<IIQQ", gguf.GGUF_MAGIC, version, n_tensors, n_kv)


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def test_absurd_counts_refused() -> None:
    with pytest.raises(HeaderError, match="absurd metadata key count"):
        parse_header_bytes(_preamble(3, 0, 1 << 40))
    with pytest.raises(HeaderError, match="absurd tensor count"):
        parse_header_bytes(_preamble(3, 1 << 40, 1))
    arr = _key("a") + struct.pack("<IIQ", VT.ARRAY, VT.UINT8, 1 << 50)
    with pytest.raises(HeaderError, match="absurd array length"):
        parse_header_bytes(_preamble(3, 0, 1) + arr)
    huge_str = _key("s") + struct.pack("<IQ", VT.STRING, 1 << 62)
    with pytest.raises(HeaderError, match="value of 's' is 4611686018427387904 bytes long"):
        parse_header_bytes(_preamble(3, 0, 1) + huge_str)
    long_key = struct.pack("<Q", 1 << 20)
    with pytest.raises(HeaderError, match="metadata key is"):
        parse_header_bytes(_preamble(3, 0, 1) + long_key)


def test_unknown_type_and_bad_utf8_refused() -> None:
    with pytest.raises(HeaderError, match="unknown value type 99"):
        parse_header_bytes(_preamble(3, 0, 1) + _key("k") + struct.pack("<I", 99))
    bad_key = struct.pack("<Q", 2) + b"\xff\xfe" + struct.pack("<IB", VT.UINT8, 1)
    with pytest.raises(HeaderError, match="not valid UTF-8"):
        parse_header_bytes(_preamble(3, 0, 1) + bad_key)


def test_duplicate_key_refused() -> None:
    kv = _key("k") + struct.pack("<IB", VT.UINT8, 1)
    with pytest.raises(HeaderError, match="duplicate"):
        parse_header_bytes(_preamble(3, 0, 2) + kv + kv)


def test_metadata_over_64_mib_refused(tmp_path: Path) -> None:
    # One string array whose elements need more than 64 MiB: refused before fetching it all.
    n = 5_000
    elem = struct.pack("<Q", 16_000) + b"x" * 16_000
    head = (
        _preamble(3, 0, 1)
        + _key("tokenizer.ggml.tokens")
        + struct.pack("<IIQ", VT.ARRAY, VT.STRING, n)
    )
    f = tmp_path / "huge.gguf"
    with f.open("wb") as out:
        out.write(head)
        for _ in range(n):
            out.write(elem)
    with pytest.raises(HeaderError, match="larger than 64 MiB"):
        read_header_file(f)


def test_per_layer_arrays_kept_as_lists(tmp_path: Path) -> None:
    f = write_tiny_llama(
        tmp_path / "gqa.gguf", n_layer=4, head_count_kv=[1, 0, 2, 1], tensors=False
    )
    h = read_header_file(f)
    assert h.metadata["llama.attention.head_count_kv"] == [1, 0, 2, 1]


def test_nested_arrays_and_all_scalar_types(tmp_path: Path) -> None:
    f = write_header_only(
        tmp_path / "types.gguf",
        "llama",
        {
            "u8": (7, VT.UINT8),
            "i8": (-7, VT.INT8),
            "u16": (700, VT.UINT16),
            "i16": (-700, VT.INT16),
            "i32": (-70000, VT.INT32),
            "u64": (1 << 40, VT.UINT64),
            "i64": (-(1 << 40), VT.INT64),
            "f64": (0.5, VT.FLOAT64),
            "f32": (0.25, VT.FLOAT32),
            "b": (False, VT.BOOL),
            "strs": (["a", "bc"], VT.ARRAY),
            "nested": ([[1, 2], [3]], VT.ARRAY),
            "bools": ([True, False, True], VT.ARRAY),
        },
    )
    m = read_header_file(f).metadata
    assert m["u8"] == 7 and m["i8"] == -7 and m["u16"] == 700 and m["i16"] == -700
    assert m["i32"] == -70000 and m["u64"] == 1 << 40 and m["i64"] == -(1 << 40)
    assert m["f64"] == 0.5 and m["f32"] == 0.25 and m["b"] is False
    assert m["strs"] == ["a", "bc"]
    assert m["nested"] == SkippedArray("ARRAY", 2)
    assert m["bools"] == [True, False, True]


def test_big_vocab_is_skipped_fast(big: Path) -> None:
    t0 = time.perf_counter()
    h = read_header_file(big)
    elapsed = time.perf_counter() - t0
    assert h.metadata["tokenizer.ggml.tokens"] == SkippedArray("STRING", 262_144)
    assert h.metadata["tokenizer.ggml.scores"] == SkippedArray("FLOAT32", 262_144)
    assert h.metadata_bytes > 4 * 1024 * 1024
    assert h.bytes_fetched < 2 * h.metadata_bytes + FIRST_CHUNK_BYTES
    assert elapsed < 1.0, elapsed


# --- HTTP ---------------------------------------------------------------------------------------


def test_range_reads_only_the_header(big: Path) -> None:
    size = big.stat().st_size
    with serve({"/m.gguf": Route(file=big)}) as (base, log):
        h = read_header_url(base + "/m.gguf")
    assert h.metadata == read_header_file(big).metadata
    assert h.file_size == size
    assert h.bytes_fetched == log.bytes_sent
    assert all("Range" in r for r in log.requests)
    # The file is mostly weights; we fetched the metadata rounded up to a power-of-two chunk.
    assert log.bytes_sent < 2 * h.metadata_bytes + FIRST_CHUNK_BYTES
    assert log.bytes_sent < size / 2


def test_range_small_file_ends_before_first_chunk(tmp_path: Path) -> None:
    small = write_tiny_llama(tmp_path / "h.gguf", tensors=False)
    with serve({"/t.gguf": Route(file=small)}) as (base, log):
        h = read_header_url(base + "/t.gguf")
    assert h.architecture == "llama"
    assert len(log.requests) == 1
    assert log.bytes_sent == small.stat().st_size == h.bytes_fetched


def test_range_one_request_when_the_header_fits_the_first_chunk(tiny: Path) -> None:
    with serve({"/t.gguf": Route(file=tiny)}) as (base, log):
        h = read_header_url(base + "/t.gguf")
    assert h.metadata_bytes < FIRST_CHUNK_BYTES < tiny.stat().st_size
    assert len(log.requests) == 1
    assert log.bytes_sent == FIRST_CHUNK_BYTES == h.bytes_fetched


def test_server_ignoring_range_is_read_only_as_far_as_needed(big: Path) -> None:
    with serve({"/m.gguf": Route(file=big, honour_range=False)}) as (base, _log):
        h = read_header_url(base + "/m.gguf")
    assert h.metadata["tokenizer.ggml.tokens"] == SkippedArray("STRING", 262_144)
    # Each retry re-reads from 0 on a 200, so the cost is bounded by the sum of the chunks.
    assert h.bytes_fetched < 4 * h.metadata_bytes + 2 * FIRST_CHUNK_BYTES
    assert h.bytes_fetched < big.stat().st_size


def test_token_sent_as_bearer_and_not_leaked_across_hosts(tiny: Path) -> None:
    with serve({"/t.gguf": Route(file=tiny)}) as (cdn, cdn_log):
        cdn_url = cdn.replace("127.0.0.1", "localhost") + "/t.gguf"
        routes = {"/r/t.gguf": Route(redirect_to=cdn_url), "/same": Route(redirect_to="/r/t.gguf")}
        with serve(routes) as (hub, hub_log):
            read_header_url(hub + "/same", token="hf_secret")
    assert [r.get("Authorization") for r in hub_log.requests] == ["Bearer hf_secret"] * 2
    assert cdn_log.requests and all("Authorization" not in r for r in cdn_log.requests)


def test_http_errors_are_header_errors_without_the_token(tiny: Path) -> None:
    routes = {"/private": Route(status=401, headers={"X-Error-Code": "GatedRepo"})}
    with serve(routes) as (base, _):
        with pytest.raises(HeaderError) as e401:
            read_header_url(base + "/private", token="hf_secret")
        with pytest.raises(HeaderError, match=r"HTTP 404 \(EntryNotFound\)") as e404:
            read_header_url(base + "/missing?sig=abc", token="hf_secret")
    assert "HTTP 401" in str(e401.value) and "GatedRepo" in str(e401.value)
    for e in (e401, e404):
        assert "hf_secret" not in str(e.value)
    assert "sig=abc" not in str(e404.value)


def test_connection_refused_is_a_header_error() -> None:
    with serve({}) as (base, _):
        pass  # closed again: nothing listens there now
    with pytest.raises(HeaderError, match="cannot fetch"):
        read_header_url(base + "/x.gguf", timeout=5)
    with pytest.raises(HeaderError, match="only http and https"):
        read_header_url("file:///etc/passwd")


def test_missing_local_file() -> None:
    with pytest.raises(HeaderError, match="cannot open"):
        read_header_file("/nonexistent/model.gguf")


def test_hub_url_honours_hf_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert (
        hub_file_url("org/repo", "main", "sub/m.gguf")
        == "https://huggingface.co/org/repo/resolve/main/sub/m.gguf"
    )
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.local:8080/")
    assert (
        hub_file_url("org/repo", "refs/pr/1", "m.gguf")
        == "http://mirror.local:8080/org/repo/resolve/refs%2Fpr%2F1/m.gguf"
    )
    assert hub_file_url("o/r", COMMIT, "m.gguf", endpoint="http://x").startswith("http://x/o/r/")


def test_hub_header_cached_per_pinned_commit(
    big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    route = Route(file=big)
    with serve(
        {f"/org/repo/resolve/{COMMIT}/m.gguf": route, "/org/repo/resolve/main/m.gguf": route}
    ) as (
        base,
        log,
    ):
        monkeypatch.setenv("HF_ENDPOINT", base)
        first = read_hub_header("org/repo", COMMIT, "m.gguf", cache_dir=tmp_path / "c")
        sent = log.bytes_sent
        again = read_hub_header("org/repo", COMMIT, "m.gguf", cache_dir=tmp_path / "c")
        assert log.bytes_sent == sent  # served from the cache
        read_hub_header("org/repo", "main", "m.gguf", cache_dir=tmp_path / "c")
        assert log.bytes_sent > sent  # a branch is never cached: it can move
    assert again.metadata == first.metadata
    assert again.sha256 == first.sha256 and again.bytes_fetched == 0
    files = list((tmp_path / "c").iterdir())
    assert len(files) == 1 and files[0].suffix == ".json"  # no temp files left behind
    doc = json.loads(files[0].read_text())
    assert doc["key"] == ["org/repo", COMMIT, "m.gguf"]
    assert doc["header"]["sha256"] == first.sha256


def test_damaged_cache_entry_is_a_miss(tiny: Path, tmp_path: Path) -> None:
    cache = HeaderCache(tmp_path)
    h = read_header_file(tiny)
    cache.put("o/r", COMMIT, "t.gguf", h)
    got = cache.get("o/r", COMMIT, "t.gguf")
    assert got is not None and got.metadata == h.metadata
    assert cache.get("o/r", COMMIT, "other.gguf") is None
    for f in tmp_path.iterdir():
        f.write_text("{not json")
    assert cache.get("o/r", COMMIT, "t.gguf") is None


# --- never another exception --------------------------------------------------------------------


def _parse_or_header_error(data: bytes) -> None:
    with contextlib.suppress(HeaderError):
        parse_header_bytes(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_parse_or_header_error(data: bytes) -> None:
    _parse_or_header_error(data)
    _parse_or_header_error(b"GGUF" + data)
    _parse_or_header_error(_preamble(3, 1, 3) + data)


_TINY_HEADER: list[bytes] = []


def _tiny_header_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    if not _TINY_HEADER:
        f = write_tiny_llama(tmp_path_factory.mktemp("hyp") / "t.gguf", tensors=False)
        _TINY_HEADER.append(f.read_bytes())
    return _TINY_HEADER[0]


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(min_value=0),
)
def test_mutated_header_parses_or_header_error(
    tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(_tiny_header_bytes(tmp_path_factory))
    for pos, byte in edits:
        data[pos % len(data)] = byte
    _parse_or_header_error(bytes(data))
    _parse_or_header_error(bytes(data[: cut % (len(data) + 1)]))
