"""The wheel carries the built-in catalog, and an installed package reads it from there."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_ships_recipes_and_reads_them(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(tmp_path / "site")
    shipped = [n for n in names if n.startswith("tensorless_deploy/_builtin/recipes/")]
    prefix = "tensorless_deploy/_builtin/recipes/"
    assert prefix + "iamMrDuncan/Qwen3.8-27B-PN3-GGUF/p100.toml" in shipped
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    code = (
        "from tensorless_deploy.recipe import builtin_recipes_dir, load_catalog; "
        "d = builtin_recipes_dir(); print(d); print(len(load_catalog().entries))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert out[0] == str(tmp_path / "site" / "tensorless_deploy" / "_builtin" / "recipes")
    assert int(out[1]) >= 1
