"""Attention geometry from a GGUF header, llama-server's KV cache size, and the context that fits.

Pure: headers, recipe args and numbers in, numbers out. What was read in llama.cpp to match
llama-server byte for byte (ggml-org/llama.cpp, master of late 2025 / 2026):

- src/llama-context.cpp: `cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256)`; with `kv_unified`
  `n_ctx_seq = n_ctx`, else `n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256)` and n_ctx becomes
  `n_ctx_seq * n_seq_max`. `n_batch = min(n_ctx, n_batch)`, `n_ubatch = min(n_batch, n_ubatch)`
  (both before padding). A quantized V cache needs flash attention ("auto" turns it on, "off"
  is an error).
- src/llama-model.cpp (create_memory): the KV cache gets `kv_size = n_ctx_seq` cells per stream;
  models whose swa_type is not NONE get `llama_kv_cache_iswa`.
- src/llama-kv-cache-iswa.cpp: `size_swa = GGML_PAD(min(size_base, n_swa*(unified ? n_seq_max : 1)
  + n_ubatch), 256)`, or `size_base` with `--swa-full`.
- src/llama-kv-cache.cpp: `n_stream = unified ? 1 : n_seq_max`; per layer K is
  `[n_embd_k_gqa(il), kv_size, n_stream]` of type_k and V `[n_embd_v_gqa, ...]` of type_v, where
  V uses `n_embd_v_gqa_max()` for every layer when V is transposed (no flash attention). It logs
  `llama_kv_cache: size = X MiB (N cells, L layers, s/S seqs), K (t): ..., V (t): ...`.
- src/llama-hparams.cpp: `set_swa_pattern(n)`: layer il is SWA iff `il % n < n - 1`.
  gemma3/gemma-embedding call set_swa_pattern(6) (pattern keys ignored), gemma2 and gpt-oss 2,
  cohere2 4; other archs read `attention.sliding_window_pattern` as a period or a per-layer bool
  array (true = SWA). qwen3next/qwen35: layer i is recurrent (no KV) iff
  `(i + 1) % full_attention_interval != 0` (default 4).
- tools/server/server.cpp: without `-np` the server uses n_parallel = 4 and kv_unified = true;
  with `-np N` the cache is split into N streams unless `-kvu`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, Keys
from tensorless_deploy.gguf.header import GGUFHeader, SkippedArray, Value

MiB = 1024 * 1024
GiB = 1024 * MiB

# llama.cpp pads n_ctx and the SWA cache to 256 cells.
CTX_PAD = 256
# llama-server defaults (tools/server, common/common.h).
DEFAULT_UBATCH = 512
DEFAULT_BATCH = 2048
AUTO_PARALLEL = 4  # what `-np` unset means: 4 slots over one unified cache

# --- the memory model --------------------------------------------------------------------------
# Skulk (docs/design.md#placement-preview) charges weights x 1.10 + KV + 256 MiB within
# min(free, 0.90 x total). We itemize instead, so the margin only has to cover what we cannot see:
#  - weights: the GGUF file size, uncorrected. Every tensor byte is in the file and the file holds
#    nothing else but the header; llama.cpp keeps token_embd in host memory, so this is already
#    an upper bound on what lands on the card. No 10% fudge.
#  - KV: exact, the same bytes llama-server allocates (see the module docstring).
#  - compute buffer: llama.cpp reserves the worst-case graph at n_ubatch tokens, all of them
#    outputs. Its peak is the logits tensor [n_vocab, n_ubatch] f32 (Llama 3 8B at -ub 512:
#    128256 x 512 x 4 = 250.5 MiB, logged "compute buffer size = 258.5 MiB"), or without flash
#    attention the KQ scores [n_kv, n_ubatch, n_head] f32, kept twice (scores and softmax).
#    We take the largest of those and of the FFN activations, add COMPUTE_SLACK and a fixed base.
#  - RUNTIME_OVERHEAD_BYTES: the CUDA context, cuBLAS workspace and ggml's pools of the
#    llama-server process, which nvidia-smi counts as used but no llama.cpp log reports
#    (300-500 MiB on the cards we target).
#  - CARD_HEADROOM: left free on the card for fragmentation and other processes' growth:
#    2% of total memory, at least 256 MiB (1.6 GB on an 80 GB card, where Skulk leaves 8 GB).
COMPUTE_SLACK = 1.25
COMPUTE_BASE_BYTES = 64 * MiB
RUNTIME_OVERHEAD_BYTES = 512 * MiB
CARD_HEADROOM_FRACTION = 0.02
CARD_HEADROOM_MIN_BYTES = 256 * MiB

# KV cache types llama-server accepts for -ctk/-ctv.
CACHE_TYPES: dict[str, GGMLQuantizationType] = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0,
    "q4_1": GGMLQuantizationType.Q4_1,
    "q5_0": GGMLQuantizationType.Q5_0,
    "q5_1": GGMLQuantizationType.Q5_1,
    "iq4_nl": GGMLQuantizationType.IQ4_NL,
}

# Archs whose SWA layer pattern llama.cpp hard-codes (period for set_swa_pattern).
_SWA_PERIOD_BY_ARCH = {"gemma2": 2, "gemma3": 6, "gemma-embedding": 6, "cohere2": 4, "gpt-oss": 2}
# Archs where llama.cpp ignores a pattern key and uses only the period above.
_SWA_PATTERN_KEY_IGNORED = {"gemma3", "gemma-embedding"}
# gemma2 files written before the sliding_window key existed: llama.cpp used 4096.
_SWA_DEFAULT_WINDOW = {"gemma2": 4096}
# Hybrid archs with recurrent layers between full-attention ones (full_attention_interval).
_HYBRID_INTERVAL_ARCHS = {"qwen3next", "qwen35", "qwen35moe"}


class GeometryError(TensorlessError):
    """The header lacks what KV sizing needs, or describes a cache we do not model."""


class KVSettingsError(TensorlessError):
    """llama-server settings that are invalid, or that llama-server would refuse for this model."""


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


@dataclass(frozen=True)
class Geometry:
    """Attention shape of one model, per layer, as llama.cpp sees it."""

    architecture: str
    block_count: int
    context_length: int
    embedding_length: int
    vocab_size: int
    feed_forward_length: int
    head_count: tuple[int, ...]  # per layer
    head_count_kv: tuple[int, ...]  # per layer; 0 = no KV (not an attention layer)
    key_length: tuple[int, ...]  # per layer head dim of K
    value_length: tuple[int, ...]
    sliding_window: int  # n_swa; 0 = none
    swa_layers: tuple[bool, ...]  # per layer

    @property
    def kv_layers(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.head_count_kv) if n > 0)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i in self.kv_layers if not self.swa_layers[i])

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        return tuple(i for i in self.kv_layers if self.swa_layers[i])

    def n_embd_k(self, il: int) -> int:
        return self.head_count_kv[il] * self.key_length[il]

    def n_embd_v(self, il: int) -> int:
        return self.head_count_kv[il] * self.value_length[il]


def _int(meta: Mapping[str, Value], key: str, src: str, default: int | None = None) -> int:
    v = meta.get(key)
    if v is None:
        if default is None:
            raise GeometryError(f"{src}: GGUF header has no {key}")
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise GeometryError(f"{src}: {key} must be a non-negative integer, not {v!r}")
    return v


def _per_layer(
    meta: Mapping[str, Value], key: str, n_layer: int, src: str, default: int | None = None
) -> tuple[int, ...]:
    v = meta.get(key)
    if isinstance(v, list):
        if len(v) != n_layer or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v
        ):
            raise GeometryError(f"{src}: {key} must hold {n_layer} non-negative integers")
        return tuple(int(x) for x in v)
    if isinstance(v, SkippedArray):
        raise GeometryError(f"{src}: {key} is an array of {v.length}, longer than any model's")
    return (_int(meta, key, src, default),) * n_layer


def geometry(header: GGUFHeader | Mapping[str, Value], source: str = "") -> Geometry:
    """The attention geometry llama.cpp derives from these header keys."""
    if isinstance(header, GGUFHeader):
        meta: Mapping[str, Value] = header.metadata
        src = source or header.source
    else:
        meta, src = header, source or "GGUF"
    arch = meta.get(Keys.General.ARCHITECTURE)
    if not isinstance(arch, str) or not arch:
        raise GeometryError(f"{src}: GGUF header has no {Keys.General.ARCHITECTURE}")

    def k(template: str) -> str:
        return template.format(arch=arch)

    A = Keys.Attention
    if k(A.KEY_LENGTH_MLA) in meta or k(A.KV_LORA_RANK) in meta:
        raise GeometryError(
            f"{src}: {arch} uses multi-head latent attention; its KV cache is not modeled yet"
        )
    n_layer = _int(meta, k(Keys.LLM.BLOCK_COUNT), src)
    if n_layer == 0 or n_layer > 10_000:
        raise GeometryError(f"{src}: {k(Keys.LLM.BLOCK_COUNT)} = {n_layer} is not plausible")
    n_embd = _int(meta, k(Keys.LLM.EMBEDDING_LENGTH), src)
    n_ctx_train = _int(meta, k(Keys.LLM.CONTEXT_LENGTH), src)
    n_head = _per_layer(meta, k(A.HEAD_COUNT), n_layer, src)
    n_head_kv = _per_layer(meta, k(A.HEAD_COUNT_KV), n_layer, src, default=-1)
    if n_head_kv[0] == -1:  # llama.cpp: no head_count_kv means no GQA
        n_head_kv = n_head
    head0 = n_head[0] or max(n_head)
    dflt = n_embd // head0 if head0 else 0
    n_k = _int(meta, k(A.KEY_LENGTH), src, default=dflt)
    n_v = _int(meta, k(A.VALUE_LENGTH), src, default=dflt)
    n_k_swa = _int(meta, k(A.KEY_LENGTH_SWA), src, default=n_k)
    n_v_swa = _int(meta, k(A.VALUE_LENGTH_SWA), src, default=n_v)

    n_swa = _int(meta, k(A.SLIDING_WINDOW), src, default=_SWA_DEFAULT_WINDOW.get(arch, 0))
    swa = _swa_layers(meta, arch, k(A.SLIDING_WINDOW_PATTERN), n_layer, n_swa, src)

    if arch in _HYBRID_INTERVAL_ARCHS or k(Keys.LLM.FULL_ATTENTION_INTERVAL) in meta:
        interval = _int(meta, k(Keys.LLM.FULL_ATTENTION_INTERVAL), src, default=4)
        if interval == 0:
            raise GeometryError(f"{src}: {k(Keys.LLM.FULL_ATTENTION_INTERVAL)} is 0")
        n_head_kv = tuple(n if (i + 1) % interval == 0 else 0 for i, n in enumerate(n_head_kv))

    tokens = meta.get(Keys.Tokenizer.LIST)
    if isinstance(tokens, (SkippedArray, list)):
        n_vocab = tokens.length if isinstance(tokens, SkippedArray) else len(tokens)
    else:
        n_vocab = _int(meta, k(Keys.LLM.VOCAB_SIZE), src, default=0)
    ff = meta.get(k(Keys.LLM.FEED_FORWARD_LENGTH))
    if isinstance(ff, list):
        n_ff = max((int(x) for x in ff), default=0)
    else:
        n_ff = _int(meta, k(Keys.LLM.FEED_FORWARD_LENGTH), src, default=4 * n_embd)

    key_len = tuple(n_k_swa if swa[i] else n_k for i in range(n_layer))
    val_len = tuple(n_v_swa if swa[i] else n_v for i in range(n_layer))
    if any(n_head_kv[i] > 0 and (key_len[i] == 0 or val_len[i] == 0) for i in range(n_layer)):
        raise GeometryError(f"{src}: attention head dimensions are zero")
    return Geometry(
        architecture=arch,
        block_count=n_layer,
        context_length=n_ctx_train,
        embedding_length=n_embd,
        vocab_size=n_vocab,
        feed_forward_length=n_ff,
        head_count=n_head,
        head_count_kv=n_head_kv,
        key_length=key_len,
        value_length=val_len,
        sliding_window=n_swa,
        swa_layers=swa,
    )


def _swa_layers(
    meta: Mapping[str, Value], arch: str, pattern_key: str, n_layer: int, n_swa: int, src: str
) -> tuple[bool, ...]:
    if n_swa == 0:
        return (False,) * n_layer
    period = _SWA_PERIOD_BY_ARCH.get(arch)
    pattern = None if arch in _SWA_PATTERN_KEY_IGNORED else meta.get(pattern_key)
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise GeometryError(f"{src}: {pattern_key} must hold {n_layer} entries")
        return tuple(bool(x) for x in pattern)
    if isinstance(pattern, SkippedArray):
        raise GeometryError(f"{src}: {pattern_key} is an array of {pattern.length}")
    if pattern is not None:
        period = _int(meta, pattern_key, src)
    if period is None:
        # A window but no pattern: llama.cpp treats every layer as SWA only where the arch says
        # so; without that we cannot know, so say it rather than guess.
        raise GeometryError(
            f"{src}: {arch} has a sliding window but no layer pattern this tool knows"
        )
    return tuple(period == 0 or (il % period) < (period - 1) for il in range(n_layer))


# --- llama-server settings ---------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSettings:
    """The llama-server settings that size the KV cache (from a recipe's args)."""

    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"  # on | off | auto
    n_parallel: int | None = None  # None: llama-server's auto (4 slots, unified)
    n_ubatch: int = DEFAULT_UBATCH
    n_batch: int = DEFAULT_BATCH
    swa_full: bool = False
    kv_unified: bool | None = None  # None: llama-server's default for n_parallel
    ctx_size: int | None = None  # -c, when the args carry it

    @property
    def n_seq(self) -> int:
        return AUTO_PARALLEL if self.n_parallel is None else self.n_parallel

    @property
    def unified(self) -> bool:
        if self.kv_unified is not None:
            return self.kv_unified
        return self.n_parallel is None

    @property
    def flash(self) -> bool:
        """Whether flash attention is on. "auto" resolves to on for the CUDA cards we plan for."""
        return self.flash_attn != "off"


_FLAGS_VALUE = {
    "-ctk": "cache_type_k",
    "--cache-type-k": "cache_type_k",
    "-ctv": "cache_type_v",
    "--cache-type-v": "cache_type_v",
    "-np": "n_parallel",
    "--parallel": "n_parallel",
    "-ub": "n_ubatch",
    "--ubatch-size": "n_ubatch",
    "-b": "n_batch",
    "--batch-size": "n_batch",
    "-c": "ctx_size",
    "--ctx-size": "ctx_size",
}
_FA_VALUES = {
    "on": "on",
    "off": "off",
    "auto": "auto",
    "true": "on",
    "false": "off",
    "1": "on",
    "0": "off",
    "enabled": "on",
    "disabled": "off",
}


def parse_server_args(args: Sequence[str]) -> ServerSettings:
    """Pick the KV-relevant settings out of a llama-server argument list; ignore the rest."""
    vals: dict[str, str] = {}
    fa = "auto"
    swa_full = False
    unified: bool | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        if name in _FLAGS_VALUE:
            if eq:
                vals[name] = inline
            elif i + 1 < len(args):
                vals[name] = args[i + 1]
                i += 1
            else:
                raise KVSettingsError(f"llama-server argument {name} needs a value")
        elif name in ("-fa", "--flash-attn"):
            if eq:
                value: str | None = inline
            elif i + 1 < len(args) and args[i + 1].lower() in _FA_VALUES:
                value = args[i + 1]
                i += 1
            else:
                value = None  # older builds: a bare switch meaning "on"
            if value is None:
                fa = "on"
            elif value.lower() in _FA_VALUES:
                fa = _FA_VALUES[value.lower()]
            else:
                raise KVSettingsError(f"{name} {value}: expected on, off or auto")
        elif arg == "--swa-full":
            swa_full = True
        elif arg in ("-kvu", "--kv-unified"):
            unified = True
        elif arg in ("-no-kvu", "--no-kv-unified"):
            unified = False
        i += 1

    fields: dict[str, str | int] = {}
    for flag, raw in vals.items():
        field = _FLAGS_VALUE[flag]
        if field.startswith("cache_type"):
            t = raw.lower()
            if t not in CACHE_TYPES:
                raise KVSettingsError(
                    f"{flag} {raw}: unknown KV cache type (one of {', '.join(CACHE_TYPES)})"
                )
            fields[field] = t
        else:
            try:
                n = int(raw)
            except ValueError:
                raise KVSettingsError(f"{flag} {raw}: expected an integer") from None
            if n < 0 or (n == 0 and field != "ctx_size"):
                raise KVSettingsError(f"{flag} {raw}: must be positive")
            fields[field] = n
    parallel = fields.get("n_parallel")
    return ServerSettings(
        cache_type_k=str(fields.get("cache_type_k", "f16")),
        cache_type_v=str(fields.get("cache_type_v", "f16")),
        flash_attn=fa,
        n_parallel=int(parallel) if parallel is not None else None,
        n_ubatch=int(fields.get("n_ubatch", DEFAULT_UBATCH)),
        n_batch=int(fields.get("n_batch", DEFAULT_BATCH)),
        swa_full=swa_full,
        kv_unified=unified,
        ctx_size=int(fields["ctx_size"]) if "ctx_size" in fields else None,
    )


# --- KV cache size -----------------------------------------------------------------------------


def _row_bytes(cache_type: str, n_elements: int) -> int:
    block, size = GGML_QUANT_SIZES[CACHE_TYPES[cache_type]]
    return n_elements // block * size


def check_settings(geom: Geometry, settings: ServerSettings) -> None:
    """Refuse what llama-server would refuse: rows not whole blocks, quantized V without FA."""
    for field, t in (("-ctk", settings.cache_type_k), ("-ctv", settings.cache_type_v)):
        if t not in CACHE_TYPES:
            raise KVSettingsError(f"{field} {t}: unknown KV cache type")
    if settings.cache_type_v not in ("f32", "f16", "bf16") and not settings.flash:
        raise KVSettingsError(
            f"-ctv {settings.cache_type_v} needs flash attention, and the recipe turns it off",
            fix="use -fa on (or auto), or an f16 V cache",
        )
    for il in geom.kv_layers:
        for what, t, n in (
            ("key_length", settings.cache_type_k, geom.key_length[il]),
            ("value_length", settings.cache_type_v, geom.value_length[il]),
        ):
            block = GGML_QUANT_SIZES[CACHE_TYPES[t]][0]
            if n % block:
                raise KVSettingsError(
                    f"{geom.architecture}: {what} {n} is not a multiple of {block}, "
                    f"which a {t} KV cache needs",
                    fix="use an f16 or q8_0 cache type that divides the head size",
                )


@dataclass(frozen=True)
class KVCache:
    """What llama-server allocates for the KV cache at one context size."""

    n_ctx: int  # total cells after llama.cpp's padding (what `-c` becomes)
    n_ctx_seq: int  # cells per stream of the full-attention cache
    n_seq: int
    n_stream: int  # 1 when unified
    full_cells: int  # per stream
    swa_cells: int  # per stream
    full_layers: int
    swa_layers: int
    k_bytes_full: int
    v_bytes_full: int
    k_bytes_swa: int
    v_bytes_swa: int
    kv_bytes_per_token: int  # per cell of context, over the full-attention layers

    @property
    def full_bytes(self) -> int:
        return self.k_bytes_full + self.v_bytes_full

    @property
    def swa_bytes(self) -> int:
        return self.k_bytes_swa + self.v_bytes_swa

    @property
    def total_bytes(self) -> int:
        return self.full_bytes + self.swa_bytes


def _layer_row_bytes(geom: Geometry, settings: ServerSettings, il: int) -> tuple[int, int]:
    k = _row_bytes(settings.cache_type_k, geom.n_embd_k(il))
    if settings.flash:
        n_v = geom.n_embd_v(il)
    else:  # V is stored transposed and every layer padded to the widest
        n_v = max(geom.n_embd_v(j) for j in range(geom.block_count))
    return k, _row_bytes(settings.cache_type_v, n_v)


def _effective_ubatch(settings: ServerSettings, n_ctx_requested: int) -> int:
    n_batch = min(n_ctx_requested, settings.n_batch)
    return min(n_batch, settings.n_ubatch)


def kv_cache(geom: Geometry, settings: ServerSettings, n_ctx: int) -> KVCache:
    """The KV cache llama-server allocates for `-c n_ctx` (0: the model's context_length)."""
    check_settings(geom, settings)
    requested = n_ctx if n_ctx > 0 else geom.context_length
    if requested <= 0:
        raise KVSettingsError("context size must be positive")
    n_seq = settings.n_seq
    unified = settings.unified or n_seq == 1
    total = _pad(requested, CTX_PAD)
    if unified:
        n_ctx_seq, n_stream = total, 1
    else:
        n_ctx_seq, n_stream = _pad(total // n_seq, CTX_PAD), n_seq
        if n_ctx_seq == 0:
            raise KVSettingsError(f"-c {requested} is too small for -np {n_seq}")
        total = n_ctx_seq * n_seq
    n_ubatch = _effective_ubatch(settings, requested)
    if settings.swa_full:
        swa_cells = n_ctx_seq
    else:
        swa_seqs = n_seq if unified else 1
        swa_cells = _pad(min(n_ctx_seq, geom.sliding_window * swa_seqs + n_ubatch), CTX_PAD)

    kf = vf = ks = vs = 0
    per_token = 0
    for il in geom.kv_layers:
        k_row, v_row = _layer_row_bytes(geom, settings, il)
        if geom.swa_layers[il]:
            ks += k_row * swa_cells * n_stream
            vs += v_row * swa_cells * n_stream
        else:
            kf += k_row * n_ctx_seq * n_stream
            vf += v_row * n_ctx_seq * n_stream
            per_token += k_row + v_row
    return KVCache(
        n_ctx=total,
        n_ctx_seq=n_ctx_seq,
        n_seq=n_seq,
        n_stream=n_stream,
        full_cells=n_ctx_seq,
        swa_cells=swa_cells,
        full_layers=len(geom.full_layers),
        swa_layers=len(geom.sliding_layers),
        k_bytes_full=kf,
        v_bytes_full=vf,
        k_bytes_swa=ks,
        v_bytes_swa=vs,
        kv_bytes_per_token=per_token,
    )


def kv_bytes_per_token(geom: Geometry, settings: ServerSettings) -> int:
    """Bytes one more token of context costs (full-attention layers; SWA layers are bounded)."""
    check_settings(geom, settings)
    return sum(sum(_layer_row_bytes(geom, settings, il)) for il in geom.full_layers)


# --- memory fit --------------------------------------------------------------------------------


def compute_buffer_bytes(geom: Geometry, settings: ServerSettings, n_ctx: int) -> int:
    """Estimate of llama.cpp's compute buffer on the card (see the memory model above)."""
    requested = n_ctx if n_ctx > 0 else geom.context_length
    n_ub = _effective_ubatch(settings, requested)
    widest = max(
        geom.vocab_size + geom.embedding_length,
        3 * geom.feed_forward_length + 2 * geom.embedding_length,
    )
    if not settings.flash:
        cache = kv_cache(geom, settings, n_ctx)
        n_kv = cache.n_ctx_seq if geom.full_layers else cache.swa_cells
        widest = max(widest, 2 * max(geom.head_count) * n_kv)
    return int(n_ub * 4 * widest * COMPUTE_SLACK) + COMPUTE_BASE_BYTES


@dataclass(frozen=True)
class MemoryEstimate:
    """What one llama-server instance needs on its card, item by item."""

    n_ctx: int
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    overhead_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.overhead_bytes


def estimate_memory(
    geom: Geometry, settings: ServerSettings, n_ctx: int, weights_bytes: int
) -> MemoryEstimate:
    cache = kv_cache(geom, settings, n_ctx)
    return MemoryEstimate(
        n_ctx=cache.n_ctx,
        weights_bytes=weights_bytes,
        kv_bytes=cache.total_bytes,
        compute_bytes=compute_buffer_bytes(geom, settings, n_ctx),
        overhead_bytes=RUNTIME_OVERHEAD_BYTES,
    )


def usable_bytes(free_bytes: int, total_bytes: int) -> int:
    """Card memory a plan may fill: what is free, less the headroom we always leave."""
    headroom = max(CARD_HEADROOM_MIN_BYTES, int(total_bytes * CARD_HEADROOM_FRACTION))
    return max(0, min(free_bytes, total_bytes) - headroom)


def max_context(
    available_bytes: int, weights_bytes: int, geom: Geometry, settings: ServerSettings
) -> int:
    """The largest `-c` that fits in `available_bytes` (see usable_bytes), capped at the model's
    context_length; 0 when not even 256 tokens fit. Steps of 256, llama.cpp's padding."""
    cap = geom.context_length
    if cap <= 0:
        raise GeometryError(f"{geom.architecture}: context_length is 0")

    def fits(c: int) -> bool:
        return estimate_memory(geom, settings, c, weights_bytes).total_bytes <= available_bytes

    if fits(cap):
        return cap
    lo, hi = 0, (cap - 1) // CTX_PAD  # answer is lo*256; hi*256 < cap
    if hi == 0 or not fits(CTX_PAD):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * CTX_PAD):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_PAD


# --- llama-server's own report, for checking the numbers above ---------------------------------

_KV_LOG_RE = re.compile(
    r"llama_kv_cache(?:_unified)?:\s+size\s*=\s*([\d.]+)\s*MiB\s*\(\s*(\d+)\s*cells,\s*(\d+)\s*"
    r"layers,\s*(\d+)/(\d+)\s*seqs\),\s*K\s*\((\w+)\):\s*([\d.]+)\s*MiB,\s*V\s*\((\w+)\):\s*"
    r"([\d.]+)\s*MiB"
)


@dataclass(frozen=True)
class KVLogLine:
    """One `llama_kv_cache: size = ...` line of a llama-server log (one per cache: full, SWA)."""

    size_mib: float
    cells: int
    layers: int
    n_seq: int
    n_stream: int
    type_k: str
    k_mib: float
    type_v: str
    v_mib: float


def parse_kv_cache_log(text: str) -> list[KVLogLine]:
    return [
        KVLogLine(
            size_mib=float(m[1]),
            cells=int(m[2]),
            layers=int(m[3]),
            n_seq=int(m[4]),
            n_stream=int(m[5]),
            type_k=m[6],
            k_mib=float(m[7]),
            type_v=m[8],
            v_mib=float(m[9]),
        )
        for m in _KV_LOG_RE.finditer(text)
    ]
