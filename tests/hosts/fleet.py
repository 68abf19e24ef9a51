"""Test-side helpers for driving the CLI against the real test hosts: the tiny recipe, an
inventory file for the hosts, and running `python -m tensorless_deploy` as an operator would."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.hosts.harness import Host, host_set
from tests.recipe_tools import write_recipe

TINY_REPO = "tensorless-test/tiny-llama-GGUF"
TINY_FILE = "tiny-llama.gguf"
# the pinned commit the test Hub serves the tiny GGUF at, and its model card; here (not in the
# pytest plugin) so that the playground and the demo need nothing but the tool's own packages
TINY_COMMIT = "7c1d0f3a9e2b4d6c8a1f3e5b7d9c0a2e4f6b8d01"
TINY_README = (
    b"---\nlicense: apache-2.0\ntags: [gguf, test]\n---\n"
    b"# tiny-llama-GGUF\n\nA 2-layer random-weight llama GGUF for tensorless-deploy tests.\n"
)
# on the set's bridge (TL_SET; hosts.json "unreachable"), never assigned: connections time out
UNREACHABLE_IP = host_set().unreachable


def tiny_recipe(hosts_json: Mapping[str, Any], commit: str, **run: Any) -> dict[str, Any]:
    """A released recipe for the tiny GGUF on the P100 stand-in card, served by the real CPU
    llama-server image (pinned by the digest the registry reported)."""
    g = hosts_json["tiny_gguf"]
    data: dict[str, Any] = {
        "schema": 1,
        "status": "released",
        "model": {
            "name": "tiny",
            "title": "tiny random llama (test model)",
            "hf_repo": TINY_REPO,
            "revision": commit,
            "file": g["hf_file"],
            "sha256": g["sha256"],
            "size_bytes": g["size"],
            "license": "MIT (generated test model)",
        },
        "card": {
            "id": "p100",
            "title": "Tesla P100 16 GB (stand-in)",
            "compute_capability": "6.0",
            "min_memory_mib": 16000,
            "min_driver": "525.60.13",
        },
        "engine": {
            "release": "engine-cpu-test",
            "arch": "cpu",
            "image": hosts_json["image"]["ref"],
        },
        "run": {
            "alias": TINY_REPO,
            "context": 4096,
            "threads_max": 2,
            "args": ["-np", "1", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"],
            "env": {"LLAMA_LOG_COLORS": "off"},
        },
        "receipt": {"decode_tps": {"short": 100.0}},
    }
    data["run"].update(run)
    return data


def write_catalog(root: Path, *recipes: dict[str, Any]) -> Path:
    for r in recipes:
        write_recipe(root, copy.deepcopy(r))
    return root


def write_inventory(
    path: Path,
    hosts: Sequence[Host],
    *,
    unreachable: bool = False,
    data: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """A pyinfra inventory naming each test host, with its own key and known_hosts."""
    rows = []
    for h in hosts:
        host_data = {
            "ssh_hostname": h.ip,
            "ssh_user": h.user,
            "ssh_key": str(h.key),
            "ssh_known_hosts_file": str(h.known_hosts),
            "ssh_strict_host_key_checking": "yes",
            # the nspawn guests' cgroup2 tree has no pids controller (the outer machine binds
            # every controller to v1; their containers.conf says pids_limit = 0 too): a unit's
            # --pids-limit would fail there ("controller `pids` is not available")
            "tensorless_pids_limit": 0,
            **(data or {}).get(h.name, {}),
        }
        rows.append((h.name, host_data))
    if unreachable:
        first = hosts[0]
        rows.append(
            (
                "ghost",
                {
                    "ssh_hostname": UNREACHABLE_IP,
                    "ssh_user": "root",
                    "ssh_key": str(first.key),
                    "ssh_known_hosts_file": str(first.known_hosts),
                    "ssh_connect_timeout": 3,
                },
            )
        )
    path.write_text(f"hosts = {rows!r}\n", encoding="utf-8")
    return path


def cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """tensorless-deploy as a subprocess, the way an operator runs it."""
    full_env = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tensorless_deploy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
