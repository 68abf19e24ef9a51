"""Placement preview (pure): recipes, host facts and GGUF headers in; per host and GPU, whether a
model can be placed there, the largest context that fits, and why not.

The ideas and names come from PlacementPreview (docs/design.md#placement-preview):
(max_context_tokens,
default_context_tokens, kv_bytes_per_token, memory_delta_by_node, error, error_code,
alternative, card_digest), brought to an SSH inventory of single-card llama-server hosts:

- Each host's recipe is the one its host plan chose (hostplan.plan_host, the same plan doctor
  and deploy use); it places on ONE GPU whose card it matches, so a host with several matching
  GPUs gets one row per GPU. A host whose plan fails a check that has nothing to do with memory
  (no container toolkit, a taken port...) is refused with that check, as deploy would refuse it.
- Memory is the host plan's own verdict per card (decisions.memory: the need at the context
  against the usable memory, the same numbers doctor and deploy act on); MARGIN says it in
  words.
- Refusals carry a stable code: ``no_valid_placement`` (no card match, a draft or unpublished
  recipe, does not fit), ``placement_info_pending`` (host facts or the GGUF header not readable
  yet), ``model_card_identity_mismatch`` (the header contradicts the recipe).
- The best placement of a model is the passing host/GPU with the largest max context, ties by
  most free memory, then host name and GPU index; the other passing ones are ``alternative``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tensorless_deploy.decisions.cards import Ceiling, ceiling_for
from tensorless_deploy.decisions.checks import (
    describe_gpu,
    driver_at_least,
    gpu_fits_card,
    state_refusal,
)
from tensorless_deploy.decisions.memory import (
    MARGIN,
    MEMORY_CHECK,
    CardFit,
    CardMemory,
    fit_card,
    fmt_bytes,
)
from tensorless_deploy.decisions.options import Options
from tensorless_deploy.facts.values import Gpu, HostFacts
from tensorless_deploy.gguf import kv
from tensorless_deploy.gguf.constants import Keys
from tensorless_deploy.gguf.header import HeaderKey, HeaderResult
from tensorless_deploy.gguf.sizing import ProblemKind, header_key, sizings
from tensorless_deploy.hostplan.plan import (
    CARD_CHECKS,
    HostPlan,
    Instance,
    SurveyedHost,
    plan_host,
)
from tensorless_deploy.recipe.catalog import Entry, recipe_digest

ErrorCode = Literal["no_valid_placement", "placement_info_pending", "model_card_identity_mismatch"]
NO_VALID_PLACEMENT: ErrorCode = "no_valid_placement"
INFO_PENDING: ErrorCode = "placement_info_pending"
IDENTITY_MISMATCH: ErrorCode = "model_card_identity_mismatch"
MiB = kv.MiB
__all__ = ["MARGIN", "CardMemory", "HeaderKey", "HeaderResult", "header_key"]
# a sizing problem's kind -> the specification's code
PROBLEM_CODES: dict[ProblemKind, ErrorCode] = {
    "pending": INFO_PENDING,
    "mismatch": IDENTITY_MISMATCH,
    "invalid": NO_VALID_PLACEMENT,
}


def _split_mode_none(args: Sequence[str]) -> bool:
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in ("-sm", "--split-mode"):
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            if value == "none":
                return True
    return False


@dataclass(frozen=True)
class PlanOptions:
    context: int | None = None  # --context N: does N fit (untuned when it differs)
    allow_draft: bool = False


@dataclass(frozen=True)
class Placement:
    """One row of the preview: a model on one host (and GPU, when one matched its card)."""

    model: str
    host: str
    recipe_path: str | None = None
    card: str | None = None
    gpu: Gpu | None = None
    card_digest: str | None = None
    error_code: ErrorCode | None = None
    error: str | None = None
    max_context_tokens: int | None = None
    default_context_tokens: int | None = None  # the context asked for: recipe's or --context
    recipe_context: int | None = None  # the recipe's own run.context (what was measured)
    unit: str | None = None  # the instance the host plan serves on this card, if any
    address: str | None = None  # where that instance answers
    context_fits: bool | None = None
    tuned: bool = True
    kv_bytes_per_token: int | None = None
    memory: kv.MemoryEstimate | None = None  # need at default_context_tokens
    card_memory: CardMemory | None = None
    notes: tuple[str, ...] = ()
    # the row this one is a renamed copy of (_host_rows: a host whose facts and options equal an
    # earlier host's): the same row under another name, which plan_json(encode=...) encodes once
    origin: Placement | None = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.error_code is None

    @property
    def need_bytes(self) -> int | None:
        return None if self.memory is None else self.memory.total_bytes


@dataclass(frozen=True)
class ModelPlan:
    """Every row of one model; ``best`` is the ranked pick, the other passing rows are
    alternatives (PlacementPreview: a host that passes admission but lost the ranking)."""

    model: str
    placements: tuple[Placement, ...]
    best: Placement | None = None
    headers: Mapping[HeaderKey, HeaderResult] = field(default_factory=dict)
    # (card id, compute capability, its ceiling) for each card of the model that has one
    ceilings: tuple[tuple[str, str, Ceiling], ...] = ()

    def alternative(self, p: Placement) -> bool:
        return p.ok and p is not self.best

    @property
    def placed(self) -> bool:
        return self.best is not None


def _gpu_text(gpu: Gpu) -> str:
    return describe_gpu(gpu)


class _Recipes:
    """Per-recipe values every row reuses: digest, sizing, card-match and driver verdicts."""

    def __init__(
        self,
        entries: Sequence[Entry],
        headers: Mapping[HeaderKey, HeaderResult],
        options: PlanOptions,
    ) -> None:
        self.entries = entries
        self.options = options
        self.sizing = sizings([(e.path, e.recipe) for e in entries], headers)
        self.digest = {e.path: recipe_digest(e.recipe) for e in entries}
        self.refusal = {
            e.path: state_refusal(e.recipe, "run", options.allow_draft) for e in entries
        }
        self.split_none = {e.path: _split_mode_none(e.recipe.run.args) for e in entries}
        self._driver: dict[tuple[str | None, str], bool] = {}
        # hosts with equal facts and options get equal rows but for their name: planned once
        self.rows: dict[tuple[HostFacts, Options], list[Placement]] = {}
        # the same rows found by the identity of the facts and options objects (an offline
        # inventory shares one of each among equal hosts): no hash of the facts per host
        self.same: dict[tuple[int, int], tuple[HostFacts, Options, list[Placement]]] = {}

    def driver_ok(self, have: str | None, need: str) -> bool:
        key = (have, need)
        ok = self._driver.get(key)
        if ok is None:
            ok = self._driver[key] = driver_at_least(have, need)
        return ok


# Checks the rows judge themselves (with the specification's codes and their own words)
ROW_CHECKS = (*CARD_CHECKS, "recipe.state", MEMORY_CHECK)


def _deploy_refusal(plan: HostPlan) -> str | None:
    """The host plan's failed checks that are not about the card: what deploy would stop at."""
    other = [c for c in plan.failed() if c.id not in ROW_CHECKS]
    if plan.problem:
        return plan.problem
    return "; ".join(f"{c.id}: {c.evidence}" for c in other) or None


def _host_rows(model: str, host: SurveyedHost, rc: _Recipes) -> list[Placement]:
    """This host's rows; a host whose facts and options equal an earlier host's (a fleet of
    identical machines, offline inventory data) reuses that host's rows under its own name.
    Nothing in a row but its host depends on the name (the host plan's checks, cards, units and
    addresses come from facts and options alone)."""
    facts, options = host.facts, host.options
    if facts is None:
        return _rows_of(model, host, rc)
    same = rc.same.get((id(facts), id(options)))
    if same is not None and same[0] is facts and same[1] is options:
        return [_renamed(r, host.name) for r in same[2]]
    try:
        done = rc.rows.get((facts, options))
    except TypeError:  # facts with unhashable parts (a surveyed host's unit labels)
        return _rows_of(model, host, rc)
    first = done is None
    if done is None:
        done = rc.rows[(facts, options)] = _rows_of(model, host, rc)
    rc.same[(id(facts), id(options))] = (facts, options, done)
    return done if first else [_renamed(r, host.name) for r in done]


def _renamed(row: Placement, host: str) -> Placement:
    """The row under another host's name: dataclasses.replace without re-running __init__ over
    every field, nor copy.copy's generic path (together a third of planning at 10,000 hosts,
    bench/plan_scale.py)."""
    new = object.__new__(Placement)
    fields = new.__dict__
    fields.update(row.__dict__)
    fields["host"] = host
    fields["origin"] = row.origin or row
    return new


def _rows_of(model: str, host: SurveyedHost, rc: _Recipes) -> list[Placement]:
    if host.facts is None:
        why = host.error or "no facts"
        return [
            Placement(
                model=model,
                host=host.name,
                error_code=INFO_PENDING,
                error=f"host facts not readable: {why}",
            )
        ]
    report = host.facts.gpus
    if report.state != "ok":
        detail = report.message or f"nvidia-smi state {report.state}"
        return [
            Placement(
                model=model,
                host=host.name,
                error_code=NO_VALID_PLACEMENT,
                error=f"no usable GPU ({report.state}): {detail}",
            )
        ]
    rows: list[Placement] = []
    options = host.options
    if rc.options.context is not None and options.context != rc.options.context:
        options = dataclasses.replace(options, context=rc.options.context)  # the one asked
    hp = plan_host(host.name, host.facts, rc.entries, options, sizing=rc.sizing, units=False)
    if hp.entry is not None:
        entry = hp.entry
        refusal = _deploy_refusal(hp)
        fits = sorted(
            (g for g in report.gpus if gpu_fits_card(g, entry.recipe)), key=lambda g: g.index
        )
        serving = {i.gpus[0].index: i for i in hp.instances}
        for gpu in fits:
            inst = serving.get(gpu.index)
            row_refusal = refusal
            fit = hp.fit(gpu.index)
            held = fit is None or fit.fits is not False  # a card too small says so itself
            if row_refusal is None and hp.instances and inst is None and held:
                row_refusal = (
                    "not one of this host's instances (tensorless_instances / --instances "
                    "choose the cards)"
                )
            rows.append(
                _gpu_row(model, host.name, entry, gpu, len(fits), rc, fit, row_refusal, inst)
            )
    if not rows:
        cards = "; ".join(
            f"{e.recipe.card.id} (compute {e.recipe.card.compute_capability}, >= "
            f"{e.recipe.card.min_memory_mib} MiB)"
            for e in rc.entries
        )
        have = "; ".join(_gpu_text(g) for g in report.gpus) or "no GPUs"
        rows.append(
            Placement(
                model=model,
                host=host.name,
                error_code=NO_VALID_PLACEMENT,
                error=f"no GPU matches a card of {model}: {cards}; this host has {have}",
            )
        )
    return rows


def _gpu_row(
    model: str,
    host: str,
    entry: Entry,
    gpu: Gpu,
    n_matching: int,
    rc: _Recipes,
    fit: CardFit | None,
    deploy_refusal: str | None = None,
    instance: Instance | None = None,
) -> Placement:
    """One GPU's row, from the host plan's memory verdict for that card (the same numbers
    doctor and deploy act on)."""
    recipe = entry.recipe
    options = rc.options
    context = options.context if options.context is not None else recipe.run.context
    tuned = options.context is None or options.context == recipe.run.context
    notes: list[str] = []
    if not tuned:
        notes.append(f"untuned: context {context} instead of the measured {recipe.run.context}")
    if n_matching > 1 and not rc.split_none[entry.path]:
        notes.append(
            f"{n_matching} GPUs match; without -sm none llama.cpp would split layers across "
            "all it sees: planned per card (one card is enough)"
        )
    if fit is None:  # the plan did not judge this card (it cannot: every matching card is)
        fit = fit_card(rc.sizing.get(entry.path), gpu, context)
    mem = fit.memory
    row: dict[str, Any] = dict(
        model=model,
        host=host,
        recipe_path=entry.path,
        card=recipe.card.id,
        gpu=gpu,
        card_digest=rc.digest[entry.path],
        default_context_tokens=context,
        recipe_context=recipe.run.context,
        tuned=tuned,
        card_memory=mem,
        unit=instance.name if instance is not None else None,
        address=instance.spec.address if instance is not None else None,
    )

    def refuse(code: ErrorCode, why: str | None) -> Placement:
        return Placement(**row, error_code=code, error=why, notes=tuple(notes))

    refusal = rc.refusal[entry.path]
    if refusal is not None:
        return refuse(NO_VALID_PLACEMENT, refusal)

    if not rc.driver_ok(gpu.driver_version, recipe.card.min_driver):
        return refuse(
            NO_VALID_PLACEMENT,
            f"driver {gpu.driver_version or '?'} is older than "
            f"{recipe.card.min_driver}, the oldest this recipe runs on",
        )
    if fit.problem is not None:  # header missing, mismatched, or not sizable
        return refuse(PROBLEM_CODES[fit.problem.kind], fit.problem.why)
    if mem is None:
        return refuse(INFO_PENDING, fit.why)
    if not mem.used_known:
        notes.append("memory used unknown (inventory data): assumed 0")
    if mem.own:
        notes.append(
            f"{fmt_bytes(mem.own)} held by this model's own running instances counted as free"
        )
    row.update(kv_bytes_per_token=fit.kv_bytes_per_token, max_context_tokens=fit.max_context)
    if fit.context_over_model:
        row["context_fits"] = False
        return refuse(NO_VALID_PLACEMENT, fit.why)
    row.update(memory=fit.need, context_fits=fit.fits)
    if deploy_refusal is not None:
        return refuse(NO_VALID_PLACEMENT, f"deploy would refuse this host: {deploy_refusal}")
    if fit.fits:
        return Placement(**row, notes=tuple(notes))
    return refuse(NO_VALID_PLACEMENT, fit.why)


def _rank_memory(p: Placement) -> tuple[int, int]:
    """A row's rank by memory: the largest max context first, then the most free memory."""
    free = p.card_memory.free if p.card_memory else 0
    return (-(p.max_context_tokens or 0), -free)


def _best(rows: Sequence[Placement]) -> Placement | None:
    """The passing row ranked first: by memory (_rank_memory), ties by host name, then GPU
    index; the memory terms computed once per distinct row (a renamed row ranks as its origin
    but for its host: Placement.origin)."""
    best: Placement | None = None
    best_key: tuple[int, int, str, int] | None = None
    terms: dict[int, tuple[int, int]] = {}
    for r in rows:
        if r.error_code is not None:
            continue
        origin = r.origin or r
        head = terms.get(id(origin))
        if head is None:
            head = terms[id(origin)] = _rank_memory(origin)
        key = (*head, r.host, r.gpu.index if r.gpu else -1)
        if best_key is None or key < best_key:
            best, best_key = r, key
    return best


def plan_model(
    model: str,
    entries: Sequence[Entry],
    hosts: Sequence[SurveyedHost],
    headers: Mapping[HeaderKey, HeaderResult],
    options: PlanOptions = PlanOptions(),
) -> ModelPlan:
    """The preview of one model (all its cards' recipes) over every host."""
    rc = _Recipes(entries, headers, options)
    rows = [r for h in hosts for r in _host_rows(model, h, rc)]
    best = _best(rows)
    used = {header_key(e.recipe) for e in entries}
    ceilings: list[tuple[str, str, Ceiling]] = []
    for e in entries:
        card = e.recipe.card
        c = ceiling_for(card.compute_capability)
        if c is not None and card.id not in [cid for cid, _, _ in ceilings]:
            ceilings.append((card.id, card.compute_capability, c))
    return ModelPlan(
        model,
        tuple(rows),
        best,
        {k: v for k, v in headers.items() if k in used},
        tuple(ceilings),
    )


def plan(
    models: Sequence[tuple[str, Sequence[Entry]]],
    hosts: Sequence[SurveyedHost],
    headers: Mapping[HeaderKey, HeaderResult],
    options: PlanOptions = PlanOptions(),
) -> list[ModelPlan]:
    return [plan_model(name, entries, hosts, headers, options) for name, entries in models]


# --- JSON ---------------------------------------------------------------------------------------


def _gpu_json(gpu: Gpu | None) -> dict[str, Any] | None:
    if gpu is None:
        return None
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "compute_cap": gpu.compute_cap,
        "memory_total_mib": gpu.memory_total_mib,
        "memory_used_mib": gpu.memory_used_mib,
    }


# Seed 002's PlacementPreview, brought to one llama-server on one card of an SSH host (see
# docs/plan.md and docs/placement.schema.json). llama-server allocates the whole window's KV
# cache when the model loads.
RESERVES_CONTEXT_AT_LOAD = True
# The recipe is this tool's card: it names the engine, the model file and the settings, and the
# launcher runs only what a recipe describes. No signed engine-support claims exist here.
COMPATIBILITY_SOURCE = "card"
DIGEST_PREFIX = "sha256:"


def card_digest_hex(recipe_digest_value: str | None) -> str | None:
    """recipe_digest's ``sha256:<hex>`` (the io.tensorless.recipe-digest label) as
    PlacementPreview's card_digest: the bare 64 hex digits."""
    if recipe_digest_value is None:
        return None
    hexpart = recipe_digest_value.removeprefix(DIGEST_PREFIX)
    if len(hexpart) != 64 or hexpart.strip("0123456789abcdef"):
        raise ValueError(f"not a sha256 digest: {recipe_digest_value!r}")
    return hexpart


def _compatibility_detail(p: Placement) -> str | None:
    """The gap on a refused row, naming both sides: the model or recipe (card) and the host (and
    GPU) it was judged on. None on a placement."""
    if p.ok:
        return None
    what = p.model if p.recipe_path is None else f"{p.recipe_path} (card {p.card})"
    where = p.host if p.gpu is None else f"{p.host} {_gpu_text(p.gpu)}"
    return f"{what} on {where}: {p.error or p.error_code}"


def _memory_json(p: Placement) -> dict[str, Any] | None:
    if p.card_memory is None and p.memory is None:
        return None
    cm, need = p.card_memory, p.memory
    return {
        "need_bytes": need.total_bytes if need else None,
        "weights_bytes": need.weights_bytes if need else None,
        "kv_bytes": need.kv_bytes if need else None,
        "compute_bytes": need.compute_bytes if need else None,
        "overhead_bytes": need.overhead_bytes if need else None,
        "n_ctx_cells": need.n_ctx if need else None,
        "total_bytes": cm.total if cm else None,
        "used_bytes": cm.used if cm and cm.used_known else None,
        "free_bytes": cm.free if cm else None,
        "headroom_bytes": cm.headroom if cm else None,
        "usable_bytes": cm.usable if cm else None,
        "own_bytes": cm.own if cm else None,
    }


def placement_json(p: Placement, alternative: bool = False) -> dict[str, Any]:
    """One row: every field of PlacementPreview (docs/design.md#placement-preview) with its
    value rules, then the tool's own fields. An instance is present only on a placement (ok):
    card_digest, max_context_tokens, memory_delta_by_node and compatibility_source are null on
    a refusal, where the tool's own largest_context_tokens and recipe_digest still say what was
    computed."""
    ok = p.ok
    need = p.need_bytes
    # default_context_tokens is the window without a request: the recipe's context (the row's
    # own context_tokens is the one asked for, --context N or the recipe's).
    default_ctx = p.recipe_context
    return {
        # PlacementPreview (docs/design.md#placement-preview)
        "card_digest": card_digest_hex(p.card_digest) if ok else None,
        "model_id": p.model,
        "sharding": None,
        "instance_meta": None,
        "instance": None,
        "memory_delta_by_node": {p.host: need} if ok and need is not None else None,
        "max_context_tokens": p.max_context_tokens if ok else None,
        "default_context_tokens": default_ctx,
        "reserves_context_at_load": RESERVES_CONTEXT_AT_LOAD,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "error": p.error,
        "error_code": p.error_code,
        "trust_requirement": None,
        "compatibility_source": COMPATIBILITY_SOURCE if ok else None,
        "support_claim_ids": [],
        "compatibility_detail": _compatibility_detail(p),
        "alternative": alternative,
        # the tool's own
        "host": p.host,
        "gpu": _gpu_json(p.gpu),
        "recipe": p.recipe_path,
        "card": p.card,
        "recipe_digest": p.card_digest,
        "ok": ok,
        "context_tokens": p.default_context_tokens,
        "largest_context_tokens": p.max_context_tokens,
        "context_fits": p.context_fits,
        "tuned": p.tuned,
        "unit": p.unit,
        "address": p.address,
        "memory": _memory_json(p),
        "notes": list(p.notes),
    }


def _header_json(key: HeaderKey, r: HeaderResult) -> dict[str, Any]:
    h = r.header
    return {
        "repo": key[0],
        "revision": key[1],
        "file": key[2],
        "cached": r.cached,
        "error": r.error,
        "bytes_fetched": h.bytes_fetched if h else None,
        "metadata_bytes": h.metadata_bytes if h else None,
        "file_size": h.file_size if h else None,
        "header_sha256": h.sha256 if h else None,
        "architecture": h.metadata.get(Keys.General.ARCHITECTURE) if h else None,
    }


def _placements_json(mp: ModelPlan) -> Iterator[dict[str, Any]]:
    return (placement_json(p, mp.alternative(p)) for p in mp.placements)


# Stands for the host's name while a renamed row's JSON text is made once. JSON escapes each
# character on its own, so the escaped name can replace the escaped stand-in wherever the row
# writes the name, inside other strings too (compatibility_detail). The NULs are checked: a
# text with one outside a stand-in (a row whose own strings hold a NUL, or that wrote only part
# of the name) is encoded row by row instead. Random per process: no input can spell it.
_NAME = f"\x00{os.urandom(8).hex()}\x00"


def placements_text(mp: ModelPlan, compact: Callable[[Any], str]) -> Iterator[str]:
    """Each row's JSON text, as compact(placement_json(row, ...)) gives it; the rows that are one
    row under several names (Placement.origin) are encoded once, with each row's own name put
    in, so a fleet of identical machines encodes each distinct row once (bench/plan_scale.py)."""
    made: dict[tuple[int, bool], tuple[str, str] | None] = {}
    names: dict[str, str] = {}  # each host's name as compact escapes it (no quotes)
    best = mp.best
    for p in mp.placements:
        alternative = p.error_code is None and p is not best  # mp.alternative(p)
        origin = p.origin or p
        key = (id(origin), alternative)
        if key in made:
            template = made[key]
        else:
            template = made[key] = _template(origin, alternative, compact)
        if template is None:
            yield compact(placement_json(p, alternative))
        else:
            text, name = template
            escaped = names.get(p.host)
            if escaped is None:
                escaped = names[p.host] = compact(p.host)[1:-1]
            # the same kind of text compact makes (cli.output.Encoded: written as it is)
            yield type(text)(text.replace(name, escaped))


def _template(
    base: Placement, alternative: bool, compact: Callable[[Any], str]
) -> tuple[str, str] | None:
    """base's JSON text with _NAME as its host, and _NAME as JSON escapes it (no quotes); None
    when the text holds a NUL outside those stand-ins."""
    text = compact(placement_json(_renamed(base, _NAME), alternative))
    name, nul = _escaped(compact)
    return (text, name) if text.count(nul) == 2 * text.count(name) else None


@functools.lru_cache(maxsize=4)
def _escaped(compact: Callable[[Any], str]) -> tuple[str, str]:
    """_NAME and a NUL as compact escapes them (no quotes)."""
    return compact(_NAME)[1:-1], compact("\x00")[1:-1]


def _lazy_rows(mp: ModelPlan, encode: Callable[[Any], str] | None) -> Iterator[Any]:
    return _placements_json(mp) if encode is None else placements_text(mp, encode)


# 2: placements follow PlacementPreview's value rules (docs/plan.md)
PLAN_JSON_SCHEMA = 2


def plan_json(
    plans: Sequence[ModelPlan],
    options: PlanOptions,
    offline: bool,
    *,
    lazy: bool = False,
    encode: Callable[[Any], str] | None = None,
) -> dict[str, Any]:
    """The plan as JSON data; lazy: each model's placements an iterator of row dicts, made as
    they are written (cli.output.stream_json), for a fleet too large to hold them all; with
    encode (lazy only), an iterator of each row's text as encode writes it (placements_text)."""
    models = []
    for mp in plans:
        best = mp.best
        models.append(
            {
                "model": mp.model,
                "placed": mp.placed,
                "best": None
                if best is None
                else {
                    "host": best.host,
                    "gpu_index": best.gpu.index if best.gpu else None,
                    "recipe": best.recipe_path,
                    "max_context_tokens": best.max_context_tokens,
                },
                "headers": [_header_json(k, v) for k, v in sorted(mp.headers.items())],
                "ceilings": [
                    {
                        "card": card,
                        "compute_capability": cc,
                        "max_driver_branch": c.max_branch,
                        "proprietary_modules_only": c.proprietary_only,
                        "max_cuda_major": c.max_cuda_major,
                    }
                    for card, cc, c in mp.ceilings
                ],
                "placements": _lazy_rows(mp, encode) if lazy else list(_placements_json(mp)),
            }
        )
    return {
        "schema": PLAN_JSON_SCHEMA,
        "offline": offline,
        "context": options.context,
        "margin": {
            "text": MARGIN,
            "runtime_overhead_bytes": kv.RUNTIME_OVERHEAD_BYTES,
            "compute_slack": kv.COMPUTE_SLACK,
            "compute_base_bytes": kv.COMPUTE_BASE_BYTES,
            "card_headroom_fraction": kv.CARD_HEADROOM_FRACTION,
            "card_headroom_min_bytes": kv.CARD_HEADROOM_MIN_BYTES,
        },
        "ok": all(mp.placed for mp in plans),
        "models": models,
    }
