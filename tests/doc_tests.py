"""Docs as tests: the markup of docs/*.md and README.md, read here, and what checks it.

A fenced block is covered by the HTML comment on the line before its opening fence (blank lines
between are allowed):

``<!-- doc-test: fast -->``
    Its commands run in tests/test_docs.py on this machine, without test hosts.
``<!-- doc-test: hosts -->``
    Its commands run in tests/test_docs_hosts.py against the playground
    (tests/hosts/playground.sh: the test hosts, ``$INV``, ``$RECIPES``, ``$HF_ENDPOINT``), page by
    page in the order they appear, as one terminal session would run them (each command sees
    the variables exported and the directory left by the one before), from a fresh directory
    that is also ``$HOME``.
``<!-- doc-test: file NAME -->``
    The block is a file: it is written to NAME in the page's working directory before the next
    block of the page runs (a deploy file the next command uses).
``<!-- doc-test: json PRODUCER -->``
    A JSON example: every key it shows must exist, with a value of the type it shows, in the
    JSON of a real run of PRODUCER (``deploy``, ``status``, ``doctor``, ``prepare``, ``plan``,
    ``hosts.json``). ``"...": ...`` is any other key; a list's elements each match some element
    of the real lists; ``null`` matches null (a key documented null may be null in some run).
``<!-- doc-test: synopsis COMMAND -->``
    A synopsis: every flag it names exists on COMMAND, and every flag of COMMAND is named.
``<!-- doc-test: by tests/test_x.py -->``
    Run by that test, which reads the block out of this page itself.
``<!-- illustrative: WHY -->``
    Not run (WHY says why: a real GPU fleet, a placeholder, CI itself). Its ``tensorless-deploy``
    commands are still checked against the argparse tree.

In ``sh``/``shell``/``bash`` blocks every line is a command (a trailing ``\\`` continues it;
``#`` lines are comments); in ``console`` blocks, lines starting ``$ `` are commands and the
lines under one are its expected output (stdout and stderr as a terminal shows them), compared
line by line: a line ``...`` stands for any number of lines, ``...`` inside a line for any text.
A command's trailing comment ``# exit N`` (or ``# exit N: why``) is its expected exit status;
without it, 0.

Besides the blocks, every ``tensorless-deploy`` flag the pages name (commands in blocks, the
command tables of README.md and docs/commands.md, inline code that starts with a command) must
exist on that command, and every exit status a page promises for a command must be one the
command's code can return (and the codes beyond 0, 1, 2 that it can return must be promised);
tests/test_docs.py adds that docs/commands.md's row of each command names all its flags and that
docs/doctor.md's check IDs are the code's.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import json
import os
import re
import shlex
import subprocess
import textwrap
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorless_deploy.cli import EXIT_INTERRUPTED, EXIT_PIPE_CLOSED

ROOT = Path(__file__).resolve().parent.parent
SHELL_LANGS = {"sh", "shell", "bash", "console"}
MARK = re.compile(r"^\s*<!--\s*(doc-test|illustrative):\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
KINDS = {"fast", "hosts", "file", "json", "synopsis", "by"}
EXIT = re.compile(r"^exit (\d+)\b")
GLOBAL_FLAGS = {"-h", "--help", "--json", "-v", "--verbose", "--version"}
TOOL = re.compile(r"(?<![\w/.-])tensorless-deploy(?=\s|$)", re.MULTILINE)


def pages() -> list[Path]:
    """Every page the docs tests know of: README.md and docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def rel(p: Path) -> str:
    """The page's name as the lists name it (README.md, docs/x.md), also for a copy elsewhere."""
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return f"docs/{p.name}" if p.parent.name == "docs" else p.name


# --------------------------------------------------------------------------- blocks


@dataclass(frozen=True)
class Mark:
    kind: str  # fast, hosts, file, json, synopsis, by, illustrative
    arg: str  # the rest: a file name, a producer, a command, a test file, the reason


@dataclass(frozen=True)
class Command:
    line: int  # where it starts in the page (1-based)
    text: str  # the shell command, comment removed, continuations joined
    exit: int  # the documented exit status
    output: tuple[str, ...] | None  # expected output lines (console blocks), None: not shown


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # the opening fence's line (1-based)
    lang: str
    body: str
    mark: Mark | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def is_shell(self) -> bool:
        return self.lang in SHELL_LANGS or any(ln.startswith("$ ") for ln in self.body.splitlines())

    def commands(self) -> list[Command]:
        return parse_commands(self.body, self.line + 1, console=self.lang == "console")


def parse_marks(text: str, where: str) -> Iterator[tuple[int, Mark]]:
    for i, ln in enumerate(text.splitlines(), 1):
        m = MARK.match(ln)
        if not m:
            if "doc-test" in ln or ("illustrative:" in ln and "<!--" in ln):
                raise ValueError(f"{where}:{i}: malformed doc-test markup: {ln.strip()}")
            continue
        if m.group(1) == "illustrative":
            if not m.group(2):
                raise ValueError(f"{where}:{i}: illustrative needs a reason")
            yield i, Mark("illustrative", m.group(2))
            continue
        kind, _, arg = m.group(2).partition(" ")
        if kind not in KINDS:
            raise ValueError(f"{where}:{i}: unknown doc-test kind {kind!r}: one of {sorted(KINDS)}")
        if kind in {"file", "json", "synopsis", "by"} and not arg.strip():
            raise ValueError(f"{where}:{i}: doc-test: {kind} needs an argument")
        yield i, Mark(kind, arg.strip())


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with the markup on the line before it."""
    name = rel(page)
    lines = page.read_text(encoding="utf-8").splitlines()
    marks = dict(parse_marks("\n".join(lines), name))
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang = m.groups()
        j = i + 1
        while j < len(lines) and lines[j].strip() != ticks:
            j += 1
        body = "\n".join(
            ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : j]
        )
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = marks.get(k + 1) if k >= 0 else None
        out.append(Block(name, i + 1, lang, body, mark))
        i = j + 1
    return out


def split_comment(line: str) -> tuple[str, str]:
    """``cmd  # comment`` -> (cmd, comment); a # inside quotes or a word is not a comment."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def parse_commands(body: str, first_line: int, *, console: bool) -> list[Command]:
    lines = body.splitlines()
    out: list[Command] = []
    i = 0
    while i < len(lines):
        raw = lines[i]
        start = first_line + i
        if console:
            if not raw.startswith("$ "):
                i += 1
                continue
            raw = raw[2:]
        if not raw.strip() or raw.lstrip().startswith("#"):
            i += 1
            continue
        text = raw
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        cmd, comment = split_comment(text)
        m = EXIT.match(comment)
        expected = int(m.group(1)) if m else 0
        output: tuple[str, ...] | None = None
        if console:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("$ "):
                j += 1
            shown = lines[i + 1 : j]
            while shown and not shown[-1].strip():
                shown = shown[:-1]
            output = tuple(shown) if shown else None
            i = j
        else:
            i += 1
        out.append(Command(start, " ".join(cmd.split()), expected, output))
    return out


# --------------------------------------------------------------------------- output


def normalize(text: str, subs: Mapping[str, str] = {}) -> list[str]:
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    for a, b in subs.items():
        text = text.replace(a, b)
    return [ln.rstrip() for ln in text.splitlines()]


def output_matches(expected: Sequence[str], actual: Sequence[str]) -> bool:
    """Line by line; a line ``...`` is any number of lines, ``...`` in a line any text."""
    parts = []
    for ln in expected:
        if ln.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*".join(re.escape(p) for p in ln.rstrip().split("...")) + r"\n")
    return re.fullmatch("".join(parts), "".join(a + "\n" for a in actual)) is not None


def output_diff(expected: Sequence[str], actual: Sequence[str]) -> str:
    return "\n".join(difflib.unified_diff(list(expected), list(actual), "doc", "run", lineterm=""))


@dataclass
class Run:
    command: Command
    rc: int
    out: list[str]
    seconds: float


@dataclass
class PageRun:
    """The runnable blocks of one page of one kind, in order, in one working directory."""

    page: str
    runs: list[Run] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


SHELL_STEP = """set +e
if [ -f "$DOC_STATE/env" ]; then . "$DOC_STATE/env"; fi
cd "$(cat "$DOC_STATE/cwd")" || exit 97
{command}
__doc_rc=$?
export -p > "$DOC_STATE/env"; pwd > "$DOC_STATE/cwd"
exit $__doc_rc
"""


def run_page(
    page: Path,
    kind: str,
    workdir: Path,
    env: Mapping[str, str],
    subs: Mapping[str, str] = {},
    timeout: float = 600,
    state: Path | None = None,
) -> PageRun:
    """Run every block of ``page`` marked ``doc-test: KIND`` (files written first, as they come)
    as one terminal session would: each command in its own bash, with the exported variables
    and the directory the previous one left; compare exit status and shown output."""
    import time

    state = state or workdir / ".doc-shell"
    state.mkdir(parents=True, exist_ok=True)
    if not (state / "cwd").exists():
        (state / "cwd").write_text(str(workdir) + "\n")
    result = PageRun(rel(page))
    for b in blocks(page):
        if b.mark is None:
            continue
        if b.mark.kind == "file":
            target = workdir / b.mark.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(b.body + "\n", encoding="utf-8")
            continue
        if b.mark.kind != kind:
            continue
        for c in b.commands():
            t0 = time.monotonic()
            script = state / "step.sh"
            script.write_text(SHELL_STEP.format(command=c.text), encoding="utf-8")
            proc = subprocess.run(
                ["bash", str(script)],
                cwd=workdir,
                env={**env, "DOC_STATE": str(state)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                check=False,
            )
            out = normalize(proc.stdout, subs)
            result.runs.append(Run(c, proc.returncode, out, time.monotonic() - t0))
            where = f"{result.page}:{c.line}: {c.text}"
            if proc.returncode != c.exit:
                tail = "\n".join(out[-30:])
                result.problems.append(
                    f"{where}: exit {proc.returncode}, documented {c.exit}\n{tail}"
                )
            elif c.output is not None and not output_matches(c.output, out):
                result.problems.append(f"{where}: output differs\n{output_diff(c.output, out)}")
    return result


def session_env(state: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The environment a page's session ended with (its exports), for the next page."""
    proc = subprocess.run(
        ["bash", "-c", '. "$DOC_STATE/env" 2>/dev/null; env -0'],
        env={**env, "DOC_STATE": str(state)},
        capture_output=True,
        check=True,
    )
    pairs = (item.split(b"=", 1) for item in proc.stdout.split(b"\0") if b"=" in item)
    skip = {"DOC_STATE", "PWD", "OLDPWD", "SHLVL", "_"}
    return {k.decode(): v.decode() for k, v in pairs if k.decode() not in skip}


def doc_env(extra: Mapping[str, str] = {}) -> dict[str, str]:
    """What a command of the docs runs with: this checkout's venv first on PATH, no colour,
    unbuffered (stdout and stderr in the order a terminal shows them)."""
    import sys

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "PYTEST", "TENSORLESS_", "CONTAINERS_", "XDG_"))
    }
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env |= {"PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env |= dict(extra)
    return env


# --------------------------------------------------------------------------- flags


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command by name; the commands of a group (``gate check``) by both words, beside
    the group itself."""
    out: dict[str, argparse.ArgumentParser] = {}
    for name, p in _children(parser).items():
        out[name] = p
        for sub, q in _children(p).items():
            out[f"{name} {sub}"] = q
    return out


def groups(parser: argparse.ArgumentParser) -> set[str]:
    """The commands that only hold commands of their own (``gate``)."""
    return {name for name, p in _children(parser).items() if _children(p)}


def command_of(words: Sequence[str], commands: Collection[str]) -> str | None:
    """The command the first word names, with a group's second word (``gate check``)."""
    if len(words) >= 2 and f"{words[0]} {words[1]}" in commands:
        return f"{words[0]} {words[1]}"
    return words[0] if words else None


def options(p: argparse.ArgumentParser) -> set[str]:
    return set(p._option_string_actions)


FLAG = re.compile(r"(?<![\w\-/.=])(--?[A-Za-z][\w-]*)")
CODE = re.compile(r"`([^`\n]+)`")


@dataclass(frozen=True)
class FlagUse:
    where: str
    command: str | None  # None: global flags only
    flags: tuple[str, ...]
    text: str


def words_flags(
    words: Sequence[str], commands: Collection[str] = ()
) -> tuple[str | None, list[str]]:
    """The command and the flags of ``tensorless-deploy WORDS`` (shell words; stops at a bare
    ``--``, after which the words are llama-server's). A group's command takes its second word
    (``gate check``) when ``commands`` names it."""
    command: str | None = None
    flags: list[str] = []
    for w in words:
        if w == "--":
            break
        if w.startswith("-") and len(w) > 1:
            flags.append(w.split("=", 1)[0])
        elif command is None and not w.startswith("$"):
            command = w
        elif command is not None and " " not in command and f"{command} {w}" in commands:
            command = f"{command} {w}"
    return command, flags


def text_flags(text: str) -> list[str]:
    """Flags named in a synopsis or a table cell (``[--limit HOST]``, ``(-i INV | --local)``);
    what follows a bare ``--`` is llama-server's."""
    text = re.split(r"(?<![\w-])--(?=[\s\]`)]|$)", text, maxsplit=1)[0]
    return FLAG.findall(text)


def shell_uses(cmd: str) -> list[list[str]]:
    """The word lists following each ``tensorless-deploy`` of a shell command line."""
    try:
        words = shlex.split(cmd, posix=True)
    except ValueError:
        words = cmd.split()
    out: list[list[str]] = []
    cur: list[str] | None = None
    for w in words:
        if w in {"|", "&&", "||", ";", ">", ">>", "2>&1"} or w.startswith((">", "2>")):
            cur = None
            continue
        if os.path.basename(w) == "tensorless-deploy" or w == "tensorless_deploy":
            cur = []
            out.append(cur)
        elif cur is not None:
            cur.append(w)
    return out


def flag_uses(page: Path, commands: set[str]) -> list[FlagUse]:
    """Every place a page names tensorless-deploy flags, with the command they belong to."""
    name = rel(page)
    uses: list[FlagUse] = []
    for b in blocks(page):
        if b.mark is not None and b.mark.kind == "synopsis":
            continue  # checked both ways by synopsis_problems
        if not b.is_shell() and not TOOL.search(b.body):
            continue
        if b.lang not in SHELL_LANGS and not b.is_shell():
            continue
        for c in b.commands():
            for words in shell_uses(c.text):
                if any(w.startswith("[") or w.startswith("(") for w in words):
                    cmd = next((w for w in words if not w.startswith(("-", "[", "("))), None)
                    uses.append(
                        FlagUse(f"{name}:{c.line}", cmd, tuple(text_flags(" ".join(words))), c.text)
                    )
                else:
                    cmd, flags = words_flags(words, commands)
                    uses.append(FlagUse(f"{name}:{c.line}", cmd, tuple(flags), c.text))
    lines = page.read_text(encoding="utf-8").splitlines()
    in_fence = False
    for i, ln in enumerate(lines, 1):
        if FENCE.match(ln):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        spans = CODE.findall(ln.replace("\\|", "|"))
        if ln.lstrip().startswith("|") and spans:
            first = ln.strip().strip("|").split("|")[0]
            head = CODE.findall(first)
            cmd = command_of(head[0].split(), commands) if head else None
            if cmd in commands:
                flags = [f for s in spans for f in text_flags(s)]
                uses.append(FlagUse(f"{name}:{i}", cmd, tuple(flags), ln.strip()))
                continue
        for s in spans:
            words = s.split()
            if not words:
                continue
            if words[0] == "tensorless-deploy":
                words = words[1:]
                while words and words[0].startswith("-"):
                    words = words[1:]
                if not words:
                    continue
            cmd = command_of(words, commands)
            if cmd in commands and len(words) > len(cmd.split()):
                uses.append(FlagUse(f"{name}:{i}", cmd, tuple(text_flags(s)), s))
    return uses


def flag_problems(uses: Sequence[FlagUse], parser: argparse.ArgumentParser) -> list[str]:
    subs = subparsers(parser)
    top = options(parser)
    problems = []
    for u in uses:
        if u.command is not None and u.command not in subs:
            if u.command.isupper() or u.command.startswith(("<", "$")):
                allowed = top
            else:
                problems.append(f"{u.where}: no command {u.command!r}: {u.text}")
                continue
        else:
            allowed = top | (options(subs[u.command]) if u.command else set())
        for f in u.flags:
            if re.fullmatch(r"-v+", f):
                continue
            if f not in allowed:
                where = f"{u.command} " if u.command else ""
                problems.append(f"{u.where}: {where}has no flag {f}: {u.text}")
    return problems


def synopsis_problems(page: Path, parser: argparse.ArgumentParser) -> list[str]:
    subs = subparsers(parser)
    problems = []
    for b in blocks(page):
        if b.mark is None or b.mark.kind != "synopsis":
            continue
        cmd = b.mark.arg
        if cmd not in subs:
            problems.append(f"{b.where}: synopsis of {cmd!r}: no such command")
            continue
        named = set(text_flags(b.body))
        have = options(subs[cmd])
        for f in sorted(named - have - GLOBAL_FLAGS):
            problems.append(f"{b.where}: synopsis of {cmd}: {cmd} has no flag {f}")
        for action in subs[cmd]._actions:
            strings = set(action.option_strings)
            if (
                strings
                and not strings & (named | {"-h", "--help"})
                and action.help != argparse.SUPPRESS
            ):
                problems.append(f"{b.where}: synopsis of {cmd} lacks {'/'.join(sorted(strings))}")
    return problems


# --------------------------------------------------------------------------- exit codes

# Where a page's prose speaks of one command: the page itself, or its sections.
PAGE_COMMANDS = {"docs/doctor.md": "doctor", "docs/plan.md": "plan", "docs/prepare.md": "prepare"}
SECTION = re.compile(r"^#{2,}\s+`?([a-z]+(?: [a-z]+)?)`?[\s:]")
EXIT_CLAUSE = re.compile(
    r"(?i)(?<![\w.])exit(?:s)?(?: codes?| status(?:es)?)?\b(.*?)(?:\.(?:\s|$)|$)"
)
CODE_NUM = re.compile(r"(?:^|[\s(,;:])\**(\d{1,3})\**(?=[\s,;)]|$)")


@dataclass(frozen=True)
class ExitClaim:
    where: str
    command: str | None  # None: every command
    codes: tuple[int, ...]
    text: str


def exit_claims(page: Path, commands: set[str]) -> list[ExitClaim]:
    """The exit statuses a page promises, each with the command it promises them for: a row of
    a command table, the page's own command, the command a section is about; a sentence about
    every command ("Exit codes: ...") in docs/commands.md's preamble."""
    name = rel(page)
    claims: list[ExitClaim] = []
    section: str | None = PAGE_COMMANDS.get(name)
    in_fence = False
    para: list[tuple[int, str]] = []

    def flush(cmd: str | None) -> None:
        if not para:
            return
        text = " ".join(t for _, t in para)
        for m in EXIT_CLAUSE.finditer(text.replace("`", "")):
            codes = tuple(int(n) for n in CODE_NUM.findall(m.group(1)))
            if codes:
                claims.append(ExitClaim(f"{name}:{para[0][0]}", cmd, codes, m.group(0)[:120]))
        para.clear()

    for i, ln in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(ln):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        m = SECTION.match(ln)
        if m:
            flush(section)
            said = m.group(1) if m.group(1) in commands else m.group(1).split()[0]
            section = said if said in commands else PAGE_COMMANDS.get(name)
            continue
        if ln.lstrip().startswith("|"):
            flush(section)
            cells = ln.strip().strip("|").split("|")
            head = CODE.findall(cells[0]) if cells else []
            cmd = command_of(head[0].split(), commands) if head else None
            if cmd in commands:
                para.append((i, " ".join(cells[1:])))
                flush(cmd)
            continue
        if not ln.strip():
            flush(section)
            continue
        if name == "docs/commands.md" and section is None:
            para.append((i, ln))  # the preamble: every command
            continue
        para.append((i, ln))
    flush(section)
    return [c for c in claims if c.command is not None or name == "docs/commands.md"]


def _ints(node: ast.AST, env: Mapping[str, Any]) -> set[int] | None:
    """The int values an expression can have: constants, both arms of ``a if c else b``, module
    constants; None when it is something else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return {node.value}
    if isinstance(node, ast.IfExp):
        a, b = _ints(node.body, env), _ints(node.orelse, env)
        return None if a is None or b is None else a | b
    if isinstance(node, ast.Name) and isinstance(env.get(node.id), int):
        return {int(env[node.id])}
    return None


def returned_codes(fn: Callable[..., Any], depth: int = 2) -> set[int]:
    """Every int ``fn`` can return, read from its source: literal returns, and a returned name
    assigned from a call of a function it imports or sees (one more level)."""
    src = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(src)
    env: dict[str, Any] = dict(fn.__globals__)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            mod = __import__(node.module, fromlist=["_"])
            for a in node.names:
                env[a.asname or a.name] = getattr(mod, a.name, None)
    assigned: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            t = node.targets[0]
            if isinstance(t, ast.Name):
                assigned[t.id] = node.value
    codes: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        found = _ints(node.value, env)
        if found is not None:
            codes |= found
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in assigned:
            value = assigned[value.id]
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and depth > 0:
            target = env.get(value.func.id)
            if callable(target) and getattr(target, "__module__", "").startswith("tensorless"):
                codes |= returned_codes(target, depth - 1)
    return codes


def command_codes(parser: argparse.ArgumentParser) -> dict[str, set[int]]:
    """What each command can exit with: its handler's returns, 1 for a refusal (TensorlessError)
    and 2 for a usage error (UsageError, argparse), and what main returns for any of them (an
    interrupt, a closed stdout), in every command."""
    out = {}
    for name, p in subparsers(parser).items():
        handler = p._defaults.get("handler")
        codes = returned_codes(handler) if handler is not None else set()
        out[name] = codes | {1, 2, *EVERY_COMMAND}
    return out


# What main returns for any command
EVERY_COMMAND = (EXIT_INTERRUPTED, EXIT_PIPE_CLOSED)


def exit_problems(claims: Sequence[ExitClaim], codes: Mapping[str, set[int]]) -> list[str]:
    problems = []
    for c in claims:
        for code in c.codes:
            if c.command is None:
                bad = [n for n, have in codes.items() if code not in have and code != 0]
                if code not in {0, 1, 2, *EVERY_COMMAND} or bad:
                    problems.append(f"{c.where}: exit {code} promised for every command: {c.text}")
            elif c.command not in codes:
                problems.append(f"{c.where}: exit {code} for unknown command {c.command}")
            elif code not in codes[c.command] and code != 0:
                problems.append(
                    f"{c.where}: {c.command} never exits {code} (it can: "
                    f"{sorted(codes[c.command] | {0})}): {c.text}"
                )
    promised: dict[str, set[int]] = {}
    for c in claims:
        if c.command is not None:
            promised.setdefault(c.command, set()).update(c.codes)
    every = {code for c in claims if c.command is None for code in c.codes}
    for name, have in codes.items():
        for code in sorted(have - {0, 1, 2}):
            if code not in promised.get(name, set()) | every:
                problems.append(f"{name} can exit {code}: no page says when")
    return problems


# --------------------------------------------------------------------------- JSON keys


def _type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "list"
    return "object"


def json_problems(doc: Any, samples: Sequence[Any], path: str = "") -> list[str]:
    """The documented JSON ``doc`` against real values ``samples`` at the same place (from one
    run or several): a key shown must exist in some sample with a value of the type shown, a
    list's elements each match some element of the samples' lists."""
    here = path or "(top)"
    if isinstance(doc, dict):
        objs = [s for s in samples if isinstance(s, dict)]
        if not objs:
            return [
                f"{here}: documented an object, runs gave {sorted({_type(s) for s in samples})}"
            ]
        out = []
        for k, v in doc.items():
            if k == "...":
                continue
            values = [o[k] for o in objs if k in o]
            if not values:
                out.append(f"{path}.{k}: documented, in no run")
                continue
            out += json_problems(v, values, f"{path}.{k}")
        return out
    if isinstance(doc, list):
        lists = [s for s in samples if isinstance(s, list)]
        if not lists:
            return [f"{here}: documented a list, runs gave {sorted({_type(s) for s in samples})}"]
        items = [x for s in lists for x in s]
        out = []
        for n, d in enumerate(doc):
            if not items:
                out.append(f"{here}[{n}]: documented an element, every run's list was empty")
                continue
            out += json_problems(d, items, f"{path}[]")
        return out
    kinds = {_type(s) for s in samples}
    if doc == "..." and kinds - {"list", "object"}:
        return []
    if _type(doc) not in kinds:
        return [f"{here}: documented {_type(doc)} ({doc!r}), runs gave {sorted(kinds)}"]
    return []


def json_blocks(page: Path) -> list[tuple[Block, Any]]:
    out = []
    for b in blocks(page):
        if b.mark is not None and b.mark.kind == "json":
            out.append((b, json.loads(b.body)))
    return out
