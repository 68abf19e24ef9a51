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
    "bundle",
    "run",
    "status",
    "bench",
    "export",
    "gate",
    "maintain",
    "gateway",
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
    "bundle": "bundle",
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
    "gateway": "gateway",
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


def _unrecognized(
    parser: argparse.ArgumentParser, command: str | None, words: Sequence[str]
) -> str:
    """argparse's "unrecognized arguments", and for a mistyped option the nearest one the
    command has (--dryrun: did you mean --dry-run?)."""
    import difflib

    known: list[str] = []
    for p in (parser, _subparser(parser, command)):
        if p is not None:
            known += [o for a in p._actions for o in a.option_strings if o.startswith("--")]
    shown = []
    for word in words:
        near = (
            difflib.get_close_matches(word.partition("=")[0], known, n=1, cutoff=0.6)
            if word.startswith("--")
            else []
        )
        shown.append(f"{word} (did you mean {near[0]}?)" if near else word)
    return f"unrecognized arguments: {' '.join(shown)}"


def _subparser(
    parser: argparse.ArgumentParser, command: str | None
) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            found: argparse.ArgumentParser = action.choices[command]
            return found
    return None


def main(argv: Sequence[str] | None = None) -> int:
    # every line a command prints passes through output.safe (no raw ESC, C1 or CR from input)
    with terminal_guard():
        try:
            code = _main(argv)
            sys.stdout.flush()  # here, not at exit: a closed pipe is caught below
            return code
        except BrokenPipeError:
            # the reader went away (`export ... | head`): stop quietly, as a filter does
            _discard_stdout()
            return EXIT_PIPE_CLOSED


def entry() -> NoReturn:
    """The console script and ``python -m tensorless_deploy``: main, then leave at once."""
    leave(main())


def leave(code: int) -> NoReturn:
    """Exit with code without the interpreter's teardown: the atexit functions run (logging's
    flush, tempfile's cleanup, weakref finalizers among them) and the output is flushed, but
    the modules are not torn down one by one, which costs a run that loaded pyinfra, gevent and
    paramiko about 0.15 s after its last line (bench/deploy_fleet.py's converged re-run). A
    thread that is not a daemon is still joined, as the interpreter would: then it exits the
    usual way."""
    import atexit
    import contextlib
    import os
    import threading

    main_thread = threading.main_thread()
    waiting = [t for t in threading.enumerate() if t is not main_thread and not t.daemon]
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if waiting or run_exitfuncs is None:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        # a reader gone, a stream closed: nothing left to say
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    run_exitfuncs()
    os._exit(code)


EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C, said in one line
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for a writer whose pipe closed


def _discard_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush finds nowhere to fail."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
    except OSError:
        pass


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
        args, unknown = parser.parse_known_args(words)
        if unknown:
            command = getattr(args, "command", None)
            (_subparser(parser, command) or parser).error(_unrecognized(parser, command, unknown))
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
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    entry()
