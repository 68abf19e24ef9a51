"""The @deploy that serves one recipe on one host, from a plan the controller made for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyinfra.api.deploy import deploy
from pyinfra.context import host

from tensorless_deploy.hub import CachePaths
from tensorless_deploy.launch.render import UnitFile
from tensorless_deploy.launch.spec import LaunchSpec
from tensorless_deploy.operations.operations import (
    image_pulled,
    model_file,
    serving,
    unit_installed,
)

STEPS = ("image", "model", "unit", "restart", "serving")


@dataclass(frozen=True)
class HostPlan:
    """Everything one host needs, decided on the controller before any command runs."""

    host: str
    recipe_path: str
    recipe_digest: str
    spec: LaunchSpec
    unit: UnitFile
    engine_bin: str
    quadlet_bin: str | None
    paths: CachePaths
    url: str
    sha256: str
    size: int
    transfer: str = "pull"  # or "push": the controller sends model and image
    archive: str | None = None  # where a pushed image archive lands on the host


@deploy("tensorless-deploy: serve a recipe")
def serve_recipe(plan: HostPlan, token: str | None, steps: dict[str, dict[str, Any]]) -> None:
    """image by digest -> verified model -> unit -> (re)start -> /health, each step's
    OperationMeta kept in steps[host][name] for the report."""
    metas: dict[str, Any] = {}
    pushed = plan.transfer == "push"
    metas["image"] = image_pulled(
        name="engine image by digest",
        engine_bin=plan.engine_bin,
        image=plan.spec.image,
        archive=plan.archive if pushed else None,
    )
    metas["model"] = model_file(
        name="model file, sha256-verified",
        paths=plan.paths,
        url=plan.url,
        sha256=plan.sha256,
        size=plan.size,
        token=None if pushed else token,
        pushed=pushed,
    )
    unit = unit_installed(name="unit file", unit=plan.unit, quadlet_bin=plan.quadlet_bin)
    metas["unit"] = unit
    metas["restart"] = serving(
        name="restart and /health",
        unit=plan.unit,
        health_url=plan.spec.health_url,
        timeout_s=plan.spec.start_timeout_s,
        restart=True,
        _if=unit.did_change,
    )
    metas["serving"] = serving(
        name="running and /health",
        unit=plan.unit,
        health_url=plan.spec.health_url,
        timeout_s=plan.spec.start_timeout_s,
        restart=False,
        _if=unit.did_not_change,
    )
    steps[host.name] = metas
