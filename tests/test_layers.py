"""The layer rule of docs/architecture.md: a module imports only its own folder and the layers
below it. Every module of the package is read with ``ast`` (imports at any depth, inside
functions too, and ``importlib.import_module`` of a literal name); imports under
``if TYPE_CHECKING:`` are for the type checker only and do not count."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "tensorless_deploy"
ROOT = REPO / PACKAGE
DOC = REPO / "docs" / "architecture.md"

# THE table: lowest layer first. Each row: the layer's name and its members, the folders and
# flat modules (without .py) directly under tensorless_deploy/. docs/architecture.md states the
# same rows in the same order (test_table_matches_architecture_doc).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("__init__", "errors", "hub", "shell")),
    ("recipe", ("recipe",)),
    ("facts", ("facts",)),
    ("gguf", ("gguf",)),
    ("decisions", ("decisions",)),
    ("launch", ("launch",)),
    ("hostplan", ("hostplan",)),
    ("operations", ("operations",)),
    ("local", ("local",)),
    ("fleet", ("fleet",)),
    ("cli", ("cli",)),
    ("entry point", ("__main__",)),
)
# Layers the command line skips: it decides nothing of its own, so it reaches what runs on hosts
# (launch/, operations/, facts/) only through the fleet, local and host-plan layers, whose
# answers it prints. (decisions/ and gguf/ stay open to it: flags checked, headers read.)
CLI = "cli"
CLI_SKIPS = ("launch", "operations", "facts")
# Flat modules allowed without counting: the package, its entry point, the exception tree.
FLAT_FREE = {"__init__", "__main__", "errors"}
MAX_OTHER_FLAT = 2

# Known debt: imports that break the rule today, as (module file, imported module) -> why it is
# still there. Each entry is a violation someone owes a fix for; a listed import that no longer
# breaks the rule fails test_allow_list_is_current, so the list only shrinks. Empty: the tree
# keeps the rule.
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    file: str  # relative to the repository
    line: int
    source: str  # dotted module doing the import
    target: str  # dotted module imported


@dataclass(frozen=True)
class Violation:
    imp: Import
    why: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.imp.file, self.imp.target)

    def __str__(self) -> str:
        return f"{self.imp.file}:{self.imp.line}: imports {self.imp.target} ({self.why})"


def rank_of() -> dict[str, int]:
    return {member: rank for rank, (_, members) in enumerate(LAYERS) for member in members}


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(dotted: str, root: Path) -> bool:
    rel = Path(*dotted.split(".")[1:]) if "." in dotted else Path()
    base = root / rel
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` except the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield child
        yield from _runtime_nodes(child)


def _literal_prefix(arg: ast.expr) -> str | None:
    """The module an ``import_module`` argument names: a literal, or an f-string's literal
    start up to its last dot (``f"pkg.cli.{name}"`` -> ``pkg.cli``)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        first = arg.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value.rpartition(".")[0] or None
    return None


def imports_of(path: Path, root: Path, repo: Path) -> list[Import]:
    """The package-internal imports of one module file, resolved to dotted module names."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    source = module_name(path, root)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    top = root.name
    rel = str(path.relative_to(repo))
    out: list[Import] = []

    def add(target: str, node: ast.stmt | ast.expr) -> None:
        if target == top or target.startswith(top + "."):
            out.append(Import(rel, node.lineno, source, target))

    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                add(sub if is_module(sub, root) else module, node)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in {"import_module", "__import__"} and node.args:
                target = _literal_prefix(node.args[0])
                if target:
                    add(target, node)
    return out


def member_of(dotted: str) -> str:
    """The folder or flat module directly under the package (the package itself: __init__)."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def is_folder(member: str, root: Path) -> bool:
    return (root / member).is_dir()


def violations(imports: list[Import], root: Path) -> list[Violation]:
    ranks = rank_of()
    out: list[Violation] = []
    for imp in imports:
        src, dst = member_of(imp.source), member_of(imp.target)
        if src not in ranks or dst not in ranks:
            continue  # reported by test_every_module_is_in_a_layer
        if ranks[dst] > ranks[src]:
            why = f"layer {LAYERS[ranks[dst]][0]} is above {LAYERS[ranks[src]][0]}"
            out.append(Violation(imp, why))
        elif (
            ranks[dst] == ranks[src]
            and src != dst
            and (is_folder(src, root) or is_folder(dst, root))
        ):
            # flat modules of one rank (the base) are one layer; two folders never are
            why = f"sideways: {src} and {dst} are both layer {LAYERS[ranks[src]][0]}"
            out.append(Violation(imp, why))
    return out


def package_modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def all_imports(root: Path = ROOT, repo: Path = REPO) -> list[Import]:
    return [imp for p in package_modules(root) for imp in imports_of(p, root, repo)]


# --- the package as it is --------------------------------------------------------------------


def test_no_import_breaks_the_layer_rule() -> None:
    found = violations(all_imports(), ROOT)
    new = [str(v) for v in found if v.key not in ALLOWED]
    assert not new, "imports against docs/architecture.md's layers:\n" + "\n".join(new)


def cli_shortcuts(imports: list[Import]) -> list[str]:
    """The imports by cli/ of a layer it must reach through fleet/, local/ or hostplan/."""
    return [
        f"{imp.file}:{imp.line}: imports {imp.target} (cli/ goes through fleet, local or hostplan)"
        for imp in imports
        if member_of(imp.source) == CLI and member_of(imp.target) in CLI_SKIPS
    ]


def test_cli_reaches_hosts_only_through_the_layers_that_decide() -> None:
    found = sorted(set(cli_shortcuts(all_imports())))
    assert not found, "\n".join(found)


def test_cli_shortcut_is_caught(tmp_path: Path) -> None:
    """The rule fails on an import it forbids, at any depth (inside a function too)."""
    root = tmp_path / PACKAGE
    (root / "cli").mkdir(parents=True)
    (root / "launch").mkdir()
    for f in ("__init__.py", "cli/__init__.py", "launch/__init__.py", "launch/spec.py"):
        (root / f).write_text("")
    (root / "cli" / "x.py").write_text(
        "def f() -> None:\n    from tensorless_deploy.launch.spec import y\n"
    )
    found = cli_shortcuts(all_imports(root, tmp_path))
    assert found == [
        f"{PACKAGE}/cli/x.py:2: imports {PACKAGE}.launch.spec (cli/ goes through fleet, local or "
        "hostplan)"
    ]


def test_allow_list_is_current() -> None:
    found = {v.key for v in violations(all_imports(), ROOT)}
    fixed = [f"{f}: {t}" for f, t in ALLOWED if (f, t) not in found]
    assert not fixed, "no longer a violation, drop it from ALLOWED:\n" + "\n".join(fixed)


def test_every_module_is_in_a_layer() -> None:
    ranks = rank_of()
    lost = [
        str(p.relative_to(REPO))
        for p in package_modules()
        if member_of(module_name(p, ROOT)) not in ranks
    ]
    assert not lost, "in no layer of LAYERS (add it to the table and docs/architecture.md):\n" + (
        "\n".join(lost)
    )


def test_every_table_member_exists() -> None:
    missing = [
        m
        for _, members in LAYERS
        for m in members
        if not (ROOT / m).is_dir() and not (ROOT / f"{m}.py").is_file()
    ]
    assert not missing, f"in LAYERS but not in {PACKAGE}/: {missing}"


def test_at_most_two_other_flat_modules() -> None:
    flat = sorted(p.stem for p in ROOT.glob("*.py") if p.stem not in FLAT_FREE)
    assert len(flat) <= MAX_OTHER_FLAT, (
        f"flat modules beside {sorted(FLAT_FREE)}: {flat}; at most {MAX_OTHER_FLAT} (put the rest "
        "in a layer's folder)"
    )


def doc_layers(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """The rows of the table under '## Layers': (layer, members in backticks), by rank."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows: list[tuple[int, str, tuple[str, ...]]] = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        members = tuple(
            m.removesuffix("/").removesuffix(".py") for m in re.findall(r"`([^`]+)`", cells[2])
        )
        rows.append((int(cells[0]), cells[1], members))
    assert [r for r, _, _ in rows] == list(range(len(rows))), "ranks must run 0, 1, 2, ..."
    return [(name, members) for _, name, members in rows]


def test_table_matches_architecture_doc() -> None:
    ours = [(name, tuple(sorted(members))) for name, members in LAYERS]
    theirs = [(name, tuple(sorted(members))) for name, members in doc_layers(DOC.read_text())]
    assert ours == theirs, f"LAYERS here and the table in {DOC.relative_to(REPO)} differ"


def test_scanner_sees_the_package() -> None:
    # the scanner is not blind: imports known to exist are found, at module and function level
    targets = {(i.source, i.target) for i in all_imports()}
    assert (f"{PACKAGE}.__main__", f"{PACKAGE}.cli") in targets
    assert any(
        s.startswith(f"{PACKAGE}.cli.") and t.startswith(f"{PACKAGE}.fleet.") for s, t in targets
    )


# --- the checker itself, on a made-up package ------------------------------------------------


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    root = tmp_path / PACKAGE
    for folder in ("recipe", "facts", "gguf", "cli"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "errors.py").write_text("")
    return root


def _check(root: Path, rel: str, code: str) -> list[str]:
    path = root / rel
    path.write_text(code)
    return [str(v) for v in violations(imports_of(path, root, root.parent), root)]


def test_checker_flags_upward_import_in_a_function(fake: Path) -> None:
    code = "def f():\n    from tensorless_deploy.cli import x\n"
    assert _check(fake, "recipe/a.py", code) == [
        f"{PACKAGE}/recipe/a.py:2: imports {PACKAGE}.cli (layer cli is above recipe)"
    ]


def test_checker_ignores_type_checking_only(fake: Path) -> None:
    code = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from tensorless_deploy.cli import x\n"
        "else:\n    import tensorless_deploy.facts\n"
    )
    assert _check(fake, "recipe/a.py", code) == [
        f"{PACKAGE}/recipe/a.py:5: imports {PACKAGE}.facts (layer facts is above recipe)"
    ]


def test_checker_resolves_relative_and_submodule_imports(fake: Path) -> None:
    (fake / "facts" / "b.py").write_text("")
    assert _check(fake, "facts/a.py", "from . import b\nfrom .b import c\n") == []
    assert _check(fake, "recipe/a.py", "from ..facts import b\n") == [
        f"{PACKAGE}/recipe/a.py:1: imports {PACKAGE}.facts.b (layer facts is above recipe)"
    ]
    assert _check(fake, "facts/c.py", "from tensorless_deploy import errors, recipe\n") == []


def test_checker_flags_sideways_and_dynamic_imports(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        f"{__name__}.LAYERS", (("base", ("__init__", "errors")), ("mid", ("recipe", "facts")))
    )
    assert _check(
        fake,
        "recipe/a.py",
        "import importlib\nimportlib.import_module('tensorless_deploy.facts')\n",
    ) == [
        f"{PACKAGE}/recipe/a.py:2: imports {PACKAGE}.facts (sideways: recipe and facts are both "
        "layer mid)"
    ]


def test_doc_parser_reads_ranked_rows() -> None:
    text = (
        "x\n## Layers\n\n| rank | layer | where |\n|---|---|---|\n| 0 | base | `a.py`, `b.py` |\n"
    )
    text += "| 1 | top | `c/` |\n\n## Next\n| 5 | no | `z` |\n"
    assert doc_layers(text) == [("base", ("a", "b")), ("top", ("c",))]


def unnamed_modules(text: str, root: Path = ROOT) -> list[str]:
    """The modules of each layer folder that its row of the doc's table does not name (as
    `module.py`): a module nobody wrote down is one a reader cannot find a place for."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].isdigit():
            for folder in re.findall(r"`([^`]+)/`", cells[2]):
                rows[folder] = cells[3]
    return [
        f"{folder}/{module.name}"
        for folder in sorted(p.name for p in root.iterdir() if (p / "__init__.py").is_file())
        for module in sorted((root / folder).glob("*.py"))
        if module.stem != "__init__" and f"`{module.name}`" not in rows.get(folder, "")
    ]


def test_architecture_doc_names_every_module() -> None:
    missing = unnamed_modules(DOC.read_text())
    assert not missing, (
        f"{DOC.relative_to(REPO)}: the layer table's row of each folder names its modules "
        "(`name.py`: what it holds); not named:\n" + "\n".join(missing)
    )
