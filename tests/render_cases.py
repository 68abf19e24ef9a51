"""The golden unit-file cases (tests/golden/<case>/): each folder holds ``input.json`` and the exact
unit files that input renders to. Shared by tests/test_render_golden.py (byte comparison) and
tests/test_units_hosts.py (real quadlet and systemd-analyze on a test host).

input.json keys:
  run       merged into the example recipe's [run] BEFORE validation (what a recipe may say)
  raw_run   set on the validated recipe's [run] AFTER validation (model_copy: the recipe rules
            are bypassed, so the renderer alone is exercised, e.g. an alias no recipe may have)
  spec      keyword arguments of build_launch_spec (engine, model_path, gpu_uuids, cpus, port,
            bind, context, extra_args)
  render    {"kind": "quadlet", "notify_healthy": bool} or {"kind": "service", "engine_bin": ...},
            either with "restart_backoff": bool (the host's systemd has RestartSteps=)
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorless_deploy.launch.render import UnitFile, render_quadlet, render_service
from tensorless_deploy.launch.spec import LaunchSpec, build_launch_spec
from tensorless_deploy.recipe.catalog import recipe_digest
from tensorless_deploy.recipe.schema import Recipe
from tests.recipe_tools import example

GOLDEN = Path(__file__).resolve().parent / "golden"
INPUT = "input.json"


@dataclass(frozen=True)
class Case:
    name: str
    folder: Path
    data: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.data["render"]["kind"])


def cases() -> list[Case]:
    return [
        Case(d.name, d, json.loads((d / INPUT).read_text(encoding="utf-8")))
        for d in sorted(GOLDEN.iterdir())
        if (d / INPUT).is_file()
    ]


def recipe_for(data: dict[str, Any]) -> Recipe:
    raw = example()
    raw["run"].update(data.get("run", {}))
    recipe = Recipe.model_validate(raw)
    if "raw_run" in data:
        run = recipe.run.model_copy(update=data["raw_run"])
        recipe = recipe.model_copy(update={"run": run})
    return recipe


def spec_for(data: dict[str, Any], recipe: Recipe | None = None) -> LaunchSpec:
    kw = dict(data["spec"])
    kw["gpu_uuids"] = tuple(kw.get("gpu_uuids", ()))
    kw["extra_args"] = tuple(kw.get("extra_args", ()))
    return build_launch_spec(recipe or recipe_for(data), **kw)


def render_case(data: dict[str, Any]) -> list[UnitFile]:
    """The unit files one input renders to (one today; a list so a case may grow)."""
    recipe = recipe_for(data)
    spec = spec_for(data, recipe)
    digest = recipe_digest(recipe)
    how = data["render"]
    backoff = bool(how.get("restart_backoff", False))
    if how["kind"] == "quadlet":
        notify = bool(how["notify_healthy"])
        return [render_quadlet(spec, digest=digest, notify_healthy=notify, restart_backoff=backoff)]
    return [
        render_service(
            spec, digest=digest, engine_bin=str(how["engine_bin"]), restart_backoff=backoff
        )
    ]


def rendered_files(data: dict[str, Any]) -> dict[str, str]:
    """{file name in the case folder: content}."""
    return {posixpath.basename(u.path): u.content for u in render_case(data)}
