"""The one memory verdict (pure): whether a card holds a recipe's model and its KV cache at the
context asked for, with the numbers; the host plan applies it to every matching card, and plan,
doctor, deploy and run read it from there.

Memory needed is kv.estimate_memory at the context (weights = the GGUF's size, the KV cache as
llama-server allocates it for the recipe's -ctk/-ctv/-fa/-np/-ub, a compute-buffer estimate, a
fixed runtime overhead); what may be filled is kv.usable_bytes of the card's free memory, where
memory that the tool's own running instances of the same model hold on that card counts as free
(re-planning a model replaces them). MARGIN says it in words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tensorless_deploy.decisions.checks import Check, describe_gpu
from tensorless_deploy.facts.values import Gpu, GpuApp
from tensorless_deploy.gguf import kv
from tensorless_deploy.gguf.sizing import Sized, SizingProblem

MiB = kv.MiB
MEMORY_CHECK = "memory.fit"

MARGIN = (
    "need = GGUF file size (no fudge factor) + the KV cache exactly as llama-server allocates it "
    f"+ compute buffer (n_ubatch x widest activation x 4 B x {kv.COMPUTE_SLACK} + "
    f"{kv.COMPUTE_BASE_BYTES // MiB} MiB) + {kv.RUNTIME_OVERHEAD_BYTES // MiB} MiB runtime "
    "(CUDA context, cuBLAS, pools); it must fit in usable = free - headroom, where free = "
    "memory.total - memory.used (nvidia-smi) + what this model's own running instances hold on "
    "the card (nvidia-smi --query-compute-apps, by container), and headroom = max("
    f"{kv.CARD_HEADROOM_MIN_BYTES // MiB} MiB, {kv.CARD_HEADROOM_FRACTION:.0%} of total)"
)


@dataclass(frozen=True)
class CardMemory:
    """One GPU's memory as the planner counts it, in bytes."""

    total: int
    used: int
    used_known: bool
    headroom: int
    usable: int
    own: int = 0  # held by this model's own running instances: counted as free

    @property
    def free(self) -> int:
        return max(0, min(self.total, self.total - self.used + self.own))


def card_memory(gpu: Gpu, own_bytes: int = 0) -> CardMemory | None:
    if gpu.memory_total_mib is None:
        return None
    total = gpu.memory_total_mib * MiB
    used = (gpu.memory_used_mib or 0) * MiB
    own = max(0, min(own_bytes, used))
    free = max(0, total - used + own)
    return CardMemory(
        total=total,
        used=used,
        used_known=gpu.memory_used_mib is not None,
        headroom=max(kv.CARD_HEADROOM_MIN_BYTES, int(total * kv.CARD_HEADROOM_FRACTION)),
        usable=kv.usable_bytes(free, total),
        own=own,
    )


def own_bytes(gpu: Gpu, apps: Sequence[GpuApp] | None, containers: Sequence[str]) -> int:
    """What the named containers' processes hold on this card, as nvidia-smi lists them."""
    if not apps or gpu.uuid is None:
        return 0
    names = set(containers)
    return sum(a.used_mib * MiB for a in apps if a.gpu_uuid == gpu.uuid and a.container in names)


def fmt_bytes(n: int) -> str:
    return f"{n / kv.GiB:.2f} GiB" if n >= kv.GiB else f"{n / MiB:.1f} MiB"


@dataclass(frozen=True)
class CardFit:
    """The memory verdict for one card: the need at the context against what is usable.
    fits None: not judged (the recipe could not be sized, or the card's memory is unknown)."""

    gpu: Gpu
    context: int
    memory: CardMemory | None
    need: kv.MemoryEstimate | None = None
    max_context: int | None = None
    kv_bytes_per_token: int | None = None
    fits: bool | None = None
    why: str | None = None  # why it does not fit, or why it was not judged
    problem: SizingProblem | None = None

    @property
    def context_over_model(self) -> bool:
        return self.why is not None and "context_length" in self.why and self.fits is False


def fit_card(sized: Sized | None, gpu: Gpu, context: int, own: int = 0) -> CardFit:
    """Does this card hold the recipe at this context, with the numbers either way."""
    mem = card_memory(gpu, own)
    if sized is None:
        return CardFit(gpu, context, mem, why="memory not sized")
    if isinstance(sized, SizingProblem):
        return CardFit(gpu, context, mem, why=sized.why, problem=sized)
    if mem is None:
        return CardFit(gpu, context, mem, why=f"{describe_gpu(gpu)}: total memory unknown")
    max_ctx = sized.max_context(mem.usable)
    base = CardFit(
        gpu, context, mem, max_context=max_ctx, kv_bytes_per_token=sized.kv_bytes_per_token
    )
    cap = sized.context_length
    if context > cap:
        why = f"context {context} is more than the model's context_length {cap}"
        return _replace(base, fits=False, why=why)
    need = sized.need(context)
    if need.total_bytes <= mem.usable:
        return _replace(base, need=need, fits=True)
    if max_ctx == 0:
        why = (
            f"does not fit at any context: needs {fmt_bytes(sized.need(kv.CTX_PAD).total_bytes)}"
            f" at {kv.CTX_PAD} tokens, {fmt_bytes(mem.usable)} usable"
        )
    else:
        why = (
            f"context {context} needs {fmt_bytes(need.total_bytes)}, {fmt_bytes(mem.usable)} "
            f"usable; the largest context that fits is {max_ctx} (--context {max_ctx}, untuned)"
        )
    return _replace(base, need=need, fits=False, why=why)


def _replace(fit: CardFit, **changes: object) -> CardFit:
    import dataclasses

    return dataclasses.replace(fit, **changes)  # type: ignore[arg-type]


def _card(fit: CardFit) -> str:
    return f"GPU {fit.gpu.index} ({fit.gpu.name or '?'})"


def _used_by(fit: CardFit) -> str:
    mem = fit.memory
    if mem is None or mem.used - mem.own <= 0:
        return ""
    return f" ({fmt_bytes(mem.used - mem.own)} held by other processes)"


def memory_check(fits: Sequence[CardFit]) -> Check | None:
    """The memory.fit row for a host: every matching card's need against its usable memory.
    fail: no card holds it; warn: some do not (they get no instance) or it could not be sized
    (deploy goes on, the health gate is the proof); None: no card to judge."""
    if not fits:
        return None
    judged = [f for f in fits if f.fits is not None]
    if not judged:
        why = fits[0].why or "not sized"
        return Check(
            MEMORY_CHECK,
            "warn",
            f"not sized: {why}",
            "let this machine read the GGUF header once (the Hub or HF_ENDPOINT): plan, doctor "
            "and deploy then size from its cache",
        )
    lines = []
    for f in fits:
        if f.fits:
            assert f.need is not None and f.memory is not None
            lines.append(
                f"{_card(f)}: context {f.context} needs {fmt_bytes(f.need.total_bytes)} of "
                f"{fmt_bytes(f.memory.usable)} usable"
            )
        else:
            lines.append(f"{_card(f)}: {f.why}{_used_by(f)}")
    evidence = "; ".join(lines)
    good = [f for f in judged if f.fits]
    if len(good) == len(fits):
        return Check(MEMORY_CHECK, "ok", evidence)
    fix = _memory_fix(fits)
    if good:
        return Check(MEMORY_CHECK, "warn", evidence + " (no instance there)", fix)
    return Check(MEMORY_CHECK, "fail", evidence, fix)


def _memory_fix(fits: Sequence[CardFit]) -> str:
    """What makes the cards that do not hold it hold it."""
    fits = [f for f in fits if f.fits is False]
    best = max((f.max_context or 0 for f in fits if not f.context_over_model), default=0)
    parts = []
    if best > 0:
        parts.append(f"--context {best} (untuned)")
    if any(f.context_over_model for f in fits):
        parts.append("a context within the model's context_length (--context N)")
    if any(f.memory is not None and f.memory.used > f.memory.own for f in fits):
        parts.append("free the card (nvidia-smi lists what holds it)")
    parts.append("or a card with more memory")
    return ", ".join(parts)


def app_containers(apps: Sequence[GpuApp] | None) -> tuple[str, ...]:
    return tuple(sorted({a.container for a in apps or () if a.container}))
