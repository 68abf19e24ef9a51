"""Layer 6: the command line. Parses, calls the layers below, prints; no logic of its own."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tensorless_deploy import __version__
from tensorless_deploy.errors import RecipeError, TensorlessError

Handler = Callable[[argparse.Namespace], int]


def _common(p: argparse.ArgumentParser, top: bool) -> None:
    # Shared flags work before or after the command; SUPPRESS keeps a later default from
    # overwriting what was given earlier.
    default = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    p.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON for scripts"
    )
    p.add_argument(
        "-v", "--verbose", action="count", default=default(0), help="say more (repeat for more)"
    )


def _recipes_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--recipes",
        type=Path,
        metavar="DIR",
        help="read DIR/<org>/<repo>/<card>.toml, not the built-in catalog",
    )


def _hosts_flags(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "-i",
        "--inventory",
        metavar="INVENTORY",
        help="pyinfra inventory file (see inventories/example.py)",
    )
    where.add_argument("--local", action="store_true", help="this machine only")
    p.add_argument("--limit", action="append", metavar="HOST", help="only this host (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorless-deploy",
        description="Serve pinned llama-server recipes on GPU hosts and on this machine.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_: str, handler: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        _common(p, top=False)
        p.set_defaults(handler=handler)
        return p

    p = command(
        "check",
        "validate a recipes directory (exit 1 when any recipe is refused)",
        "catalog:cmd_check",
    )
    p.add_argument(
        "dir",
        nargs="?",
        type=Path,
        metavar="DIR",
        help="recipes directory (default: the built-in catalog)",
    )

    p = command("models", "list the recipes: one row per model and card", "catalog:cmd_models")
    _recipes_flag(p)

    p = command(
        "info",
        "show every value of a model's recipes before anything is downloaded",
        "catalog:cmd_info",
    )
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    p.add_argument("--card", metavar="ID", help="only this card's recipe")
    _recipes_flag(p)

    p = command(
        "doctor",
        "check hosts read-only, with the command that fixes each problem",
        "doctor:cmd_doctor",
    )
    _hosts_flags(p)
    p.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="repo ids or short names (default: readiness, and what each host can serve)",
    )
    p.add_argument("--allow-draft", action="store_true", help="accept draft recipes")
    p.add_argument("--port", type=int, default=8080, help="serving port to check (default 8080)")
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="ADDR",
        help="serving address to check (default 127.0.0.1)",
    )
    _recipes_flag(p)

    p = command(
        "plan",
        "where each model fits, per host and GPU: the largest context, KV bytes "
        "per token, memory needed vs free, or why not (exit 1 when a model has no "
        "placement)",
        "plan:cmd_plan",
    )
    _hosts_flags(p)
    p.add_argument("models", nargs="+", metavar="MODEL", help="repo ids or short names")
    p.add_argument(
        "--context",
        type=int,
        metavar="N",
        help="does context N fit (instead of the recipe's; untuned)",
    )
    p.add_argument(
        "--offline", action="store_true", help="plan from inventory data (tensorless_gpus), no SSH"
    )
    p.add_argument("--allow-draft", action="store_true", help="accept draft recipes")
    _recipes_flag(p)

    p = command(
        "deploy",
        "serve a recipe on every matching host: image by digest, verified "
        "model, systemd unit, /health (extra llama-server args after --, untuned)",
        "deploy:cmd_deploy",
    )
    p.add_argument(
        "-i",
        "--inventory",
        required=True,
        metavar="INVENTORY",
        help="pyinfra inventory file (see inventories/example.py)",
    )
    p.add_argument("--limit", action="append", metavar="HOST", help="only this host (repeatable)")
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    p.add_argument("--dry", action="store_true", help="show what would change; change nothing")
    p.add_argument(
        "--transfer",
        choices=("auto", "pull", "push"),
        default="auto",
        help="pull: hosts fetch model and image; push: this machine sends them; "
        "auto (default): push only where a host cannot reach them",
    )
    p.add_argument(
        "--serial",
        type=int,
        metavar="N",
        help="roll N hosts at a time; the first failure stops the roll",
    )
    p.add_argument("--allow-draft", action="store_true", help="accept a draft recipe")
    p.add_argument(
        "--context",
        type=int,
        metavar="N",
        help="context instead of the recipe's (marks the run untuned)",
    )
    p.add_argument(
        "--port",
        type=int,
        metavar="N",
        help="API port (default: the host's tensorless_port, else 8080)",
    )
    p.add_argument(
        "--bind", metavar="ADDR", help="API address (default: tensorless_bind, else 127.0.0.1)"
    )
    p.set_defaults(takes_extra=True)
    _recipes_flag(p)

    def local_flags(p: argparse.ArgumentParser, server: bool) -> None:
        p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
        p.add_argument("--allow-draft", action="store_true", help="accept a draft recipe")
        p.add_argument(
            "--engine",
            choices=("podman", "docker"),
            help="container engine (default: podman, else docker)",
        )
        if server:
            p.add_argument("--port", type=int, metavar="N", help="API port (default 8080)")
            p.add_argument("--host", metavar="ADDR", help="API address (default 127.0.0.1)")
            p.add_argument(
                "--context", type=int, metavar="N", help="context instead of the recipe's (untuned)"
            )
            p.set_defaults(takes_extra=True)
        _recipes_flag(p)

    p = command(
        "run",
        "run a recipe on this machine in the foreground until Ctrl-C "
        "(extra llama-server args after --, untuned)",
        "run:cmd_run",
    )
    local_flags(p, server=True)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print every value and the exact command; change nothing",
    )

    p = command(
        "pull", "fetch a recipe's image (by digest) and model (sha256-verified)", "run:cmd_pull"
    )
    local_flags(p, server=False)
    p.add_argument("--card", metavar="ID", help="the card's recipe (default: this machine's GPU)")

    p = command(
        "serve",
        "serve a recipe always-on on this machine: the deploy path, locally",
        "run:cmd_serve",
    )
    local_flags(p, server=True)

    p = command(
        "bench", "measure decode and prefill speed against the recipe's receipt", "bench:cmd_bench"
    )
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--local", action="store_true", help="the server on this machine (the default; see --port)"
    )
    where.add_argument(
        "-i",
        "--inventory",
        metavar="INVENTORY",
        help="every inventory host serving MODEL, through SSH",
    )
    where.add_argument("--url", metavar="URL", help="a server at http://HOST:PORT")
    p.add_argument("--port", type=int, default=8080, metavar="N", help="local port (8080)")
    p.add_argument("--limit", action="append", metavar="HOST", help="only this host (repeatable)")
    p.add_argument("--card", metavar="ID", help="the card's recipe (default: the model's first)")
    p.add_argument("--runs", type=int, default=3, metavar="N", help="measured runs (default 3)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.10,
        metavar="F",
        help="how far below the receipt still meets it (default 0.10)",
    )
    p.add_argument(
        "--receipt", action="store_true", help="print the [receipt] table for the measured numbers"
    )
    _recipes_flag(p)

    p = command(
        "status", "what each host serves: model, port, health, tuning, drift", "status:cmd_status"
    )
    _hosts_flags(p)
    _recipes_flag(p)

    p = command(
        "stop", "stop and remove a model's unit (on this machine without -i)", "status:cmd_stop"
    )
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    p.add_argument(
        "-i",
        "--inventory",
        metavar="INVENTORY",
        help="pyinfra inventory file (default: this machine)",
    )
    p.add_argument("--limit", action="append", metavar="HOST", help="only this host (repeatable)")
    p.add_argument("--purge", action="store_true", help="also remove the model file")
    _recipes_flag(p)
    return parser


def _load_handler(spec: str) -> Handler:
    # Heavy imports (pyinfra, huggingface_hub) live inside command modules, loaded on demand.
    import importlib

    module, _, func = spec.partition(":")
    handler: Handler = getattr(importlib.import_module(f"tensorless_deploy.cli.{module}"), func)
    return handler


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare "--" is extra llama-server args, for the commands that take them.
    extra: list[str] = []
    if "--" in words:
        at = words.index("--")
        words, extra = words[:at], words[at + 1 :]
    args = parser.parse_args(words)
    if extra and not getattr(args, "takes_extra", False):
        parser.error(f"{args.command} takes no extra llama-server args after --")
    args.extra = extra
    try:
        return _load_handler(args.handler)(args)
    except RecipeError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        files = len({line.split(": ", 1)[0] for line in exc.problems})
        print(
            f"{len(exc.problems)} problem(s) in {files} file(s): no recipe was loaded",
            file=sys.stderr,
        )
        return exc.exit_code
    except TensorlessError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
