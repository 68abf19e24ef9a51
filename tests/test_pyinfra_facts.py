"""Data-only scenarios of the pyinfra facts: tests/pyinfra_facts/<FactClass>/<scenario>.json, the
way pyinfra tests its own facts: ``command(**args)`` and ``process(output lines)`` -> value.

A scenario is::

    {
      "description": "REAL: captured from ... | MALFORMED: ...",
      "args": {...},                 # FactClass().command(**args)
      "command": "..." | "host_command": "..." | "sections": [...] | "script": "NAME",
      "output": ["line", ...],       # the stdout lines pyinfra hands to process()
      "fact": value | "error": "substring of the FactProcessError",
      "properties": {"verified": true}   # optional: attributes of the value
    }

The command is pinned by its text, or for a survey fact by the names of the sections its script
prints (in order), or for a command line that calls host.sh's functions by the line after the bound
library (``host_command``), or for a script fact by its ``facts/scripts/NAME.sh`` (bound to the
args, where there are any); a fact whose command runs under the survey's time bound is pinned by the
command inside ``bounded_command``. Empty output reads as the fact's ``default()``, as pyinfra's
fact gathering does. Outputs are captured from the test hosts with
``tests/pyinfra_facts/capture.py`` (REAL in the description) except where a scenario is about
malformed output (MALFORMED, written by hand).
"""

from __future__ import annotations

import inspect
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from pydantic_core import to_jsonable_python
from pyinfra.api.exceptions import FactProcessError
from pyinfra.api.facts import FactBase

from tensorless_deploy import shell
from tensorless_deploy.facts import pyinfra as facts
from tensorless_deploy.facts.device import DEVICE_LINE
from tensorless_deploy.facts.survey import SECTION_MARKER, bound_preamble, bounded_command

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

SCENARIOS = Path(__file__).parent / "pyinfra_facts"
KEYS = {"description", "args", "command", "sections", "script", "output", "fact", "error"}
KEYS |= {"properties", "host_command"}


def fact_classes() -> set[str]:
    return {
        name
        for name, cls in vars(facts).items()
        if inspect.isclass(cls)
        and issubclass(cls, FactBase)
        and cls.__module__ == facts.__name__
        and not cls.__dict__.get("abstract", False)
    }


def _scenarios() -> list[Any]:
    return [
        pytest.param(path, id=f"{path.parent.name}/{path.stem}")
        for path in sorted(SCENARIOS.glob("*/*.json"))
    ]


# parameters a script fact binds whatever its arguments: the device lines it keeps of a start log
ALWAYS_BOUND = {
    "deployed-units": {"secrets_root": "", "device_re": DEVICE_LINE, "containers": "yes"}
}


def sections_of(command: str) -> list[str]:
    """The sections a survey script prints, in order (its td_frame lines: N HEAD EXIT)."""
    heads = [shlex.split(x)[2] for x in command.splitlines() if x.startswith("td_frame ")]
    return [head.removeprefix(SECTION_MARKER) for head in heads]


def test_every_fact_has_scenarios_and_every_folder_a_fact() -> None:
    folders = {p.name for p in SCENARIOS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == fact_classes()
    for folder in folders:
        assert list((SCENARIOS / folder).glob("*.json")), f"{folder}: no scenario"


@pytest.mark.parametrize("path", _scenarios())
def test_fact(path: Path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))
    assert set(case) <= KEYS, f"{path}: unknown keys {sorted(set(case) - KEYS)}"
    assert case["description"].startswith(("REAL: ", "MALFORMED: ")), path
    pins = [k for k in ("command", "host_command", "sections", "script") if k in case]
    assert len(pins) == 1, f"{path}: pin the command one way"
    assert ("fact" in case) != ("error" in case), f"{path}: give fact or error"
    fact = getattr(facts, path.parent.name)()
    command = str(fact.command(**case.get("args", {})))
    bounded = command.startswith(bound_preamble()) and SECTION_MARKER not in command

    def pinned(text: str) -> str:
        return bounded_command(text) if bounded else text

    if "command" in case:
        assert command == pinned(case["command"])
    elif "host_command" in case:  # a command line that calls host.sh's functions
        assert command == pinned(shell.with_host_lib(case["host_command"]))
    elif "sections" in case:
        assert sections_of(command) == case["sections"]
    else:
        args = {**ALWAYS_BOUND.get(case["script"], {}), **case.get("args", {})}
        assert command == pinned(shell.program("tensorless_deploy.facts", case["script"], **args))
    lines: list[str] = case["output"]
    if "error" in case:
        with pytest.raises(FactProcessError) as raised:
            fact.process(lines)
        assert case["error"] in str(raised.value)
        return
    value = fact.process(lines) if lines else fact.default()
    # plain data, as pyinfra's own facts return and its command line prints (json.dumps with
    # no default: a typed value once crashed `pyinfra INV fact ...`, "Cannot serialize")
    assert json.loads(json.dumps(value)) == case["fact"]
    typed = getattr(fact, "typed", None)
    if typed is not None:
        assert json.loads(json.dumps(to_jsonable_python(typed(value)))) == case["fact"]
    for name, want in case.get("properties", {}).items():
        assert typed is not None and getattr(typed(value), name) == want, f"{path}: {name}"
