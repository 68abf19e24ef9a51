#!/usr/bin/env python3
"""Generate a tiny random-weight llama-architecture GGUF that llama-server loads and serves.

Adapted from a generator seen working here (docs/field-notes.md#a-tiny-gguf). Deterministic per
seed:
the same arguments give the same bytes. Needs the `gguf` package (and numpy), present in the
project venv.

    python tests/hosts/tiny_gguf.py OUT.gguf [--seed 0] [--ctx 4096] [--dtype f32|f16]

Model: llama arch, 2 layers, n_embd 64, 2 heads (head_dim 32, so quantized KV types work),
1 KV head (GQA), n_ff 128, SentencePiece-style vocabulary (<unk>/<s>/</s>, 256 byte-fallback
tokens, a few hundred ASCII pieces), ChatML chat template. Output rows of the special/byte
tokens are scaled down so sampling prefers printable pieces: max_tokens=N normally gives N tokens.
"""

from __future__ import annotations

import argparse
import string
from collections.abc import Mapping, Sequence
from typing import Any

import gguf
import numpy as np

N_LAYER = 2
N_EMBD = 64
N_HEAD = 2
N_HEAD_KV = 1
HEAD_DIM = N_EMBD // N_HEAD  # 32
N_FF = 128
MODEL_NAME = "tiny-random-llama"

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_vocab() -> tuple[list[str], list[float], list[int], int]:
    t = gguf.TokenType
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []

    def add(tok: str, score: float, typ: int) -> None:
        tokens.append(tok)
        scores.append(float(score))
        types.append(int(typ))

    add("<unk>", 0.0, t.UNKNOWN)  # id 0
    add("<s>", 0.0, t.CONTROL)  # id 1 (BOS)
    add("</s>", 0.0, t.CONTROL)  # id 2 (EOS)
    for b in range(256):  # ids 3..258: byte fallback
        add(f"<0x{b:02X}>", 0.0, t.BYTE)
    n_special = len(tokens)
    pieces = ["\u2581"]
    pieces += list(string.ascii_letters + string.digits + string.punctuation)
    pieces += ["\u2581" + c for c in string.ascii_lowercase]
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "it",
        "you",
        "that",
        "he",
        "was",
        "for",
        "on",
        "are",
        "with",
        "as",
        "his",
        "they",
        "be",
        "at",
        "one",
        "have",
        "this",
        "from",
        "or",
        "had",
        "by",
        "hello",
        "world",
        "test",
        "tiny",
        "model",
        "llama",
        "server",
        "ok",
        "yes",
        "no",
    ]
    pieces += ["\u2581" + w for w in words]
    seen = set(tokens)
    for i, p in enumerate(pieces):
        if p in seen:
            continue
        seen.add(p)
        # SentencePiece merges prefer higher scores: longer pieces score higher
        add(p, -1000.0 + len(p) * 10 - i * 1e-3, t.NORMAL)
    return tokens, scores, types, n_special


def write_tiny_gguf(
    out: str,
    seed: int = 0,
    ctx: int = 4096,
    dtype: str = "f32",
    *,
    n_layer: int = N_LAYER,
    head_count_kv: int | Sequence[int] = N_HEAD_KV,
    vocab: tuple[list[str], list[float], list[int], int] | None = None,
    tensors: bool = True,
    extra: Mapping[str, tuple[Any, Any]] | None = None,
    arch: str = "llama",
    chat_template: bool = True,
) -> None:
    """The one tiny-GGUF writer of the tests. vocab is (tokens, scores, types, n_special); the
    special tokens' output rows are damped so sampling prefers printable pieces. With tensors
    off only the header is written (for header and KV tests)."""
    rng = np.random.default_rng(seed)
    wdt = np.float16 if dtype == "f16" else np.float32
    tokens, scores, types, n_special = vocab or build_vocab()
    n_vocab = len(tokens)
    kv_heads = [head_count_kv] * n_layer if isinstance(head_count_kv, int) else list(head_count_kv)

    w = gguf.GGUFWriter(out, arch)
    w.add_name(MODEL_NAME)
    w.add_context_length(ctx)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(head_count_kv if isinstance(head_count_kv, int) else kv_heads)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if chat_template:
        w.add_chat_template(CHATML)
    for key, (value, vtype) in (extra or {}).items():
        w.add_key_value(key, value, vtype)

    def rnd(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    if tensors:
        # numpy shape is (rows=out, cols=in); gguf stores ggml ne = [in, out]
        w.add_tensor("token_embd.weight", rnd(n_vocab, N_EMBD, scale=1.0).astype(wdt))
        w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        out_w = rnd(n_vocab, N_EMBD, scale=1.0)
        out_w[:n_special] *= 0.01
        w.add_tensor("output.weight", out_w.astype(wdt))
        for i in range(n_layer):
            p = f"blk.{i}."
            w.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            w.add_tensor(p + "attn_q.weight", rnd(N_HEAD * HEAD_DIM, N_EMBD).astype(wdt))
            w.add_tensor(p + "attn_k.weight", rnd(kv_heads[i] * HEAD_DIM, N_EMBD).astype(wdt))
            w.add_tensor(p + "attn_v.weight", rnd(kv_heads[i] * HEAD_DIM, N_EMBD).astype(wdt))
            w.add_tensor(p + "attn_output.weight", rnd(N_EMBD, N_HEAD * HEAD_DIM).astype(wdt))
            w.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            w.add_tensor(p + "ffn_gate.weight", rnd(N_FF, N_EMBD).astype(wdt))
            w.add_tensor(p + "ffn_up.weight", rnd(N_FF, N_EMBD).astype(wdt))
            w.add_tensor(p + "ffn_down.weight", rnd(N_EMBD, N_FF).astype(wdt))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    if tensors:
        w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ctx", type=int, default=4096, help="llama.context_length (n_ctx_train)")
    ap.add_argument("--dtype", choices=["f32", "f16"], default="f32")
    a = ap.parse_args()
    write_tiny_gguf(a.out, seed=a.seed, ctx=a.ctx, dtype=a.dtype)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
