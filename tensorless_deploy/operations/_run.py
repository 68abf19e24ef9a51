"""What the operations share: a bound script as one pyinfra command."""

from __future__ import annotations

import re
import shlex
from collections.abc import Generator
from typing import Any

from pyinfra.api.command import StringCommand

from tensorless_deploy import shell

Commands = Generator[Any, None, None]
PACKAGE = "tensorless_deploy.operations"


# "# needs: lib.sh" (the model scripts' functions) or "# needs: unit-lib.sh" (the unit scripts')
_NEEDS = re.compile(r"^# needs: ([a-z-]+)\.sh$", re.MULTILINE)


def bound(which: str, /, **params: str | int) -> str:
    """operations/scripts/<which>.sh with its parameters bound, as shell text; a script that
    says ``# needs: NAME.sh`` gets that file's functions before it."""
    text = shell.load(PACKAGE, which)
    libs = [shell.load(PACKAGE, name) for name in _NEEDS.findall(text)]
    return shell.bind("\n".join([*libs, text]), **params)


def script(which: str, /, **params: str | int) -> StringCommand:
    """``bound(which, **params)`` as one `sh -c` command."""
    return StringCommand("sh -c " + shlex.quote(bound(which, **params)))
