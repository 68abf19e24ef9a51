"""A recipe's memory sizing from its GGUF header (the KV geometry, the server settings, the need
per context), and reading the headers a plan sizes from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.gguf import kv
from tensorless_deploy.gguf.constants import Keys
from tensorless_deploy.gguf.header import (
    GGUFHeader,
    HeaderKey,
    HeaderResult,
    header_cache_dir,
    read_headers,
)
from tensorless_deploy.recipe.schema import Recipe

ProblemKind = Literal["pending", "mismatch", "invalid"]


def header_key(recipe: Recipe) -> HeaderKey:
    m = recipe.model
    return (m.hf_repo, m.revision, m.file)


@dataclass(frozen=True)
class SizingProblem:
    """Why a recipe cannot be sized: its header not read yet (pending), a header that
    contradicts the recipe (mismatch), or settings llama-server would refuse (invalid)."""

    kind: ProblemKind
    why: str


class Sizing:
    """One recipe's KV geometry and settings, with the memory need per context memoized (a
    fleet of identical cards asks the same few contexts again and again)."""

    def __init__(self, recipe: Recipe, header: GGUFHeader) -> None:
        self.recipe = recipe
        self.geom = kv.geometry(header)
        self.settings = kv.parse_server_args(recipe.run.args)
        self.kv_bytes_per_token = kv.kv_bytes_per_token(self.geom, self.settings)
        self.weights = recipe.model.size_bytes
        self._need: dict[int, kv.MemoryEstimate] = {}
        self._max: dict[int, int] = {}

    @property
    def context_length(self) -> int:
        return self.geom.context_length

    def need(self, n_ctx: int) -> kv.MemoryEstimate:
        est = self._need.get(n_ctx)
        if est is None:
            est = kv.estimate_memory(self.geom, self.settings, n_ctx, self.weights)
            self._need[n_ctx] = est
        return est

    def max_context(self, usable: int) -> int:
        """kv.max_context, searching over the memoized needs (same steps, same answer)."""
        hit = self._max.get(usable)
        if hit is not None:
            return hit
        cap = self.geom.context_length

        def fits(c: int) -> bool:
            return self.need(c).total_bytes <= usable

        if fits(cap):
            best = cap
        else:
            hi = (cap - 1) // kv.CTX_PAD
            if hi == 0 or not fits(kv.CTX_PAD):
                best = 0
            else:
                lo = 1
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if fits(mid * kv.CTX_PAD):
                        lo = mid
                    else:
                        hi = mid - 1
                best = lo * kv.CTX_PAD
        self._max[usable] = best
        return best


Sized = Sizing | SizingProblem
# Per recipe path: what each of a model's recipes sizes to. The host plan takes it explicitly:
# None there means the caller does not judge memory at all (status, prepare).
Sizings = Mapping[str, Sized]


def identity_problem(recipe: Recipe, header: GGUFHeader) -> str | None:
    """Why this header cannot be the recipe's file, or None."""
    m = recipe.model
    what = f"{m.hf_repo}@{m.revision[:12]} {m.file}"
    if header.file_size is not None and header.file_size != m.size_bytes:
        return (
            f"{what}: the server says the file is {header.file_size} bytes, the recipe says "
            f"size_bytes = {m.size_bytes}"
        )
    arch = header.metadata.get(Keys.General.ARCHITECTURE)
    if not isinstance(arch, str) or not arch:
        return f"{what}: the GGUF header has no {Keys.General.ARCHITECTURE}"
    for template in (Keys.LLM.CONTEXT_LENGTH, Keys.LLM.BLOCK_COUNT, Keys.LLM.EMBEDDING_LENGTH):
        key = template.format(arch=arch)
        value = header.metadata.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            return f"{what}: the GGUF header has no usable {key} (architecture {arch})"
    return None


def size_recipe(path: str, recipe: Recipe, got: HeaderResult | None) -> Sized:
    """A recipe's sizing, or why it cannot be sized."""
    m = recipe.model
    if got is None or got.header is None:
        why = got.error if got is not None and got.error else "not read"
        return SizingProblem(
            "pending", f"GGUF header of {m.hf_repo} {m.file} not readable yet: {why}"
        )
    problem = identity_problem(recipe, got.header)
    if problem is not None:
        return SizingProblem("mismatch", problem)
    try:
        return Sizing(recipe, got.header)
    except kv.GeometryError as exc:
        return SizingProblem("mismatch", f"{path}: {exc.message}")
    except TensorlessError as exc:  # KVSettingsError: llama-server would refuse these args
        return SizingProblem("invalid", f"{path}: {exc.message}")


def sizings(
    entries: Sequence[tuple[str, Recipe]], headers: Mapping[HeaderKey, HeaderResult]
) -> dict[str, Sized]:
    """Every recipe's sizing from the headers read for them (by recipe path)."""
    return {path: size_recipe(path, r, headers.get(header_key(r))) for path, r in entries}


def read_sizings(
    entries: Sequence[tuple[str, Recipe]],
    cache_dir: Path | None = None,
    endpoint: str | None = None,
) -> dict[str, Sized]:
    """Every recipe sized from its header, read over HTTP Range through the per-commit cache
    (default: header_cache_dir()); a header that cannot be read sizes to a pending problem,
    never an exception."""
    keys = [header_key(r) for _, r in entries]
    headers = read_headers(
        keys, cache_dir if cache_dir is not None else header_cache_dir(), endpoint
    )
    return sizings(entries, headers)
