"""Printing for people and scripts: tables, JSON, colour only on a terminal without NO_COLOR."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO


def use_color(stream: TextIO) -> bool:
    """Colour only for a terminal, and never when NO_COLOR is set (no-color.org)."""
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def paint(text: str, code: str, stream: TextIO = sys.stdout) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if use_color(stream) else text


def emit_json(data: Any, stream: TextIO = sys.stdout) -> None:
    json.dump(data, stream, indent=2, ensure_ascii=False)
    stream.write("\n")


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """Left-aligned columns, two spaces apart, no trailing spaces."""
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = []
    for row in [header, *rows]:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
