"""What the operations share: a bound script as one pyinfra command."""

from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

from pyinfra.api.command import StringCommand

from tensorless_deploy import shell

Commands = Generator[Any, None, None]
PACKAGE = "tensorless_deploy.operations"


LIB_DIRECTIVE = "# needs: lib.sh"


def bound(which: str, /, **params: str | int) -> str:
    """operations/scripts/<which>.sh with its parameters bound, as shell text; a script that
    says ``# needs: lib.sh`` gets lib.sh's functions before it."""
    text = shell.load(PACKAGE, which)
    if LIB_DIRECTIVE in text:
        text = shell.load(PACKAGE, "lib") + "\n" + text
    return shell.bind(text, **params)


def script(which: str, /, **params: str | int) -> StringCommand:
    """``bound(which, **params)`` as one `sh -c` command."""
    return StringCommand("sh -c " + shlex.quote(bound(which, **params)))
