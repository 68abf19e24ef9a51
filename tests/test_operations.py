"""Data-only operation scenarios: tests/operations/<module>.<op>/<scenario>.json, facts in, commands
out, the way pyinfra tests its own operations.

A scenario is::

    {
      "description": "what decision it pins",
      "args": {...},                  # the operation's own arguments, passed to op._inner(**args)
      "env": {"HF_ENDPOINT": "..."},  # optional; HF_ENDPOINT is unset unless a scenario sets it
      "facts": {                      # every fact the operation reads, and nothing else
        "FactClassName": {"arg=value, arg=value": value}   # pyinfra's get_kwargs_str keys
      },
      "commands": [...],              # what it yields, rendered as below
      "noop_description": "..."       # required when it yields nothing
    }

Commands render as: a plain command's text; a bound script of operations/scripts (the
``sh -c`` that ``_run.script`` makes) as ``{"script": NAME, "params": {...}}``, the parameters as
the strings the host's shell gets, checked by binding them again to the very same text; a file
upload as ``["upload", CONTENT, DEST]``. Fact values are JSON, as every fact returns them (the
operation builds a typed value with the fact's ``typed``). The fake host fails on a fact (or
fact argument) a scenario does not give, and a
scenario fails when it gives a fact the operation did not read.
"""

from __future__ import annotations

import inspect
import json
import pkgutil
import re
import shlex
from importlib import import_module, resources
from inspect import signature
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.util import get_kwargs_str
from pyinfra.context import ctx_host

from tensorless_deploy import shell
from tensorless_deploy.operations import _run

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

SCENARIOS = Path(__file__).parent / "operations"
OPERATIONS_PACKAGE = "tensorless_deploy.operations"
KEYS = {"description", "args", "env", "facts", "commands", "noop_description"}

# fact class name -> JSON -> the value the real fact's process() returns


class MissingFact(AssertionError):
    pass


class FakeHost:
    """Answers get_fact from a scenario's facts only; records noop() and what it was asked."""

    name = "fakehost"

    def __init__(self, facts: dict[str, dict[str, Any]]) -> None:
        self.facts = facts
        self.read: set[tuple[str, str]] = set()
        self.noop_description: str | None = None

    def noop(self, description: str) -> None:
        assert self.noop_description is None, "noop() called twice"
        self.noop_description = description

    def get_fact(self, fact_cls: type, *args: Any, **kwargs: Any) -> Any:
        name = fact_cls.__name__
        assert not args, f"{name}: pass fact arguments by name"
        accepted = set(signature(fact_cls.command).parameters) - {"self"}
        unknown = set(kwargs) - accepted
        assert not unknown, f"{name}.command() takes no {sorted(unknown)}"
        key = get_kwargs_str(kwargs)
        given = self.facts.get(name)
        if given is None or key not in given:
            raise MissingFact(f"the scenario gives no fact {name} for {key!r}")
        self.read.add((name, key))
        return given[key]


_BIND = re.compile(r"([a-z_][a-z0-9_]*)=((?:'[^']*'|\"'\"|[\w@%+=:,./-])+)\n")
_SCRIPT_NAMES = sorted(
    p.name[: -len(".sh")]
    for p in (resources.files(OPERATIONS_PACKAGE) / "scripts").iterdir()
    if p.name.endswith(".sh") and p.name != "lib.sh"
)


def _bound_script(text: str) -> dict[str, Any] | None:
    """``{"script", "params"}`` for the ``sh -c`` of ``_run.script``; None for other commands."""
    words = shlex.split(text)
    if len(words) != 3 or words[:2] != ["sh", "-c"] or not words[2].startswith("set -u\n"):
        return None
    body = words[2]
    for name in _SCRIPT_NAMES:
        if not body.endswith(shell.load(OPERATIONS_PACKAGE, name)):
            continue
        params: dict[str, str] = {}
        pos = len("set -u\n")
        while m := _BIND.match(body, pos):
            params[m.group(1)] = shlex.split(m.group(2))[0]
            pos = m.end()
        # host.sh's values are the program's own (shell.host_values), bound whatever the params
        params = {k: v for k, v in params.items() if k not in shell.host_values()}
        again = _run.script(name, **params).get_raw_value()
        assert again == text, f"{name}: the parameters read back do not rebuild the command"
        return {"script": name, "params": params}
    raise AssertionError(f"an sh -c that is no script of operations/scripts: {text[:200]!r}")


def render(command: Any) -> Any:
    if isinstance(command, str):
        command = StringCommand(command.strip())
    if isinstance(command, StringCommand):
        text = command.get_raw_value()
        rendered = _bound_script(text) or text
        stdin = command.connector_arguments.get("_stdin")
        if stdin is not None:  # what the command reads: a secret's only way to the host
            return {"stdin": stdin, "command": rendered}
        return rendered
    if isinstance(command, FileUploadCommand):
        assert hasattr(command.src, "read"), "uploads from the controller's disk: none expected"
        command.src.seek(0)
        data = command.src.read()
        return ["upload", data.decode() if isinstance(data, bytes) else data, str(command.dest)]
    raise AssertionError(f"unexpected command type {type(command).__name__}")


def _operation(folder: str) -> Any:
    module, op = folder.split(".")
    return getattr(import_module(f"{OPERATIONS_PACKAGE}.{module}"), op)


def _public_operations() -> set[str]:
    """Every @operation of the package's modules (not the @deploy functions, not _private)."""
    found = set()
    package = import_module(OPERATIONS_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        module = info.name
        if module.startswith("_"):
            continue
        mod = import_module(f"{OPERATIONS_PACKAGE}.{module}")
        for name, value in vars(mod).items():
            inner = getattr(value, "_inner", None)
            # @operation and @deploy both keep the function as _inner; a deploy's has a name
            if (
                inner is not None
                and value.__module__ == mod.__name__
                and not hasattr(inner, "deploy_name")
            ):
                found.add(f"{module}.{name}")
    return found


def _scenarios() -> list[Any]:
    return [
        pytest.param(path, id=f"{path.parent.name}/{path.stem}")
        for path in sorted(SCENARIOS.glob("*/*.json"))
    ]


def test_every_operation_has_scenarios_and_every_folder_an_operation() -> None:
    folders = {p.name for p in SCENARIOS.iterdir() if p.is_dir()}
    operations = _public_operations()
    assert not operations - folders, f"operations without scenarios: {sorted(operations - folders)}"
    assert not folders - operations, f"folders without an operation: {sorted(folders - operations)}"
    for folder in folders:
        assert list((SCENARIOS / folder).glob("*.json")), f"{folder}: no scenario"


@pytest.mark.parametrize("path", _scenarios())
def test_operation(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))
    assert set(case) <= KEYS, f"{path}: unknown keys {sorted(set(case) - KEYS)}"
    assert case.get("description"), f"{path}: say what the scenario decides"
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    for key, value in case.get("env", {}).items():
        monkeypatch.setenv(key, value)
    op = _operation(path.parent.name)
    host = FakeHost(case.get("facts", {}))
    with ctx_host.use(host):
        commands = [render(c) for c in op._inner(**case.get("args", {}))]
    assert commands == case["commands"], json.dumps(commands, indent=2)
    given = {(name, key) for name, by_key in host.facts.items() for key in by_key}
    assert given == host.read, f"facts given but never read: {sorted(given - host.read)}"
    if not commands or "noop_description" in case:
        assert host.noop_description == case.get("noop_description")
    else:
        assert host.noop_description is None, "commands and a noop at once"
    token = case.get("args", {}).get("token")
    if token:
        # a secret reaches the host only through a secret-write's stdin: no command line and
        # no upload carries it (pyinfra's upload with _sudo stages a world-readable file)
        assert not any(isinstance(c, list) and c[0] == "upload" for c in commands), "an upload"
        written = {
            c["command"]["params"]["path"]: c["stdin"]
            for c in commands
            if isinstance(c, dict) and "stdin" in c and c["command"]["script"] == "secret-write"
        }
        rest = [c["command"] if isinstance(c, dict) and "stdin" in c else c for c in commands]
        assert token not in json.dumps(rest), "the token is in a command line"
        for c in rest:
            if isinstance(c, dict) and c["script"] == "model-download":
                assert c["params"]["auth"], "a download without the token it was given"
                assert token in written[c["params"]["auth"]], "curl's header file lacks the token"


def test_the_fake_host_refuses_a_fact_the_scenario_does_not_give() -> None:
    host = FakeHost({"ImagePresent": {"engine_bin=/usr/bin/podman, image=other": True}})
    op = _operation("image.image")
    with ctx_host.use(host), pytest.raises(MissingFact):
        list(op._inner(engine_bin="/usr/bin/podman", image="x@sha256:" + "0" * 64))


def test_a_bound_script_reads_back_its_parameters_exactly() -> None:
    tricky = {"path": "/etc/a b/it's\nnew", "new": "", "sha": "0" * 64}
    command = _run.script("unit-install", **tricky)
    assert render(command) == {"script": "unit-install", "params": tricky}


DOC = Path(__file__).parent.parent / "docs" / "pyinfra.md"


@pytest.mark.parametrize("folder", sorted(_public_operations()))
def test_docstring_in_pyinfra_style_and_in_the_doc(folder: str) -> None:
    """One summary line, ``+ arg: ...`` for every argument, an ``**Example:**`` block; the
    arguments' lines appear verbatim in docs/pyinfra.md."""
    op = _operation(folder)
    doc = inspect.getdoc(op._inner)
    assert doc is not None, folder
    summary, _, rest = doc.partition("\n\n")
    assert "\n" not in summary and summary.endswith("."), f"{folder}: one summary line"
    args = [p for p in rest.split("\n\n") if p.startswith("+ ")]
    assert len(args) == 1, f"{folder}: one block of + arg: lines"
    named = re.findall(r"^\+ (\w+):", args[0], re.MULTILINE)
    assert named == list(signature(op._inner).parameters), f"{folder}: + arg: per argument"
    assert "**Example:**\n\n.. code:: python\n" in rest, f"{folder}: an Example block"
    text = DOC.read_text(encoding="utf-8")
    assert f"### `{folder}`" in text and args[0] in text, f"docs/pyinfra.md lacks {folder}'s"


def test_serve_documented_in_pyinfra_style_and_in_the_doc() -> None:
    from tensorless_deploy.operations.deploy import serve

    doc = inspect.getdoc(serve._inner)
    assert doc is not None
    summary, _, rest = doc.partition("\n\n")
    assert "\n" not in summary
    params = list(signature(serve._inner).parameters)
    assert re.findall(r"^\+ (\w+):", rest, re.MULTILINE) == params
    assert "**Example:**" in rest
    text = DOC.read_text(encoding="utf-8")
    for name in params:
        assert f"| `{name}` |" in text, f"docs/pyinfra.md: serve's {name} is not in the table"
