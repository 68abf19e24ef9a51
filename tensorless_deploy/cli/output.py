"""Printing for people and scripts: tables, JSON, colour only on a terminal without NO_COLOR, and
no byte a terminal would act on unless the tool put it there itself.

Receipts, GGUF strings, GPU names, host names and command output all reach the screen. Every
write to stdout and stderr during a command passes through ``safe`` (``main`` installs
``terminal_guard``): C0 controls but the newline, DEL, C1 controls (U+009B is a CSI on many
terminals) and the Unicode controls that reorder or break a displayed line are shown as
``\\uXXXX``, which is also how JSON writes them, so JSON output stays valid. The tool's own
colours and progress bar pass as a per-process token that no input can know in advance.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO, cast

# What a terminal acts on: C0 but "\n", DEL, C1, the bidi embeddings, overrides and isolates,
# and the line and paragraph separators.
_UNSAFE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
# Stands for ESC and CR in the tool's own output while a guard is installed (private-use
# brackets around a random secret); safe() never produces it, no input can predict it.
_TOKEN = f"\ue000{os.urandom(8).hex()}\ue001"
_OWN = {"\x1b": _TOKEN + "e", "\r": _TOKEN + "r"}


# The same set within ASCII, as bytes for bytes.translate: an ASCII text without any of them
# needs no regex pass (plan --offline --json writes 21.6 MB at 1,000 hosts: 0.07 s against 0.25).
_UNSAFE_ASCII = bytes([*range(0x0A), *range(0x0B, 0x20), 0x7F])


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def safe(text: str) -> str:
    """Text with every control a terminal would act on written as ``\\uXXXX`` (newlines kept:
    callers put them there; a value that must stay on one line is quoted where it is made)."""
    if text.isascii():
        raw = text.encode("ascii")
        if len(raw.translate(None, _UNSAFE_ASCII)) == len(raw):
            return text
    return _UNSAFE.sub(_escape, text)


class GuardedStream:
    """A text stream that writes everything through ``safe``, then turns the tool's own tokens
    back into ESC and CR; every other attribute is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        out = safe(text)
        if _TOKEN in out:
            for char, token in _OWN.items():
                out = out.replace(token, char)
        self.wrapped.write(out)
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


@contextmanager
def terminal_guard() -> Iterator[None]:
    """Guard sys.stdout and sys.stderr for the duration of one command."""
    saved = sys.stdout, sys.stderr
    try:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is not None and not isinstance(stream, GuardedStream):
                setattr(sys, name, cast(TextIO, GuardedStream(stream)))
        yield
    finally:
        sys.stdout, sys.stderr = saved


def own(char: str, stream: TextIO) -> str:
    """The tool's own ESC or CR for ``stream``: a token a guard turns back, else the character."""
    return _OWN[char] if isinstance(stream, GuardedStream) else char


def use_color(stream: TextIO) -> bool:
    """Colour only for a terminal, and never when NO_COLOR is set (no-color.org)."""
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def paint(text: str, code: str, stream: TextIO | None = None) -> str:
    stream = sys.stdout if stream is None else stream
    text = safe(text)
    if not use_color(stream):
        return text
    esc = own("\x1b", stream)
    return f"{esc}[{code}m{text}{esc}[0m"


def emit_json(data: Any, stream: TextIO | None = None) -> None:
    """JSON for scripts: controls inside strings escaped (json leaves DEL and C1 raw)."""
    stream = sys.stdout if stream is None else stream
    stream.write(safe(json.dumps(data, indent=2, ensure_ascii=False)) + "\n")


class Encoded(str):
    """JSON text already written compactly (``compact``): stream_json puts it as it is."""


def compact(value: Any) -> Encoded:
    """value as stream_json writes it: compact JSON, marked as already encoded."""
    return Encoded(_compact(value))


def stream_json(data: Any, stream: TextIO | None = None, chunk: int = 1 << 20) -> None:
    """Compact JSON (one line) for documents too large to hold twice: written as it is encoded,
    in chunks of about ``chunk`` characters, an iterator's items one at a time, each item through
    json's C encoder (plan --offline --json at 10,000 hosts: 216 MB that is never one string,
    nor a list of 166,000 row dicts). The bytes are json.dumps(data, ensure_ascii=False,
    separators=(",", ":")) with every iterator as a list, passed through ``safe`` (once: a
    GuardedStream does it itself); an item that is ``Encoded`` is that text already."""
    stream = sys.stdout if stream is None else stream
    guarded = isinstance(stream, GuardedStream)
    parts: list[str] = []
    size = 0

    def put(text: str) -> None:
        nonlocal size
        parts.append(text)
        size += len(text)
        if size >= chunk:
            flush()

    def flush() -> None:
        nonlocal size
        text = "".join(parts)
        stream.write(text if guarded else safe(text))
        parts.clear()
        size = 0

    def items(value: Iterator[Any]) -> None:
        nonlocal size
        put("[")
        comma = ""
        for item in value:
            text = item if isinstance(item, Encoded) else _compact(item)
            parts.append(comma)
            parts.append(text)
            comma = ","
            size += len(text) + 1
            if size >= chunk:
                flush()
        put("]")

    def encode(value: Any) -> None:
        if isinstance(value, Iterator):
            items(value)
        elif isinstance(value, dict) and all(isinstance(k, str) for k in value):
            put("{")
            for n, (key, item) in enumerate(value.items()):
                put(("," if n else "") + _compact(key) + ":")
                encode(item)
            put("}")
        elif isinstance(value, (list, tuple)) and any(
            isinstance(v, (dict, Iterator)) for v in value
        ):
            put("[")
            for n, item in enumerate(value):
                if n:
                    put(",")
                encode(item)
            put("]")
        else:
            put(_compact(value))

    encode(data)
    put("\n")
    flush()


# json.dumps(value, ensure_ascii=False, separators=(",", ":")), without making an encoder per
# value (a plan over 1,000 hosts encodes 23,000 of them)
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _compact(value: Any) -> str:
    return _COMPACT.encode(value)


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """Left-aligned columns, two spaces apart, no trailing spaces; each cell on one line."""
    clean = [[safe(c).replace("\n", "\\u000a") for c in row] for row in [header, *rows]]
    widths = [len(h) for h in clean[0]]
    for row in clean[1:]:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = []
    for row in clean:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write to a temporary name in the same directory, then rename over the target: a reader
    sees the old file or the new one, never half of one (mkstemp makes it 0600; mode is what it
    ends as)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
