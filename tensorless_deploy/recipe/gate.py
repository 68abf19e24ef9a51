"""The release gate's rules (recipe schema 1, "Draft, released and unpublished"): what a change
to a recipe needs, judged from its TOML tables at a base revision and now; whether a measured run
may promote a recipe; and the new [receipt] written into a recipe file with its comments and
layout kept (tomlkit).

Pure: TOML text in, violations or TOML text out. Reading the versions from git is
``recipe.history``; measuring is ``gate run`` (fleet.gate).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 controllers
    import tomli as tomllib

# What a measurement depends on: these tables, and the model file's pin (its name, title and
# license are free). [card] is pinned by the file's path (card.id = the file name).
GATED_TABLES = ("run", "engine")
PIN_KEYS = ("revision", "file", "sha256", "size_bytes")
# What makes a receipt a new measurement; its summary and notes are prose and change freely.
MEASUREMENT_KEYS = ("source", "decode_tps", "prefill_tps")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Violation:
    """One rule a recipe change breaks: the file (as git names it), the table at fault, what
    is missing and how to fix it."""

    file: str
    table: str
    problem: str

    def line(self) -> str:
        return f"{self.file}: [{self.table}]: {self.problem}"


def tables(text: str | bytes) -> dict[str, Any]:
    """A recipe's TOML as plain values (tomllib), compared by value: comments, spacing, key
    order and the spelling of numbers never count. ValueError names what is wrong."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except RecursionError:
        raise ValueError("invalid TOML: arrays or inline tables nested too deep") from None
    except ValueError as exc:  # TOMLDecodeError, or an integer with too many digits
        raise ValueError(f"invalid TOML: {exc}") from None
    return data


def _table(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = data.get(name)
    return value if isinstance(value, Mapping) else {}


def gated_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The measured tables that differ between two versions: "run", "engine", "model" (its
    pin: revision, file, sha256, size_bytes)."""
    out = [name for name in GATED_TABLES if old.get(name) != new.get(name)]
    old_model, new_model = _table(old, "model"), _table(new, "model")
    if any(old_model.get(k) != new_model.get(k) for k in PIN_KEYS):
        out.append("model")
    return out


def measurement(data: Mapping[str, Any]) -> dict[str, Any]:
    receipt = _table(data, "receipt")
    return {k: receipt.get(k) for k in MEASUREMENT_KEYS}


def image_digest(image: object) -> str | None:
    """engine.image's digest (sha256:<64 hex>), or None when it names none."""
    if not isinstance(image, str):
        return None
    _, at, digest = image.rpartition("@")
    return digest if at and DIGEST.fullmatch(digest) else None


def release_problems(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What a released recipe's receipt must show: its decode speed, and a source naming the
    exact image digest it was measured on, the digest of engine.image. (table, problem) pairs."""
    receipt = _table(data, "receipt")
    out: list[tuple[str, str]] = []
    decode = receipt.get("decode_tps")
    short = decode.get("short") if isinstance(decode, Mapping) else None
    if not isinstance(short, (int, float)) or isinstance(short, bool):
        out.append(
            (
                "receipt",
                "decode_tps.short is missing: a released recipe needs its measured decode "
                "speed (tensorless-deploy gate run writes it)",
            )
        )
    want = image_digest(_table(data, "engine").get("image"))
    source = receipt.get("source")
    named = sorted(set(DIGEST.findall(source))) if isinstance(source, str) else []
    shown = want or "the image digest"
    if not isinstance(source, str) or not source.strip():
        out.append(
            (
                "receipt",
                f"source is missing: a released recipe's receipt must name the image it was "
                f"measured on ({shown}, engine.image's digest)",
            )
        )
    elif not named:
        out.append(
            (
                "receipt",
                f"source names no image digest: it must name {shown} (engine.image's), the "
                "image the numbers were measured on",
            )
        )
    elif want is None or named != [want]:
        others = ", ".join(d for d in named if d != want) or ", ".join(named)
        out.append(
            (
                "receipt",
                f"source names {others}, not engine.image's {want or '(none)'}: the receipt "
                "was measured on another image; measure this one (gate run)",
            )
        )
    return out


def judge(
    file: str, old_text: str | bytes | None, new_text: str | bytes | None, base: str
) -> tuple[str, list[Violation]]:
    """One recipe file between ``base`` and now: (what happened to it, its violations). What
    happened: "new", "changed", "unchanged" or "deleted". A deleted recipe needs nothing (it
    leaves the catalog); a renamed one is a new recipe at its new path (the path is its model
    and card)."""
    if new_text is None:
        return "deleted", []
    try:
        new = tables(new_text)
    except ValueError as exc:
        return "changed", [Violation(file, "file", f"{exc}; run: tensorless-deploy check")]
    old: dict[str, Any] | None = None
    if old_text is not None:
        try:
            old = tables(old_text)
        except ValueError:
            old = None  # unreadable at the base: judged as a new recipe
    kind = "new" if old is None else ("unchanged" if old == new else "changed")
    status = new.get("status")
    if status == "draft" or kind == "unchanged":
        return kind, []
    out: list[Violation] = []
    changed = gated_changes(old, new) if old is not None else []
    if changed and measurement(old or {}) == measurement(new):
        names = " and ".join(f"[{t}]" for t in changed)
        out.append(
            Violation(
                file,
                "receipt",
                f"{names} changed since {base}, but the receipt's measurement (source, "
                "decode_tps, prefill_tps) did not: measure it (tensorless-deploy gate run) "
                'or set status = "draft"',
            )
        )
    promoted = old is None or old.get("status") != "released"
    # a released recipe's new measurement must show what it was measured on, as a release does
    if status == "released" and (promoted or (changed and not out)):
        out += [Violation(file, table, problem) for table, problem in release_problems(new)]
    return kind, out


# ------------------------------------------------------------------------- promotion


@dataclass(frozen=True)
class Measured:
    """One figure of a run against the old receipt's (bench.compare's verdict)."""

    key: str  # decode_tps.short, prefill_tps.ctx_4k, ...
    measured: float
    receipt: float
    meets: bool


@dataclass(frozen=True)
class RunFacts:
    """What a gate run observed, for the promotion rule."""

    tuned: bool
    untuned_reasons: tuple[str, ...]
    card: str  # the recipe's card id
    card_seen: str | None  # the card id the instance's GPU matched (None: none)
    image: str  # engine.image
    image_seen: str | None  # the image the container ran, by digest, as the host reported it
    comparisons: tuple[Measured, ...]
    tolerance: float


def promotion_refusals(run: RunFacts) -> list[str]:
    """Why the run may not move the recipe to released, one line per failed condition (empty:
    it may). The conditions: tuned, on the recipe's card, with the recipe's exact image, and
    every figure of the old receipt met within the tolerance (no old figure: nothing to miss)."""
    out = []
    if not run.tuned:
        out.append("the run was untuned (" + "; ".join(run.untuned_reasons) + ")")
    if run.card_seen != run.card:
        seen = run.card_seen or "no card of the recipe"
        out.append(f"the run was not on the recipe's card {run.card} ({seen})")
    want = image_digest(run.image)
    if run.image_seen is None or run.image_seen != want:
        out.append(
            f"the container ran {run.image_seen or 'an image the host did not name'}, not the "
            f"recipe's {want}"
        )
    for c in run.comparisons:
        if not c.meets:
            out.append(
                f"{c.key} {c.measured:.2f} is {c.measured / c.receipt:.2f}x the old receipt's "
                f"{c.receipt:g}, below it by more than the tolerance ({run.tolerance:.0%})"
            )
    return out


# ------------------------------------------------------------------------- the receipt


@dataclass(frozen=True)
class Receipt:
    """A new [receipt]: every key of the table, so no figure of an older build is left beside
    the new ones."""

    source: str
    summary: str
    decode_tps: Mapping[str, float]
    prefill_tps: Mapping[str, float]
    notes: Sequence[str] = field(default_factory=tuple)


def _figures(values: Mapping[str, float]) -> str:
    """An inline table as the recipes write it: { short = 30.06 }."""
    for key, v in values.items():
        if not re.fullmatch(r"[a-z0-9_]+", key) or not math.isfinite(v) or v < 0:
            raise ValueError(f"receipt figure {key!r} = {v!r}: not a measurement")
    return "{ " + ", ".join(f"{k} = {v:.2f}" for k, v in values.items()) + " }"


def write_receipt(text: str, receipt: Receipt, *, promote: bool = False) -> str:
    """The recipe's TOML with its [receipt] replaced by ``receipt`` (and, with promote,
    status = "released"): every other line, comment and alignment kept; the receipt's own keys
    keep their place and trailing comments. A recipe without [receipt] gets one at the end."""
    import tomlkit

    doc = tomlkit.parse(text)
    if promote:
        doc["status"] = "released"
    table = doc.get("receipt")
    if not isinstance(table, tomlkit.items.Table):
        if table is not None:  # an inline receipt = { ... }: replaced by a table of its own
            del doc["receipt"]
        table = tomlkit.table()
        doc.append("receipt", table)
    notes = tomlkit.array()
    notes.extend(receipt.notes)
    notes.multiline(len(receipt.notes) > 1)
    values: dict[str, Any] = {
        "source": receipt.source,
        "summary": receipt.summary,
        "decode_tps": tomlkit.value(_figures(receipt.decode_tps)),
        "prefill_tps": tomlkit.value(_figures(receipt.prefill_tps)),
        "notes": notes,
    }
    for key, value in values.items():
        table[key] = value
    out = tomlkit.dumps(doc)
    if tables(out).get("receipt", {}).get("source") != receipt.source:  # pragma: no cover
        raise ValueError("the written receipt does not read back")
    return out
