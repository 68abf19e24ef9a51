"""check, models and info driven as an operator runs them: a subprocess, its output, its exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.recipe_tools import example, variant, write_recipe


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorless_deploy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.fixture
def states_catalog(tmp_path: Path) -> Path:
    """One recipe in every state."""
    write_recipe(tmp_path, example())
    write_recipe(tmp_path, variant("org/draft-GGUF", name="drafty", status="draft"))
    unpub = variant("org/unpub-GGUF", card="t4", status="draft")
    unpub["model"]["revision"] = "0" * 40
    write_recipe(tmp_path, unpub)
    rel_unpub = variant("org/relunpub-GGUF", card="h200")
    rel_unpub["model"]["size_bytes"] = 0
    write_recipe(tmp_path, rel_unpub)
    return tmp_path


def test_check_builtin_catalog_passes() -> None:
    proc = cli("check")
    assert proc.returncode == 0, proc.stderr
    assert "all valid" in proc.stdout


def test_check_dir_with_errors_exits_1_and_prints_every_error(tmp_path: Path) -> None:
    data = example()
    data["model"]["revision"] = "main"
    data["run"]["env"] = {"OMP_NUM_THREADS": "4"}
    write_recipe(tmp_path, data)
    proc = cli("check", str(tmp_path))
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[:2] == [
        "iamMrDuncan/Qwen3.8-27B-PN3-GGUF/p100.toml: model.revision: must be a 40-character "
        'lowercase hex commit, not a branch or tag ("main")',
        'iamMrDuncan/Qwen3.8-27B-PN3-GGUF/p100.toml: run.env: must not set "OMP_NUM_THREADS": '
        "the launcher sets it from [run] threads_max",
    ]
    assert "Traceback" not in proc.stderr


def test_check_usage_errors_exit_2(tmp_path: Path) -> None:
    assert cli("check", str(tmp_path / "missing")).returncode == 2
    assert cli("check", "a", "b").returncode == 2
    assert cli("frobnicate").returncode == 2


def test_models_json_states(states_catalog: Path) -> None:
    proc = cli("models", "--json", "--recipes", str(states_catalog))
    assert proc.returncode == 0, proc.stderr
    rows: list[dict[str, Any]] = json.loads(proc.stdout)
    got = {(r["hf_repo"], r["card"]): r["state"] for r in rows}
    assert got == {
        ("iamMrDuncan/Qwen3.8-27B-PN3-GGUF", "p100"): "released",
        ("org/draft-GGUF", "p100"): "draft",
        ("org/unpub-GGUF", "t4"): "draft, unpublished",
        ("org/relunpub-GGUF", "h200"): "released, unpublished",
    }
    for row in rows:
        assert {"hf_repo", "name", "title", "card", "state"} <= set(row)


def test_models_json_flag_before_command(states_catalog: Path) -> None:
    proc = cli("--json", "models", "--recipes", str(states_catalog))
    assert len(json.loads(proc.stdout)) == 4


def test_models_table(states_catalog: Path) -> None:
    proc = cli("models", "--recipes", str(states_catalog))
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["MODEL", "NAME", "CARD", "STATE", "TITLE"]
    assert len(lines) == 5
    assert any("released, unpublished" in line for line in lines)


def test_info_shows_every_value_in_order(tmp_path: Path) -> None:
    data = example()
    data["receipt"]["decode_tps"] = {"ctx_65k": 20.0, "short": 30.06, "ctx_32k": 25.0}
    data["receipt"]["prefill_tps"] = {"zz": 1.0, "ctx_65k": 80.0, "ctx_4k": 121.4, "aa": 2.0}
    write_recipe(tmp_path, data)
    proc = cli("info", "PN3", "--recipes", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for value in (
        data["engine"]["image"],
        data["model"]["revision"],
        data["model"]["sha256"],
        "12954114496",
        "-np 1 -ngl 99",
        "GGML_CUDA_FATTN_SM60=1",
        "65536",
        "at most 8",
    ):
        assert value in out, value
    labels = [
        line.split()[1]
        for line in out.splitlines()
        if line.split()[:1] in (["decode"], ["prefill"])
    ]
    assert labels == ["short", "ctx_32k", "ctx_65k", "ctx_4k", "ctx_65k", "aa", "zz"]
    assert "NOT PUBLISHED" not in out
    proc = cli("info", "pn3", "--json", "--recipes", str(tmp_path))
    (info,) = json.loads(proc.stdout)
    assert list(info["receipt"]["prefill_tps"]) == ["ctx_4k", "ctx_65k", "aa", "zz"]
    assert info["model"]["size_bytes"] == 12954114496
    assert info["recipe_digest"].startswith("sha256:")


def test_info_not_published(states_catalog: Path) -> None:
    proc = cli("info", "org/unpub-gguf", "--recipes", str(states_catalog))
    assert proc.returncode == 0
    assert "NOT PUBLISHED" in proc.stdout
    assert "\x1b[" not in proc.stdout  # not a terminal: no colour


def test_info_unknown_model_suggests(states_catalog: Path) -> None:
    proc = cli("info", "draft-gguf", "--recipes", str(states_catalog))
    assert proc.returncode == 2  # an unknown model is a usage error
    assert "did you mean org/draft-GGUF" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_info_card(states_catalog: Path) -> None:
    proc = cli("info", "pn3", "--card", "h200", "--recipes", str(states_catalog))
    assert proc.returncode == 2
    assert "no recipe for card 'h200' (cards: p100)" in proc.stderr


def test_models_and_info_do_not_import_pyinfra_or_hub() -> None:
    code = (
        "import sys; from tensorless_deploy.cli import main; "
        "import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['models', '--json']); main(['info', 'pn3'])\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyinfra', 'huggingface_hub')]\n"
        "print(bad)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr
