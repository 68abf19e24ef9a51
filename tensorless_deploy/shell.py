"""POSIX-sh programs that run on hosts: kept as ``.sh`` files beside the layer that uses them
(so shellcheck reads them), loaded as text, and given their parameters as shell variables.

A script names its parameters at the top: ``: "${name:?}"`` (required) or ``: "${name=}"``
(optional, empty when not given); ``bind`` puts one quoted assignment per parameter before it,
so no value is ever parsed as shell.

A script that says ``# needs: NAME.sh`` (one line per file) gets that file's functions before
it (``program``): a NAME.sh of its own package, or a base library of tensorless_deploy/scripts
(``api.sh``: an instance's API read with its key; or ``host.sh``), ``host.sh`` being the
functions every layer's scripts share with values the Python side uses too: the unit files'
directories and name prefix, the time bound of a GET of a server, the sha256 of a file and the
verification stamp. Those values are the constants below (and ``hub.STAMP_STAT``), bound into
every program that needs host.sh (``host_values``): a script has no copy of its own.
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from importlib import resources

from tensorless_deploy import hub

# Every unit this tool writes is named UNIT_PREFIX + ... (recipe.catalog.unit_name), as a
# quadlet in QUADLET_DIR or a plain service in SYSTEMD_DIR (launch.render).
UNIT_PREFIX = "tensorless-"
# The front door's own unit (hostplan.gateway), in SYSTEMD_DIR under the same prefix: never a
# model's unit (those name a card), so no reader of the model units takes it for one.
DOOR_UNIT = UNIT_PREFIX + "gateway"
QUADLET_DIR = "/etc/containers/systemd"
SYSTEMD_DIR = "/etc/systemd/system"
# How long one GET of a server's /health (or /metrics) may take, everywhere: the container's own
# health check (launch.container), the host scripts' probes (host.sh http_code) and the Python
# ones (facts.pyinfra.HttpStatus, local.run). One bound, so every reader calls the same server
# alive: a probe shorter than the unit's own check would call a server not answering that
# podman counts healthy.
HEALTH_TIMEOUT_S = 5

HOST_LIB = "host"
# the base libraries, in tensorless_deploy/scripts: host.sh, and api.sh (a serving instance's API
# read with its key: /metrics, /slots, the wait until it is idle)
API_LIB = "api"
BASE_LIBS = frozenset({HOST_LIB, API_LIB})
_BASE = "tensorless_deploy"
_DECLARATION = re.compile(r"^: (.*)$", re.MULTILINE)
_PARAM = re.compile(r'"\$\{([a-z_][a-z0-9_]*)(:\?|=)\}"')
_NEEDS = re.compile(r"^# needs: ([a-z-]+)\.sh$", re.MULTILINE)


@cache
def load(package: str, name: str) -> str:
    """The text of ``<package>/scripts/<name>.sh``, shipped in the wheel."""
    return (resources.files(package) / "scripts" / f"{name}.sh").read_text(encoding="utf-8")


def host_values() -> dict[str, str | int]:
    """host.sh's parameters: the Python constants it shares, as they are now."""
    return {
        "td_unit_prefix": UNIT_PREFIX,
        "td_door_unit": DOOR_UNIT,
        "td_quadlet_dir": QUADLET_DIR,
        "td_systemd_dir": SYSTEMD_DIR,
        "td_http_max_time": HEALTH_TIMEOUT_S,
        "td_stamp_stat": hub.STAMP_STAT,
    }


def _needed(package: str, text: str, seen: list[tuple[str, str]]) -> None:
    """The libraries ``text`` needs, and theirs, each once, a library before what needs it."""
    for name in _NEEDS.findall(text):
        where = _BASE if name in BASE_LIBS else package
        if (where, name) not in seen:
            _needed(where, load(where, name), seen)
            seen.append((where, name))


def program(package: str, name: str, /, **params: str | int) -> str:
    """``<package>/scripts/<name>.sh`` as shell text: what it needs first, then the script,
    its parameters bound (host.sh's from ``host_values``)."""
    text = load(package, name)
    libs: list[tuple[str, str]] = []
    _needed(package, text, libs)
    values = {**host_values(), **params} if (_BASE, HOST_LIB) in libs else params
    return bind("\n".join([*(load(*lib) for lib in libs), text]), **values)


def with_host_lib(command: str) -> str:
    """A one-off command line that calls host.sh's functions, with the library bound."""
    return bind(load(_BASE, HOST_LIB) + command, **host_values())


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
