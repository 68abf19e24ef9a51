"""Golden unit files: every tests/golden/<case>/input.json renders to exactly the unit files next
to it (no file missing, none extra, byte for byte).

Regenerate after an intended change of the templates or the launch spec, then review the diff:

    TENSORLESS_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_render_golden.py

(the regeneration run rewrites each case folder's unit files, deletes stale ones, and fails so
that a regeneration is never mistaken for a passing check). tests/render_cases.py documents the
input keys; tests/test_units_hosts.py feeds the same files to the real quadlet and
systemd-analyze on a test host.

Also here, pure: a newline or other control character anywhere a recipe, the command line or
the host survey puts text raises RenderError and produces no unit; sd_raw refuses what quadlet
would take raw and systemd would expand or split.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.launch.container import FORMATS, container_options, run_argv, run_flags
from tensorless_deploy.launch.render import (
    RenderError,
    render_quadlet,
    render_service,
    sd_comment,
    sd_raw,
    sd_raw_words,
    sd_value,
    sd_word,
    sd_words,
)
from tensorless_deploy.launch.spec import LaunchSpec
from tests.render_cases import INPUT, Case, cases, recipe_for, rendered_files, spec_for

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

REGEN = os.environ.get("TENSORLESS_REGEN_GOLDEN") == "1"
CASES = cases()
EXPECTED_CASES = {
    "quadlet-podman5",
    "quadlet-podman4",
    "service-podman",
    "service-docker",
    "multi-gpu-quadlet",
    "multi-gpu-docker",
    "untuned-context-extra-args",
    "bind-port-quadlet",
    "bind-port-service",
    "escaping-quadlet",
    "escaping-service",
    "api-key-tls-quadlet",
    "api-key-tls-service",
}


def _on_disk(folder: Path) -> dict[str, str]:
    return {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != INPUT
    }


def test_every_case_is_there() -> None:
    assert {c.name for c in CASES} == EXPECTED_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden(case: Case) -> None:
    want = rendered_files(case.data)
    if REGEN:
        for name in set(_on_disk(case.folder)) - set(want):
            (case.folder / name).unlink()
        for name, text in want.items():
            (case.folder / name).write_text(text, encoding="utf-8")
        pytest.fail(f"regenerated {case.folder}: review the diff, then run without the switch")
    have = _on_disk(case.folder)
    assert sorted(have) == sorted(want), "missing or extra golden files"
    for name, text in want.items():
        assert have[name] == text, f"{case.name}/{name} differs from what renders now"


# ------------------------------------------------------------------------ what the goldens say


def _golden(case: str, suffix: str) -> str:
    (text,) = [
        t
        for n, t in _on_disk(Path(__file__).parent / "golden" / case).items()
        if n.endswith(suffix)
    ]
    return text


def test_notify_healthy_only_for_podman5() -> None:
    assert "\nNotify=healthy\n" in _golden("quadlet-podman5", ".container")
    assert "Notify" not in _golden("quadlet-podman4", ".container")


def test_docker_gpus_is_one_csv_field() -> None:
    one = _golden("service-docker", ".service")
    assert ' "--gpus" "device=GPU-' in one
    many = _golden("multi-gpu-docker", ".service")
    # docker parses --gpus as CSV: the quotes keep both ids in the device field
    assert ' "--gpus" "\\"device=GPU-11111111-2222-3333-4444-555555555555,GPU-' in many
    for case in ("service-docker", "multi-gpu-docker"):
        data = next(c for c in CASES if c.name == case).data
        args = run_flags(container_options(spec_for(data), health=True))
        value = args[args.index("--gpus") + 1]
        # read as docker reads it (Go encoding/csv, one record): one field, every id in it
        (field,) = next(csv.reader([value]))
        assert field == "device=" + ",".join(data["spec"]["gpu_uuids"])
    quad = _golden("multi-gpu-quadlet", ".container")
    assert quad.count("\nAddDevice=nvidia.com/gpu=GPU-") == 2


def _unit_words(line: str) -> list[str]:
    """A unit's command line read back as systemd reads it: double-quoted words with \\ and \"
    escaped, %% and $$ doubled."""
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line)]


def _flag_pairs(argv: list[str], image: str) -> set[tuple[str, str]]:
    """(kind, value) of every option before the image, read back through the flag table (a
    boolean flag is one word, --flag=value; every other flag is followed by its value)."""
    by_flag = {f.flag: k for k, f in FORMATS.items()}
    opts = argv[argv.index("--pull=never") + 1 : argv.index(image)]
    out, i = set(), 0
    while i < len(opts):
        flag, eq, value = opts[i].partition("=")
        if eq and FORMATS[by_flag[flag]].joined:
            out.add((by_flag[flag], value))
            i += 1
            continue
        assert not FORMATS[by_flag[opts[i]]].joined, opts[i]
        out.add((by_flag[opts[i]], opts[i + 1]))
        i += 2
    return out


def _quadlet_pairs(text: str) -> set[tuple[str, str]]:
    by_key = {f.key: k for k, f in FORMATS.items() if f.key}
    out = set()
    for line in text.split("[Container]\n", 1)[1].split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition("=")
        if key not in by_key:
            continue
        kind = by_key[key]
        if FORMATS[kind].escape == "word":
            (value,) = _unit_words(value)
        if kind == "no_new_privileges":
            assert value == "true"
            value = "no-new-privileges"
        out.add((kind, value))
    return out


@pytest.mark.parametrize(
    "case", ["quadlet-podman5", "escaping-quadlet", "multi-gpu-quadlet", "api-key-tls-quadlet"]
)
def test_one_option_set_rendered_three_ways(case: str) -> None:
    """The quadlet, the plain unit and the foreground argv of one spec carry the same container
    options (the foreground run leaves the health check to the launcher's own poll)."""
    data = next(c for c in CASES if c.name == case).data
    recipe = recipe_for(data)
    spec = spec_for(data, recipe)
    quadlet = render_quadlet(spec, digest="sha256:" + "0" * 64, notify_healthy=True).content
    service = render_service(spec, digest="sha256:" + "0" * 64, engine_bin="/usr/bin/podman")
    exec_start = next(
        line.removeprefix("ExecStart=")
        for line in service.content.splitlines()
        if line.startswith("ExecStart=")
    )
    unit_argv = _unit_words(exec_start)
    foreground = run_argv(spec, "podman", health=False)
    from_quadlet = _quadlet_pairs(quadlet)
    from_service = _flag_pairs(unit_argv, spec.image)
    from_argv = _flag_pairs(foreground, spec.image)
    health = {o for o in from_service if o[0].startswith("health_")}
    assert health and from_service == from_argv | health
    assert {(o.kind, o.value) for o in container_options(spec, health=True)} == from_service
    # with podman 5's startup probe gating the health check, no start period: the one difference
    probed = {(o.kind, o.value) for o in container_options(spec, health=True, startup_probe=True)}
    assert from_quadlet == probed
    assert from_quadlet ^ from_service == {
        ("health_start_period", "0s"),
        ("health_start_period", f"{spec.start_timeout_s}s"),
    }
    # the same image and llama-server argv after it, everywhere
    assert unit_argv[unit_argv.index(spec.image) + 1 :] == list(spec.server_args)
    assert foreground[foreground.index(spec.image) + 1 :] == list(spec.server_args)
    assert f"Image={spec.image}\n" in quadlet
    assert f"Exec={sd_words(spec.server_args)}\n" in quadlet


def test_escaping_golden_values() -> None:
    q = _golden("escaping-quadlet", ".container")
    assert 'Environment="TL_WEIRD=a%%b$$c\\"d\\\\e f\'g"\n' in q
    assert '"--alias" "odd \\"alias\\" 100%% $$HOME \'q\' \\\\x"' in q


# ------------------------------------------------------------------------ control characters

BASE = "quadlet-podman5"
CONTROLS = ["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\v", "\f"]


def _base() -> dict[str, Any]:
    return next(c for c in CASES if c.name == BASE).data


def _both_refuse(spec: LaunchSpec) -> None:
    with pytest.raises(RenderError):
        render_quadlet(spec, digest="sha256:00", notify_healthy=True)
    with pytest.raises(RenderError):
        render_service(spec, digest="sha256:00", engine_bin="/usr/bin/podman")


def _with_run(**raw_run: Any) -> LaunchSpec:
    data = {**_base(), "raw_run": raw_run}
    return spec_for(data, recipe_for(data))


@pytest.mark.parametrize("ch", CONTROLS, ids=[repr(c) for c in CONTROLS])
def test_control_character_anywhere_refused(ch: str) -> None:
    # the recipe rules refuse these too; the renderer does not rely on them (raw_run bypasses)
    _both_refuse(_with_run(env={"GGML_X": f"a{ch}b"}))
    _both_refuse(_with_run(env={f"K{ch}": "v"}))
    _both_refuse(_with_run(args=["-np", f"1{ch}"]))
    _both_refuse(_with_run(alias=f"name{ch}ExecStartPre=/bin/true"))
    base = spec_for(_base(), recipe_for(_base()))
    _both_refuse(dataclasses.replace(base, server_args=(*base.server_args, f"--x{ch}")))
    _both_refuse(dataclasses.replace(base, model_path=f"/srv/models{ch}/m.gguf"))
    _both_refuse(dataclasses.replace(base, model_mount=f"/models/m{ch}.gguf"))
    _both_refuse(dataclasses.replace(base, gpu_uuids=(f"GPU-1{ch}",)))
    _both_refuse(dataclasses.replace(base, bind=f"127.0.0.1{ch}"))
    _both_refuse(dataclasses.replace(base, image=f"{base.image}{ch}"))
    _both_refuse(dataclasses.replace(base, description=f"x{ch}y"))
    _both_refuse(dataclasses.replace(base, labels=((f"k{ch}", "v"),)))
    with pytest.raises(RenderError):
        render_quadlet(base, digest=f"sha256:0{ch}", notify_healthy=True)


def test_bind_must_be_an_ip_address() -> None:
    base = spec_for(_base(), recipe_for(_base()))
    for bad in ("localhost", "127.0.0.1 ExecStartPre=/bin/sh", "fe80::1%eth0", "", "1.2.3.4%n"):
        _both_refuse(dataclasses.replace(base, bind=bad))
    for good in ("0.0.0.0", "::", "::1", "10.0.0.5"):
        render_quadlet(dataclasses.replace(base, bind=good), digest="d", notify_healthy=True)


def test_volume_paths_must_be_absolute_without_colon() -> None:
    base = spec_for(_base(), recipe_for(_base()))
    _both_refuse(dataclasses.replace(base, model_path="/srv/a:b/m.gguf"))
    _both_refuse(dataclasses.replace(base, model_path="srv/m.gguf"))
    _both_refuse(dataclasses.replace(base, model_mount="/models/m:rw"))


def test_quadlet_raw_values_refuse_unsafe_paths() -> None:
    base = spec_for(_base(), recipe_for(_base()))
    for bad in (
        "/srv/my models/m.gguf",
        "/srv/100%/m.gguf",
        "/srv/$HOME/m.gguf",
        '/srv/"q"/m',
        "/srv/a,b/m.gguf",
        "/srv/a\\b/m.gguf",
        "/srv/it's/m.gguf",
    ):
        with pytest.raises(RenderError):
            render_quadlet(
                dataclasses.replace(base, model_path=bad), digest="d", notify_healthy=True
            )
        # a plain unit quotes the whole --volume word: the same path is fine there
        unit = render_service(
            dataclasses.replace(base, model_path=bad), digest="d", engine_bin="/usr/bin/podman"
        )
        assert "--volume" in unit.content


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " ",
        "a b",
        '"q"',
        "'q'",
        "100%",
        "$HOME",
        "${X}",
        "a\\b",
        "a,b",
        "a;b",
        "#x",
        "a\nb",
        "a\tb",
        "\x7f",
        "é",
    ],
)
def test_sd_raw_refuses_unsafe(bad: str) -> None:
    with pytest.raises(RenderError):
        sd_raw(bad)
    with pytest.raises(RenderError):
        sd_raw_words(["curl", bad])


def test_sd_raw_passes_plain_values() -> None:
    for good in (
        "nvidia.com/gpu=GPU-ab6a0263-1",
        "/var/lib/x/blobs/abc:/models/m.gguf:ro",
        "10.253.0.1:5000/img@sha256:35ab",
        "http://[::1]:9090/health",
        "a+b_c",
    ):
        assert sd_raw(good) == good


def test_sd_word_and_friends() -> None:
    assert sd_word("a%b$c\"d\\e f'g") == '"a%%b$$c\\"d\\\\e f\'g"'
    assert sd_word("") == '""'
    assert sd_value("100% sure") == "100%% sure"
    for f in (sd_value, sd_comment):
        with pytest.raises(RenderError):
            f("ends with a backslash\\")  # would continue the line
