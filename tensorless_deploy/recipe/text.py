"""Text from a recipe or a command line: which characters are refused, and how a value is shown
in a one-line error (quoted, escaped, and cut short)."""

from __future__ import annotations

import json
import re

# C0 controls (newline, tab, escape...), DEL and the C1 controls (NEL, CSI U+009B...): the set
# that rendering refuses in a unit file (launch.render), refused wherever a recipe says text.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
SHOWN_CHARS = 80  # the most characters of a value an error line repeats


def has_control(text: str) -> bool:
    return CONTROL.search(text) is not None


_NOT_JSON_ESCAPED = re.compile(r"[\x7f-\x9f]")  # DEL and C1: json.dumps leaves them raw


def json_string(value: str) -> str:
    """A JSON string literal with every control character escaped (C0 by json, DEL and C1 here),
    other non-ASCII text kept readable."""
    text = json.dumps(value, ensure_ascii=False)
    return _NOT_JSON_ESCAPED.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def quoted(value: str, limit: int = SHOWN_CHARS) -> str:
    """A value as an error shows it: JSON-quoted (every control escaped), at most ``limit``
    characters of it, with the full length named when it was cut."""
    if len(value) <= limit:
        return json_string(value)
    return f"{json_string(value[:limit])}... ({len(value):,} characters)"
