"""Small edges an operator hits, each one line naming the file, host or key and the fix: a key
file that is a FIFO, a host name with a '/', an ssh_port beyond 65535, an empty recipes
directory, a recipe saved with a byte-order mark, a fix that names a flag the command lacks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tensorless_deploy.decisions.options import api_key_text
from tensorless_deploy.errors import InventoryError
from tensorless_deploy.fleet.inventory import load_inventory
from tests.recipe_tools import example, to_toml
from tests.test_hostile_input import assert_clean, cli


def test_a_key_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="is not a regular file"):
        api_key_text(str(fifo))
    assert time.monotonic() - t0 < 5
    with pytest.raises(ValueError, match=r"(is|Is) a directory"):
        api_key_text(str(tmp_path))  # a directory neither


def test_run_dry_run_with_a_fifo_key_file_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    proc = cli(
        "run",
        "pn3",
        "--dry-run",
        "--card",
        "p100",
        "--host",
        "0.0.0.0",
        "--api-key-file",
        str(fifo),
        timeout=60,
        env={"HF_ENDPOINT": "http://127.0.0.1:9", "XDG_CACHE_HOME": str(tmp_path / "c")},
    )
    lines = assert_clean(proc, max_line=4000)  # the dry run prints the whole command
    assert any("is not a regular file" in line for line in lines + proc.stdout.splitlines())


def _inventory(tmp_path: Path, text: str) -> str:
    path = tmp_path / "inventory.py"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_host_name_with_a_slash_is_refused(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, 'gpus = [("gpu1/x", {"ssh_hostname": "10.0.0.1"})]\n')
    with pytest.raises(InventoryError, match=r"host name \"gpu1/x\" has a '/'"):
        load_inventory(inv, False)


@pytest.mark.parametrize("port", [99999, 0, -1, "22x"])
def test_an_ssh_port_beyond_the_range_is_refused_naming_it(tmp_path: Path, port: object) -> None:
    inv = _inventory(tmp_path, f'gpus = [("gpu1", {{"ssh_port": {port!r}}})]\n')
    with pytest.raises(InventoryError) as info:
        load_inventory(inv, False)
    assert f"gpu1: ssh_port: must be a port number 1-65535 (got {port!r})" in info.value.message
    assert "34463" not in info.value.message


def test_check_of_an_empty_or_mistyped_directory_is_not_all_valid(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.md").write_text("not a recipe\n")
    for d in ("empty", "docs"):
        proc = cli("check", str(tmp_path / d))
        lines = assert_clean(proc)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "all valid" not in proc.stdout
        assert lines == [
            f"{tmp_path / d}: no recipe files here (a recipe is DIR/<org>/<repo>/<card>.toml) "
            "(fix: pass the recipes directory itself)"
        ]


def test_a_recipe_with_a_byte_order_mark_is_refused_naming_it(tmp_path: Path) -> None:
    data = example()
    path = tmp_path / data["model"]["hf_repo"] / f"{data['card']['id']}.toml"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xef\xbb\xbf" + to_toml(data).encode())
    proc = cli("check", str(tmp_path))
    lines = assert_clean(proc)
    assert proc.returncode == 1
    assert "byte-order mark (BOM)" in lines[0] and "without BOM" in lines[0]


def test_an_inventory_error_offers_only_flags_the_command_has(tmp_path: Path) -> None:
    catalog = tmp_path / "recipes"
    data = example()
    path = catalog / data["model"]["hf_repo"] / f"{data['card']['id']}.toml"
    path.parent.mkdir(parents=True)
    path.write_text(to_toml(data), encoding="utf-8")
    for key, value in (("tensorless_models_dir", "models"), ("tensorless_engine", "lxc")):
        inv = _inventory(tmp_path, f'gpus = [("gpu1", {{"{key}": "{value}"}})]\n')
        proc = cli("deploy", "-i", inv, data["model"]["hf_repo"], "--recipes", str(catalog))
        lines = assert_clean(proc)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"gpu1: {key}:" in lines[0] and f"correct {key} in the inventory" in lines[0]
        assert "--models-dir" not in lines[0] and "--engine" not in lines[0], lines
    # a command that has the flag offers it
    inv = _inventory(tmp_path, 'gpus = [("gpu1", {"tensorless_port": 99999})]\n')
    proc = cli("deploy", "-i", inv, data["model"]["hf_repo"], "--recipes", str(catalog))
    assert "or override with --port" in assert_clean(proc)[0]


@pytest.mark.parametrize(
    ("typo", "meant", "command"),
    [
        ("tensorless_prot", "tensorless_port", ["deploy", "--dry-run"]),
        ("tensorless_api_keyfile", "tensorless_api_key_file", ["status"]),
        ("tensorless_model_dir", "tensorless_models_dir", ["doctor"]),
    ],
)
def test_a_mistyped_host_data_key_is_refused_with_the_nearest_key(
    tmp_path: Path, typo: str, meant: str, command: list[str]
) -> None:
    """`tensorless_prot: 9000` once served on the default port without a word. The hosts are
    never reached (the address answers nobody): the data is refused first."""
    catalog = tmp_path / "recipes"
    data = example()
    path = catalog / data["model"]["hf_repo"] / f"{data['card']['id']}.toml"
    path.parent.mkdir(parents=True)
    path.write_text(to_toml(data), encoding="utf-8")
    inv = _inventory(
        tmp_path, f'gpus = [("gpu1", {{"ssh_hostname": "192.0.2.1", "{typo}": 9000}})]\n'
    )
    model = [data["model"]["hf_repo"]] if command[0] != "status" else []
    t0 = time.monotonic()
    proc = cli(command[0], "-i", inv, *model, *command[1:], "--recipes", str(catalog))
    lines = assert_clean(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert lines[0].startswith(
        f"gpu1: {typo}: not a key tensorless-deploy reads; did you mean {meant}?"
    ), lines
    assert f"(fix: correct {typo} in the inventory" in lines[0], lines
    assert time.monotonic() - t0 < 30  # refused before any connection was tried


def test_group_data_keys_are_checked_too(tmp_path: Path) -> None:
    """A typo in a group's data (pyinfra's (hosts, data) tuple) reaches every host of it."""
    inv = _inventory(
        tmp_path, 'gpus = (["gpu1"], {"ssh_hostname": "192.0.2.1", "tensorless_bnd": "0.0.0.0"})\n'
    )
    proc = cli("status", "-i", inv)
    lines = assert_clean(proc)
    assert proc.returncode == 1 and "did you mean tensorless_bind?" in lines[0], lines


def test_every_data_key_is_one_the_tool_reads() -> None:
    from tensorless_deploy.decisions.options import DATA_KEYS, DATA_PREFIX, check_data_keys

    assert all(k.startswith(DATA_PREFIX) for k in DATA_KEYS)
    check_data_keys({k: None for k in DATA_KEYS} | {"ssh_user": "root"}, "gpu1")  # no error
    with pytest.raises(InventoryError, match="tensorless_gpuz: not a key"):
        check_data_keys({"tensorless_gpuz": []}, "gpu1")


def test_every_data_key_is_documented_in_the_example_inventory() -> None:
    from tensorless_deploy.decisions.options import DATA_KEYS

    example = (Path(__file__).parent.parent / "inventories" / "example.py").read_text()
    doc = example.split('"""', 2)[1]
    assert [k for k in DATA_KEYS if f"    {k} " not in doc] == []
