"""Shared pytest configuration: the real test-host fixtures (tests/hosts/plugin.py), and the
guard of the pure tests.

Tests marked ``hosts`` need tests/hosts/setup.sh to have run (``pytest -m hosts``); the default
run deselects them. See docs/test-hosts.md.

A test module marked ``pure`` (``pytestmark = pytest.mark.pure``) starts no process and opens
no network connection: ``./check lint`` runs these in seconds beside ruff. The guard below makes
that a fact, not a promise: in a pure test, starting a process or connecting a socket fails the
test, naming what it tried. ``TL_PURE_PROBE=1 pytest`` applies the guard to every test (how to
find a module that could be marked pure).
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

pytest_plugins = ["tests.hosts.plugin"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pure: starts no process, opens no connection (./check lint runs these)"
    )


def _refuse(what: str) -> Any:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a pure test {what}: {args[1:2] or args[:1]}")

    return refuse


@pytest.fixture(autouse=True)
def _pure_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    node = request.node
    if node.get_closest_marker("hosts") is not None or (
        node.get_closest_marker("pure") is None and not os.environ.get("TL_PURE_PROBE")
    ):
        yield
        return
    # imported before os.fork is replaced: gevent.os and gevent.subprocess keep the os.fork
    # they find at import, and a refusing one kept there fails every later test's subprocess
    # once pyinfra_cli has patched the stdlib (a test after a pure one, in some orders)
    try:
        import gevent.subprocess as gevent_subprocess
    except ImportError:
        gevent_subprocess = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "_execute_child", _refuse("started a process"))
        mp.setattr(os, "system", _refuse("started a process"))
        mp.setattr(os, "fork", _refuse("forked"))
        mp.setattr(socket.socket, "connect", _refuse("opened a connection"))
        mp.setattr(socket.socket, "connect_ex", _refuse("opened a connection"))
        if gevent_subprocess is not None:
            mp.setattr(gevent_subprocess.Popen, "_execute_child", _refuse("started a process"))
        yield
