"""POSIX-sh programs that run on hosts: kept as ``.sh`` files beside the layer that uses them
(so shellcheck reads them), loaded as text, and given their parameters as shell variables.

A script names its parameters at the top: ``: "${name:?}"`` (required) or ``: "${name=}"``
(optional, empty when not given); ``bind`` puts one quoted assignment per parameter before it,
so no value is ever parsed as shell.
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from importlib import resources

_DECLARATION = re.compile(r"^: (.*)$", re.MULTILINE)
_PARAM = re.compile(r'"\$\{([a-z_][a-z0-9_]*)(:\?|=)\}"')


@cache
def load(package: str, name: str) -> str:
    """The text of ``<package>/scripts/<name>.sh``, shipped in the wheel."""
    return (resources.files(package) / "scripts" / f"{name}.sh").read_text(encoding="utf-8")


def params(script: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The parameters a script declares on its ``: "${...}"`` lines: (required, optional)."""
    required: list[str] = []
    optional: list[str] = []
    for line in _DECLARATION.findall(script):
        for name, how in _PARAM.findall(line):
            (required if how == ":?" else optional).append(name)
    return tuple(required), tuple(optional)


def bind(script: str, **values: str | int) -> str:
    """The script with its parameters assigned first: every required one must be given, and
    nothing it does not declare."""
    required, optional = params(script)
    given = set(values)
    missing, unknown = set(required) - given, given - set(required) - set(optional)
    if missing or unknown:
        raise ValueError(f"script parameters: missing {sorted(missing)}, unknown {sorted(unknown)}")
    binds = "".join(f"{k}={shlex.quote(str(v))}\n" for k, v in values.items())
    return "set -u\n" + binds + script
