"""Read ``llama-server --help``: each option's spellings, environment twins and text."""

from __future__ import annotations

import re
from dataclasses import dataclass

# An option line starts at column 0 with its spellings, comma-separated ("-hf,   -hfr,
# --hf-repo <user>/<model>[:quant]"); its description and "(env: LLAMA_ARG_...)" follow, on the
# same line from column 40 and on lines indented that far. Section titles are "----- ... -----".
_SPELLINGS = re.compile(r"((?:-{1,2}[A-Za-z0-9][\w.-]*,\s*)*-{1,2}[A-Za-z0-9][\w.-]*)")
_ENV = re.compile(r"\(env: ([A-Z0-9_]+)\)")


@dataclass
class HelpOption:
    spellings: tuple[str, ...]
    metavar: str
    env: list[str]
    text: str


def parse_help(text: str) -> list[HelpOption]:
    options: list[HelpOption] = []
    current: HelpOption | None = None
    for line in text.splitlines():
        match = _SPELLINGS.match(line)
        if match:
            rest = line[match.end() :]
            metavar = rest.strip().split("  ", 1)[0] if not rest.startswith("  ") else ""
            spellings = tuple(s.strip() for s in match.group(1).split(","))
            current = HelpOption(spellings, metavar, [], rest)
            options.append(current)
        elif line and not line.startswith(" "):
            current = None  # a section title or other text: no option's continuation
        elif current is not None:
            current.text += "\n" + line
        if current is not None:
            current.env += _ENV.findall(line)
    return options
