"""The command line: parses, calls the layers below, prints; no decision of its own.

Each command module registers its own subcommands (``register``) and keeps heavy imports
(pyinfra, huggingface_hub, gguf, pydantic) inside its handlers, and a command line builds only
the parsers of the module its command lives in, so ``models`` and ``info`` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from tensorless_deploy import __version__
from tensorless_deploy.cli.output import emit_json, terminal_guard
from tensorless_deploy.errors import RecipeError, TensorlessError, UsageError

Handler = Callable[[argparse.Namespace], int]
Command = Callable[[str, str, Handler], argparse.ArgumentParser]
COMMAND_MODULES = (
    "catalog",
    "doctor",
    "prepare",
    "plan",
    "deploy",
    "run",
    "status",
    "bench",
    "export",
    "gate",
    "maintain",
)
# Which module registers each command: a run of one command imports and builds only that
# module's parsers (start-up time); --help, no command or an unknown one build them all.
# tests/test_cli_startup.py checks the table against what each module registers.
COMMANDS = {
    "check": "catalog",
    "models": "catalog",
    "info": "catalog",
    "doctor": "doctor",
    "prepare": "prepare",
    "plan": "plan",
    "deploy": "deploy",
    "run": "run",
    "pull": "run",
    "serve": "run",
    "status": "status",
    "logs": "status",
    "stop": "status",
    "rollback": "status",
    "prune": "status",
    "targets": "status",
    "bench": "bench",
    "export": "export",
    "gate": "gate",
    "maintain": "maintain",
}


def _common(p: argparse.ArgumentParser, top: bool) -> None:
    # Shared flags work before or after the command; SUPPRESS keeps a later default from
    # overwriting what was given earlier.
    def default(v: object) -> object:
        return v if top else argparse.SUPPRESS

    p.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON for scripts"
    )
    p.add_argument(
        "-v", "--verbose", action="count", default=default(0), help="say more (repeat for more)"
    )


def subcommand(group: Any, name: str, help_: str, handler: Handler) -> argparse.ArgumentParser:
    """One command of a group (``gate check``): the shared flags, and its own handler."""
    p: argparse.ArgumentParser = group.add_parser(name, help=help_, description=help_)
    _common(p, top=False)
    p.set_defaults(handler=handler)
    return p


class ToolParser(argparse.ArgumentParser):
    """argparse, but a usage error is the tool's own: one line, exit 2, JSON under --json."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", fix=f"see {self.prog} --help")


def command_module(words: Sequence[str]) -> str | None:
    """The one module a command line needs: its first word that is no option names a command
    (the top-level options take no value); None: build every command (help, errors)."""
    for word in words:
        if word == "--":
            return None
        if not word.startswith("-"):
            return COMMANDS.get(word)
        if word in ("-h", "--help", "--version"):
            return None
    return None


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for every command, or with words only for the command they name."""
    parser = ToolParser(
        prog="tensorless-deploy",
        description="Serve pinned llama-server recipes on GPU hosts and on this machine.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_: str, handler: Handler) -> argparse.ArgumentParser:
        return subcommand(sub, name, help_, handler)

    only = command_module(words) if words is not None else None
    for module in (only,) if only else COMMAND_MODULES:
        importlib.import_module(f"tensorless_deploy.cli.{module}").register(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # every line a command prints passes through output.safe (no raw ESC, C1 or CR from input)
    with terminal_guard():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words)
    # Everything after a bare "--" is extra llama-server args, for the commands that take them.
    extra: list[str] = []
    if "--" in words:
        at = words.index("--")
        words, extra = words[:at], words[at + 1 :]
    args = argparse.Namespace(json="--json" in words)  # what a refusal of the words may say
    try:
        args = parser.parse_args(words)
        if extra and not getattr(args, "takes_extra", False):
            parser.error(f"{args.command} takes no extra llama-server args after --")
        args.extra = extra
        handler: Handler = args.handler
        return handler(args)
    except TensorlessError as exc:
        lines = exc.lines()
        if isinstance(exc, RecipeError):
            files = len({line.split(": ", 1)[0] for line in exc.problems})
            lines.append(f"{len(exc.problems)} problem(s) in {files} file(s): no recipe was loaded")
        if getattr(args, "json", False):
            # --json means JSON on stdout, refusals included; the same lines go to stderr
            emit_json(
                {
                    "ok": False,
                    "exit_code": exc.exit_code,
                    "error": {"message": exc.message, "fix": exc.fix, "lines": lines},
                }
            )
        for line in lines:
            print(line, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
