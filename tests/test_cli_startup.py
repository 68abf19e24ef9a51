"""Start-up: a command line builds only its own command's parsers, and ``models`` lists the
catalog from the validated-catalog cache without importing pydantic or the schema, while every
change to a recipe file (or to the validating code) loads the catalog in full again."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy import cli
from tensorless_deploy.hub import controller_state_dir
from tensorless_deploy.recipe import index, load_catalog
from tests.recipe_tools import example, write_recipe

REPO = Path(__file__).resolve().parent.parent


def test_the_command_table_is_what_each_module_registers() -> None:
    seen: dict[str, str] = {}
    for module in cli.COMMAND_MODULES:
        names: list[str] = []

        def command(name: str, help_: str, handler: Any, names: list[str] = names) -> Any:
            names.append(name)
            return argparse.ArgumentParser()

        __import__(f"tensorless_deploy.cli.{module}", fromlist=["register"]).register(command)
        seen.update({n: module for n in names})
    assert seen == cli.COMMANDS


@pytest.mark.parametrize(
    ("words", "module"),
    [
        (["models", "--json"], "catalog"),
        (["--json", "-v", "models"], "catalog"),
        (["deploy", "-i", "inv.py", "pn3"], "deploy"),
        (["logs", "-i", "inv.py"], "status"),
        (["--help"], None),
        (["-h", "models"], None),
        ([], None),
        (["no-such-command"], None),
        (["--version"], None),
    ],
)
def test_which_module_a_command_line_needs(words: list[str], module: str | None) -> None:
    assert cli.command_module(words) == module


def test_one_command_builds_only_its_own_parsers() -> None:
    parser = cli.build_parser(["models", "--json"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"check", "models", "info"}
    args = parser.parse_args(["models", "--json"])
    assert args.json is True and args.command == "models"
    full = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(full.choices) == set(cli.COMMANDS)


def test_the_cache_lives_where_the_controller_keeps_its_state(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert index._cache_dir() == Path(controller_state_dir()) / "catalog"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert index._cache_dir() == Path(controller_state_dir()) / "catalog"


PROBE = (
    "import sys, io, contextlib; from tensorless_deploy.cli import main; out = io.StringIO()\n"
    "with contextlib.redirect_stdout(out): rc = main(sys.argv[1:])\n"
    "print(__import__('json').dumps({'rc': rc, 'out': out.getvalue(), "
    "'pydantic': 'pydantic' in sys.modules, 'schema': 'tensorless_deploy.recipe.schema' in "
    "sys.modules}))"
)


def _models(recipes: Path, cache: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "models", "--json", "--recipes", str(recipes)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
    )
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return doc


def test_models_reads_the_cache_without_pydantic_and_any_change_loads_in_full(
    tmp_path: Path,
) -> None:
    recipes, cache = tmp_path / "recipes", tmp_path / "cache"
    data = example()
    write_recipe(recipes, data)
    first = _models(recipes, cache)
    assert first["rc"] == 0 and first["pydantic"]  # nothing cached yet: the full load
    rows = json.loads(first["out"])
    catalog = load_catalog(recipes)
    assert rows == [
        {
            "hf_repo": e.recipe.model.hf_repo,
            "name": e.recipe.model.name,
            "title": e.recipe.model.title,
            "card": e.recipe.card.id,
            "state": e.recipe.state,
            "path": e.path,
        }
        for e in catalog.entries
    ]
    second = _models(recipes, cache)
    assert second["out"] == first["out"]
    assert not second["pydantic"] and not second["schema"]  # from the cache
    # an edited recipe misses the cache: validated in full, listed as it now is
    data["model"]["title"] = "renamed"
    write_recipe(recipes, data)
    third = _models(recipes, cache)
    assert third["pydantic"] and json.loads(third["out"])[0]["title"] == "renamed"
    assert not _models(recipes, cache)["pydantic"]
    # an invalid recipe is refused as before, and never cached
    write_recipe(recipes, {**data, "schema": 2})
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "tensorless_deploy", "models", "--recipes", str(recipes)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env={**os.environ, "XDG_CACHE_HOME": str(cache)},
        )
        assert proc.returncode == 1 and "schema" in proc.stderr
    # a new file misses too
    write_recipe(recipes, data)
    other = example()
    other["card"]["id"] = "h200"
    other["card"]["compute_capability"] = "9.0"
    write_recipe(recipes, other)
    fourth = _models(recipes, cache)
    assert fourth["pydantic"] and len(json.loads(fourth["out"])) == 2


def test_a_cache_written_by_someone_else_is_not_trusted(tmp_path: Path) -> None:
    recipes, cache = tmp_path / "recipes", tmp_path / "cache"
    write_recipe(recipes, example())
    _models(recipes, cache)
    (written,) = (cache / "tensorless-deploy" / "catalog").glob("*.json")
    doc = json.loads(written.read_text())
    doc["rows"][0]["card"] = 7  # a row whose keys are right stays: the key names the bytes
    doc["key"] = "0" * 64  # but not one whose key is not its name
    written.write_text(json.dumps(doc))
    again = _models(recipes, cache)
    assert again["pydantic"] and json.loads(again["out"])[0]["card"] != 7
