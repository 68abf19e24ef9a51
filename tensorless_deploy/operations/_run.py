"""What the operations share: a bound script as one pyinfra command."""

from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

from pyinfra.api.command import StringCommand

from tensorless_deploy import shell

Commands = Generator[Any, None, None]
PACKAGE = "tensorless_deploy.operations"


def bound(which: str, /, **params: str | int) -> str:
    """operations/scripts/<which>.sh with its parameters bound, as shell text (with what it
    ``# needs:`` before it: shell.program)."""
    return shell.program(PACKAGE, which, **params)


def script(which: str, /, **params: str | int) -> StringCommand:
    """``bound(which, **params)`` as one `sh -c` command."""
    return StringCommand("sh -c " + shlex.quote(bound(which, **params)))
