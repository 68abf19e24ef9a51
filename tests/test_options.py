"""The operator's options, resolved in one place for every command: the command line wins over
host data, which wins over the defaults, and every value is checked once, with one line naming
the flag, or the host and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorless_deploy.decisions.options import (
    DEFAULT_BIND,
    DEFAULT_PORT,
    Flags,
    Options,
    address,
    reach_host,
    resolve,
)
from tensorless_deploy.errors import InventoryError, UsageError
from tensorless_deploy.hub import DEFAULT_MODELS_DIR
from tests.hosts.fleet import cli

DATA = {
    "tensorless_port": 8081,
    "tensorless_bind": "0.0.0.0",
    "tensorless_models_dir": "/srv/models",
    "tensorless_engine": "docker",
}


def test_defaults_then_host_data_then_flags() -> None:
    assert resolve() == Options()
    assert (resolve().port, resolve().bind) == (DEFAULT_PORT, DEFAULT_BIND)
    assert resolve().models_dir == DEFAULT_MODELS_DIR
    from_data = resolve(Flags(), DATA, "gpu1")
    assert (from_data.port, from_data.bind, from_data.models_dir, from_data.engine) == (
        8081,
        "0.0.0.0",
        "/srv/models",
        "docker",
    )
    flags = Flags(port=9000, bind="::1", models_dir="/data/m", engine="podman", context=2048)
    both = resolve(flags, DATA, "gpu1")
    assert (both.port, both.bind, both.models_dir, both.engine, both.context) == (
        9000,
        "::1",
        "/data/m",
        "podman",
        2048,
    )
    # one flag given, the rest from data
    assert resolve(Flags(port=9000), DATA, "gpu1").bind == "0.0.0.0"


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (Flags(port=0), "--port 0: must be a port number 1-65535"),
        (Flags(port=99999), "--port 99999: must be a port number 1-65535"),
        (Flags(port=-1), "--port -1: must be a port number 1-65535"),
        (Flags(bind="localhost"), "--bind localhost: must be an IP address"),
        (Flags(bind="fe80::1%eth0"), "--bind fe80::1%eth0: must be an IP address"),
        (Flags(context=0), "--context 0: must be a positive number of tokens"),
        (Flags(context=-5), "--context -5: must be a positive number of tokens"),
        (Flags(context=2**31), "--context 2147483648: must be a positive number of tokens"),
        # no command has --models-dir: the value is named by the key that sets it
        (Flags(models_dir="models"), "tensorless_models_dir models: must be a clean absolute"),
        (Flags(models_dir="/a/../b"), "tensorless_models_dir /a/../b: must be a clean absolute"),
        (Flags(engine="lxc"), "--engine lxc: must be podman, docker or auto"),
        (Flags(bind="1.2.3.4", flag_names={"bind": "--host"}), None),
        (Flags(bind="x", flag_names={"bind": "--host"}), "--host x: must be an IP address"),
    ],
)
def test_a_bad_flag_is_one_usage_line_naming_it(flags: Flags, line: str | None) -> None:
    if line is None:
        assert resolve(flags).bind == "1.2.3.4"
        return
    with pytest.raises(UsageError) as raised:
        resolve(flags, DATA, "gpu1")
    assert raised.value.message.startswith(line), raised.value.message
    assert "\n" not in raised.value.message


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("tensorless_port", 99999, "must be a port number 1-65535 (got 99999)"),
        ("tensorless_port", True, "must be a port number 1-65535 (got True)"),
        ("tensorless_port", "8080", 'must be a port number 1-65535 (got "8080")'),
        ("tensorless_bind", "example.com", "must be an IP address such as 127.0.0.1"),
        ("tensorless_models_dir", "/srv//m", "must be a clean absolute path"),
        ("tensorless_engine", "rkt", 'must be podman, docker or auto (got "rkt")'),
    ],
)
def test_bad_host_data_names_the_host_and_the_key(key: str, value: object, why: str) -> None:
    with pytest.raises(InventoryError) as raised:
        resolve(Flags(), {**DATA, key: value}, "gpu7")
    assert raised.value.message.startswith(f"gpu7: {key}: "), raised.value.message
    assert why in raised.value.message
    assert raised.value.fix and key in raised.value.fix


def test_a_flag_overrides_bad_host_data_without_reading_it() -> None:
    assert resolve(Flags(port=9000), {**DATA, "tensorless_port": "bad"}, "gpu7").port == 9000


def test_addresses() -> None:
    assert address("127.0.0.1", 8080) == "127.0.0.1:8080"
    assert address("::1", 8080) == "[::1]:8080"
    assert reach_host("0.0.0.0") == "127.0.0.1" and reach_host("::") == "::1"
    assert reach_host("10.0.0.5") == "10.0.0.5"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["run", "pn3", "--dry-run", "--port", "0"], "--port 0: must be a port number 1-65535"),
        (["run", "pn3", "--dry-run", "--port", "70000"], "--port 70000: must be a port number"),
        (["run", "pn3", "--dry-run", "--context", "0"], "--context 0: must be a positive"),
        (["run", "pn3", "--dry-run", "--host", "my-host"], "--host my-host: must be an IP"),
        (["serve", "pn3", "--port", "-1"], "--port -1: must be a port number"),
        (["deploy", "-i", "INV", "pn3", "--port", "99999"], "--port 99999: must be a port"),
        (["doctor", "-i", "INV", "--port", "0"], "--port 0: must be a port number"),
        (["plan", "-i", "INV", "pn3", "--context", "-1"], "--context -1: must be a positive"),
    ],
)
def test_cli_refuses_bad_numbers_before_touching_anything(
    argv: list[str], line: str, tmp_path: Path
) -> None:
    """Every command refuses the value with one line and exit 2, before it reads an inventory
    (INV does not even exist) or this machine's GPUs."""
    proc = cli(*[str(tmp_path / "missing.py") if a == "INV" else a for a in argv])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(line), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_cli_names_the_host_and_key_of_bad_inventory_data(tmp_path: Path) -> None:
    """Bad host data is reported before any connection (the host does not even exist)."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        'hosts = [("gpu9", {"ssh_hostname": "192.0.2.1", "tensorless_port": 99999})]\n'
    )
    for argv in (["doctor"], ["plan", "pn3"], ["deploy", "pn3", "--dry"]):
        proc = cli(argv[0], "-i", str(inventory), *argv[1:])
        assert proc.returncode == 1, (argv, proc.stdout + proc.stderr)
        assert proc.stderr.startswith(
            "gpu9: tensorless_port: must be a port number 1-65535 (got 99999)"
        ), proc.stderr
        assert "Traceback" not in proc.stderr


# --- browser origins (llama-server --cors-origins): loopback only unless the operator widens it


def test_cors_origins_default_to_loopback_and_widen_by_the_option() -> None:
    assert resolve().cors_origins == "localhost"
    ui = "https://ui.example.net,http://[::1]:3000"
    assert resolve(Flags(), {"tensorless_cors_origins": ui}, "gpu1").cors_origins == ui
    listed = ["https://ui.example.net", "http://localhost:3000"]
    assert resolve(Flags(), {"tensorless_cors_origins": listed}, "gpu1").cors_origins == (
        "https://ui.example.net,http://localhost:3000"
    )
    keyed = {"tensorless_cors_origins": "*", "tensorless_api_key_file": "/k"}
    assert resolve(Flags(), keyed, "gpu1").cors_origins == "*"


@pytest.mark.parametrize("value", ["evil", "ftp://x.example", "https://a b", "", "https://x/", 5])
def test_a_bad_cors_origins_value_names_the_host_and_key(value: object) -> None:
    with pytest.raises(InventoryError, match="gpu1: tensorless_cors_origins: must be"):
        resolve(Flags(), {"tensorless_cors_origins": value}, "gpu1")
    if isinstance(value, str):
        with pytest.raises(UsageError, match="--cors-origins"):
            resolve(Flags(cors_origins=value))


def test_any_origin_only_with_a_key() -> None:
    with pytest.raises(InventoryError, match=r"gpu1: tensorless_cors_origins \*: any web page"):
        resolve(Flags(), {"tensorless_cors_origins": "*"}, "gpu1")
    with pytest.raises(UsageError, match=r"--cors-origins \*: any web page") as info:
        resolve(Flags(cors_origins="*"))
    assert info.value.fix is not None and "--api-key-file" in info.value.fix
    assert resolve(Flags(cors_origins="*", api_key_file="/k")).cors_origins == "*"


def test_cors_origins_reach_llama_server_and_recipes_cannot_set_them(tmp_path: Path) -> None:
    """run --dry-run prints the exact command: --cors-origins is the launcher's; after -- (a
    run's extra args) it is refused, naming the option to use instead."""
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "XDG_CACHE_HOME": str(tmp_path)}
    proc = cli("run", "pn3", "--dry-run", "--card", "p100", env=env)
    # exit 1 on a machine without the card, as the real run would (the command is still shown)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    assert "--cors-origins localhost" in proc.stdout, proc.stdout
    proc = cli("run", "pn3", "--dry-run", "--card", "p100", "--cors-origins", "https://u.example")
    assert "--cors-origins https://u.example" in proc.stdout, proc.stdout + proc.stderr
    proc = cli("run", "pn3", "--dry-run", "--card", "p100", "--", "--cors-origins", "*", env=env)
    assert proc.returncode == 2, proc.stdout
    assert "the launcher sets --cors-origins itself; use --cors-origins (before the --)" in (
        proc.stderr
    ), proc.stderr
