"""The launcher's own llama-server flags are one table (recipe.flags.LAUNCHER): the argv the
launcher writes (launch.spec), the refusal of every spelling (recipe.flags: in a recipe's args
and env, after --) and the read-back of a deployed unit (launch.read) all come from its rows.
A flag written but not refused would let a run's second value win (the last one does) while the
labels say the launcher's: `export pn3 --format podman-kube -- --metrics` served /metrics under
a label saying metrics "false" (issue 26)."""

from __future__ import annotations

import pytest

from tensorless_deploy.decisions.options import Flags, check_flags
from tensorless_deploy.errors import UsageError
from tensorless_deploy.launch import spec as spec_module
from tensorless_deploy.launch.read import (
    ACCESS_SWITCHES,
    ACCESS_WITH_VALUE,
    ADDRESS_FLAGS,
    CONTEXT_FLAG,
    read_unit,
)
from tensorless_deploy.launch.render import render_quadlet, render_service
from tensorless_deploy.launch.spec import LaunchSpec, build_launch_spec, launcher_args
from tensorless_deploy.recipe.flags import (
    FORBIDDEN,
    LAUNCHER,
    OWNED,
    LaunchFlag,
    arg_problem,
    env_problem,
    extra_args_problem,
    flag_of,
)
from tensorless_deploy.recipe.schema import Recipe
from tests.recipe_tools import example

EXTRA = ("--temp", "0.5")
IDS = [r.written for r in LAUNCHER]


def _spec(**given: object) -> tuple[Recipe, LaunchSpec]:
    recipe = Recipe.model_validate(example())
    kwargs: dict[str, object] = {
        "engine": "podman",
        "model_path": "/var/lib/models/m.gguf",
        "gpu_uuids": ["GPU-0"],
        "cpus": 8,
        "extra_args": EXTRA,
        "api_key": True,
        "tls": True,
        "metrics": True,
        "cors_origins": "https://ui.example.net",
        **given,
    }
    return recipe, build_launch_spec(recipe, **kwargs)  # type: ignore[arg-type]


def test_the_rows_are_distinct_and_spelled_as_their_option() -> None:
    assert len({r.sets for r in LAUNCHER}) == len(LAUNCHER)
    assert len({r.flag for r in LAUNCHER}) == len(LAUNCHER)
    for r in LAUNCHER:
        assert r.written in r.flag.spellings, r


def test_every_row_is_in_the_argv_and_nothing_else_of_the_launchers() -> None:
    recipe, spec = _spec()
    n = len(spec.server_args) - len(recipe.run.args) - len(EXTRA)
    launcher, rest = spec.server_args[:n], spec.server_args[n:]
    assert rest == (*recipe.run.args, *EXTRA)
    assert [a for a in launcher if a.startswith("-")] == [r.written for r in LAUNCHER]
    for arg in launcher:  # every flag of the launcher's part is a row, each value follows one
        row = flag_of(arg)
        assert row is None or any(r.flag is row for r in LAUNCHER), arg
    assert spec.server_args.count("--metrics") == 1


@pytest.mark.parametrize("row", LAUNCHER, ids=IDS)
def test_every_row_is_refused_in_every_spelling_and_twin(row: LaunchFlag) -> None:
    assert (row.flag in OWNED) != (row.flag in FORBIDDEN)
    for spelled in (*row.flag.spellings, *(f"{s}=1" for s in row.flag.spellings)):
        assert arg_problem(spelled) is not None, spelled
        assert extra_args_problem([spelled, "1"], {}) is not None, spelled
        with pytest.raises(UsageError):  # deploy, run, export: -- SPELLING
            check_flags(Flags(extra_args=("-fa", "on", spelled, "1")))
    for name in row.flag.env:
        assert env_problem(name) is not None, name


@pytest.mark.parametrize("kind", ["quadlet", "service"])
def test_every_row_is_read_back_from_the_unit(kind: str) -> None:
    recipe, spec = _spec()
    if kind == "quadlet":
        unit = render_quadlet(spec, digest="sha256:" + "0" * 64, notify_healthy=True)
    else:
        unit = render_service(spec, digest="sha256:" + "0" * 64, engine_bin="/usr/bin/podman")
    content = read_unit(unit.path, unit.content)
    assert content.server_args == spec.server_args
    assert content.recipe_args() == (*recipe.run.args, *EXTRA)  # no launcher flag leaks in
    access = content.access()
    for r in LAUNCHER:
        if r.switch:
            assert r.written in ACCESS_SWITCHES and r.written in access
            continue
        value = content.flag(r.written)
        assert value is not None, r.written
        assert {
            "address": r.written in ADDRESS_FLAGS,
            "context": r.written == CONTEXT_FLAG,
            "access": f"{r.written} {value}" in access and r.written in ACCESS_WITH_VALUE,
            "model": value == spec.model_mount,
            "launcher": r.written not in (*ADDRESS_FLAGS, CONTEXT_FLAG, *ACCESS_WITH_VALUE),
        }[r.read], r


def test_operator_options_off_leave_their_flags_out() -> None:
    _, spec = _spec(api_key=False, tls=False, metrics=False)
    for absent in ("--api-key-file", "--ssl-cert-file", "--ssl-key-file", "--metrics"):
        assert absent not in spec.server_args


@pytest.mark.parametrize("row", LAUNCHER, ids=IDS)
def test_a_row_removed_from_the_table_fails_the_launch(
    row: LaunchFlag, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher cannot go on writing a flag whose row is gone (no longer refused, no longer
    read back): the values it passes name the table's rows exactly."""
    monkeypatch.setattr(spec_module, "LAUNCHER", tuple(r for r in LAUNCHER if r is not row))
    with pytest.raises(ValueError, match=row.sets):
        _spec()


def test_a_value_of_the_wrong_kind_is_refused() -> None:
    values: dict[str, str | bool | None] = {r.sets: "x" for r in LAUNCHER}
    with pytest.raises(TypeError, match="--metrics"):
        launcher_args(values)
    values["metrics"] = True
    values["port"] = True
    with pytest.raises(TypeError, match="--port"):
        launcher_args(values)
    with pytest.raises(ValueError, match="extra"):
        launcher_args({**values, "extra": "x"})


def test_metrics_after_the_double_dash_is_refused_by_its_row() -> None:
    """The --metrics gap closes by construction: what refuses it is the row the argv is
    written from."""
    (row,) = (r for r in LAUNCHER if r.written == "--metrics")
    assert flag_of("--metrics") is row.flag and row.flag in OWNED
    with pytest.raises(UsageError, match="the launcher sets --metrics itself; use --metrics"):
        check_flags(Flags(extra_args=("--metrics",), offered=frozenset({"metrics"})))
    assert "the launcher sets --metrics" in (arg_problem("--metrics") or "")
