"""Shared pytest configuration: the real test-host fixtures (tests/hosts/plugin.py).

Tests marked ``hosts`` need tests/hosts/setup.sh to have run (``pytest -m hosts``); the default
run deselects them. See docs/test-hosts.md.
"""

pytest_plugins = ["tests.hosts.plugin"]
