"""Conventions every command keeps, driven through the CLI as an operator types it: a usage
error is one line and exit 2; --json means JSON on stdout, refusals included; every command
that changes something takes --dry-run (and --dry, its older spelling); --recipes everywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.cli import build_parser
from tests.hosts.fleet import cli

CHANGING = ("deploy", "serve", "stop", "rollback", "prune", "prepare")


def _subcommands() -> dict[str, object]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return dict(action.choices)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "argv",
    [
        ["deploy"],
        ["models", "--bogus"],
        ["nosuchcommand"],
        ["run", "pn3", "--port", "eighty"],
        ["doctor", "-i", "x.py", "--local"],
        ["plan"],
    ],
)
def test_usage_errors_are_one_line_and_exit_2(argv: list[str]) -> None:
    proc = cli(*argv)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "(fix: see tensorless-deploy" in proc.stderr
    as_json = cli(*argv, "--json")
    assert as_json.returncode == 2
    doc = json.loads(as_json.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2 and doc["error"]["message"]


@pytest.mark.parametrize(
    "argv",
    [
        ["info", "nosuchmodel"],
        ["doctor", "--local", "nosuchmodel"],
        ["plan", "--local", "nosuchmodel"],
        ["run", "nosuchmodel", "--dry-run"],
        ["pull", "nosuchmodel"],
        ["bench", "nosuchmodel"],
    ],
)
def test_an_unknown_model_is_a_usage_error_in_text_and_json(argv: list[str]) -> None:
    proc = cli(*argv)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("nosuchmodel: no recipe for this model")
    doc = json.loads(cli(*argv, "--json").stdout)
    assert doc["exit_code"] == 2 and "no recipe for this model" in doc["error"]["message"]


def test_every_changing_command_takes_dry_run_and_dry() -> None:
    commands = _subcommands()
    for name in CHANGING:
        sub = commands[name]
        flags = {o for a in sub._actions for o in a.option_strings}  # type: ignore[attr-defined]
        assert {"--dry-run", "--dry"} <= flags, name
    args = build_parser().parse_args(["deploy", "-i", "inv.py", "pn3", "--dry"])
    assert args.dry_run is True


def test_every_command_that_reads_recipes_takes_recipes(tmp_path: Path) -> None:
    for name, sub in _subcommands().items():
        flags = {o for a in sub._actions for o in a.option_strings}  # type: ignore[attr-defined]
        # targets reads only the hosts' units and the inventory's key files, never a recipe
        if name not in ("export", "targets") or "--recipes" in flags:
            assert "--recipes" in flags, name
    proc = cli("check", "--recipes", "recipes")
    assert proc.returncode == 0 and "all valid" in proc.stdout, proc.stderr
    both = cli("check", "recipes", "--recipes", str(tmp_path))
    assert both.returncode == 2 and "give the directory once" in both.stderr


def test_serve_takes_what_run_takes(tmp_path: Path) -> None:
    """serve is documented as taking run's arguments; a dry run here (no GPU, no driver) is
    refused by the host plan, not by the parser."""
    proc = cli("serve", "pn3", "--dry-run", "--port", "8099", "--host", "127.0.0.1")
    assert "unrecognized arguments" not in proc.stderr and proc.returncode in (0, 1)
    assert "Traceback" not in proc.stderr


def _inventory_commands() -> list[str]:
    return [
        name
        for name, p in _subcommands().items()
        if any("-i" in a.option_strings for a in p._actions)  # type: ignore[attr-defined]
    ]


@pytest.mark.parametrize("command", _inventory_commands())
def test_a_missing_inventory_offers_local_only_where_the_command_has_it(command: str) -> None:
    """`stop pn3 -i typo.py` once said "pass -i FILE.py or --local", a flag stop lacks."""
    sub: Any = _subcommands()[command]
    has_local = any("--local" in a.option_strings for a in sub._actions)
    positional = [a for a in sub._actions[1:] if not a.option_strings and a.required]
    words = [a.choices[0] if a.choices else "pn3" for a in positional]  # maintain: begin
    # --limit too: maintain asks for it before it reads the inventory
    proc = cli(command, *words, "-i", "/nonexistent/inventory.py", "--limit", "gpu1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "/nonexistent/inventory.py: no such inventory file" in proc.stderr, proc.stderr
    assert ("--local" in proc.stderr) == has_local, proc.stderr


@pytest.mark.parametrize(
    ("argv", "typed", "meant"),
    [
        (["deploy", "-i", "inv.py", "pn3", "--dryrun"], "--dryrun", "--dry-run"),
        (["stop", "pn3", "--dryrun"], "--dryrun", "--dry-run"),
        (["status", "--limt", "gpu1"], "--limt", "--limit"),
        (["models", "--jsn"], "--jsn", "--json"),
    ],
)
def test_a_mistyped_flag_names_the_flag_it_resembles(
    argv: list[str], typed: str, meant: str
) -> None:
    proc = cli(*argv)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"unrecognized arguments: {typed} (did you mean {meant}?)" in proc.stderr, proc.stderr
    assert f"(fix: see tensorless-deploy {argv[0]} --help)" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "command",
    ["export pn3 --format kube --insecure-open", "models", "info pn3", "models --json"],
)
def test_a_closed_pipe_ends_quietly(command: str) -> None:
    """`export ... | head` once ended in a BrokenPipeError traceback. The reader here is gone
    before the command writes (`| true` exits at once), so every write meets a closed pipe."""
    import subprocess
    import sys

    proc = subprocess.run(
        [
            "bash",
            "-o",
            "pipefail",
            "-c",
            f'"$0" -m tensorless_deploy {command} | true',
            sys.executable,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 141, proc.stderr  # 128 + SIGPIPE, as a shell reports a filter
    assert proc.stderr == "", proc.stderr


@pytest.mark.parametrize("thread", [False, True])
def test_a_command_leaves_with_its_code_its_output_and_its_exit_functions(thread: bool) -> None:
    """cli.leave (the console script's and python -m's way out) skips the interpreter's
    teardown, not what a normal exit does: its code, every buffered byte, the atexit functions,
    and a thread still working is waited for."""
    import subprocess
    import sys

    program = (
        "import atexit, sys, threading, time\n"
        "from tensorless_deploy.cli import leave\n"
        "atexit.register(lambda: print('exit functions ran', file=sys.stderr))\n"
        "def late():\n"
        "    time.sleep(0.3)\n"
        "    print('the thread finished', file=sys.stderr)\n"
        f"if {thread}: threading.Thread(target=late).start()\n"
        "sys.stdout.write('buffered, never flushed by the program')\n"
        "leave(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    assert proc.stdout == "buffered, never flushed by the program"
    assert "exit functions ran" in proc.stderr
    assert ("the thread finished" in proc.stderr) is thread
