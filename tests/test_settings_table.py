"""The operator's settings are one table (decisions.options: each a ``setting`` field of
Options): the inventory keys, the flags a command line reads, the options resolve returns and
their defaults all come from its rows, and Flags cannot have a setting the table lacks."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from tensorless_deploy.cli.common import access_from, flags_from
from tensorless_deploy.decisions import options as o
from tensorless_deploy.decisions.options import (
    DATA_KEYS,
    SETTINGS,
    Flags,
    Options,
    bound_to_settings,
    resolve,
)

# One valid value per setting, as a command line or an inventory would give it.
VALUES: dict[str, object] = {
    "port": 9001,
    "bind": "0.0.0.0",
    "models_dir": "/srv/models",
    "engine": "docker",
    "context": 4096,
    "instances": 2,
    "ports": (9001, 9002),
    "api_key_file": "/keys/api",
    "insecure_open": True,
    "tls_cert_file": "/tls/crt",
    "tls_key_file": "/tls/key",
    "metrics": True,
    "pids_limit": 100,
    "host_timeout": 30,
    "wait_lock": 5,
    "cors_origins": "https://ui.example.net",
    "drain_timeout": 30,
    "relay": True,
}


def test_the_table_is_options_fields_and_flags_fields() -> None:
    names = [s.name for s in SETTINGS]
    assert set(VALUES) == set(names)
    assert [f.name for f in dataclasses.fields(Options)][: len(names)] == names
    assert [f.name for f in dataclasses.fields(Flags)][: len(names)] == names
    for s in SETTINGS:
        assert getattr(Options(), s.name) == s.default
        assert getattr(Flags(), s.name) is None
        assert s.rule(s.default) is None or s.default is None, s.name
        assert s.rule(VALUES[s.name]) is None, s.name


def test_a_setting_in_one_place_only_is_refused() -> None:
    """Options and Flags are checked against the table when the module loads: a setting added
    to one of them (or a Flags setting with a default) makes the import fail."""
    flags_fields = [(f.name, f.type, f.default) for f in dataclasses.fields(Flags)]
    short = dataclasses.make_dataclass("Flags", [f for f in flags_fields if f[0] != "metrics"])
    longer = dataclasses.make_dataclass("Flags", [*flags_fields, ("gpu_mem", "int | None", None)])
    defaulted = dataclasses.make_dataclass(
        "Flags", [(n, t, 1 if n == "port" else d) for n, t, d in flags_fields]
    )
    for cls in (short, longer):
        with pytest.raises(TypeError, match="not the table's"):
            bound_to_settings(cls, optional=True)
    with pytest.raises(TypeError, match="must be None"):
        bound_to_settings(defaulted, optional=True)
    bound_to_settings(Flags, optional=True)
    bound_to_settings(Options, optional=False)


def test_every_inventory_key_is_a_rows_and_resolves_to_its_option() -> None:
    keys = [s.data_key for s in SETTINGS if s.data_key is not None]
    assert set(keys) <= set(DATA_KEYS) and len(set(DATA_KEYS)) == len(DATA_KEYS)
    for s in SETTINGS:  # the DATA_* names other modules import are the rows' keys
        if s.data_key is not None:
            assert getattr(o, "DATA_" + s.name.upper()) == s.data_key
    data = {s.data_key: VALUES[s.name] for s in SETTINGS if s.data_key is not None}
    got = resolve(Flags(), data, "h")
    for s in SETTINGS:
        assert getattr(got, s.name) == (VALUES[s.name] if s.data_key else s.default), s.name


def test_every_flag_is_read_from_the_command_line_into_its_option() -> None:
    """flags_from reads every setting a command has (access_from the access ones): a setting
    added to the table is read without a line of its own in cli.common."""
    given = {s.name: VALUES[s.name] for s in SETTINGS if s.flag is not None or s.data_key is None}
    given["instances"] = "2"  # as typed
    args = argparse.Namespace(**given)
    flags = access_from(args, flags_from(args))
    opts = resolve(flags)
    for name in given:
        assert getattr(opts, name) == VALUES[name], name
    plain = flags_from(args)  # the access settings are access_from's alone
    for s in SETTINGS:
        assert (getattr(plain, s.name) is None) == (s.access or s.name not in given), s.name


def test_a_switch_left_off_is_not_given() -> None:
    args = argparse.Namespace(metrics=False, insecure_open=False, port=None)
    flags = access_from(args, flags_from(args))
    assert flags.metrics is None and flags.insecure_open is None
    assert resolve(flags, {"tensorless_metrics": True}).metrics is True
