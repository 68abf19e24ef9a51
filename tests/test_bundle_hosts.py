"""bundle, then deploy --from-bundle to an air-gapped host while the controller cannot reach
the model server or the registry either: every part verified first, the bytes pushed over
SSH, the host healthy, a converged re-run changes nothing; a bundle with a bad part is refused
in one line before anything reaches the host."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner
from tests.test_local_hosts import (
    PORT,
    _cli,
    local_gpu,  # noqa: F401 - the fixture: this machine a P100
)
from tests.test_push_hosts import airgapped  # noqa: F401 - the fixture: gpu1 reaches nothing

pytestmark = pytest.mark.hosts

BLOBS = "/var/lib/tensorless/models/models--tensorless-test--tiny-llama-GGUF/blobs"


@contextlib.contextmanager
def offline_controller(hosts_json: dict[str, Any], hf: HFServer) -> Iterator[None]:
    """This machine's own connections to the set's model server and registry refused (SSH to
    the hosts goes on): nothing but the bundle can give the controller the bytes."""
    registry_ip, _, registry_port = hosts_json["registry"].rpartition(":")
    table = f"tl_offline_set{hosts_json['set']}"
    rules = f"""table inet {table} {{
  chain out {{
    type filter hook output priority 0; policy accept;
    ip daddr {registry_ip} tcp dport {{ {registry_port}, {hf.port} }} reject
  }}
}}
"""
    subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
    try:
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], check=False)


def _deploy(inv: Path, bundle: Path, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """deploy --from-bundle --json: the exit status, and gpu1's result (or the error)."""
    proc = cli("deploy", "-i", str(inv), "tiny", "--from-bundle", str(bundle), "--json", env=env)
    assert proc.stdout.startswith("{"), proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    return proc.returncode, doc["hosts"][0] if "hosts" in doc else doc


def test_deploy_from_a_bundle_with_no_network_but_ssh(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    hf: HFServer,
    ssh: SshRunner,
    reset_host: Any,
    clean_hosts: None,
    airgapped: str,  # noqa: F811
) -> None:
    reset_host("gpu1", images=True)
    registries = tmp_path / "registries.conf"
    registries.write_text(f'[[registry]]\nlocation = "{hosts_json["registry"]}"\ninsecure = true\n')
    online = {
        "HF_ENDPOINT": hf.url,
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "CONTAINERS_REGISTRIES_CONF": str(registries),
    }
    cat = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    bundle = tmp_path / "site" / "tiny.bundle"
    bundle.parent.mkdir()
    made = cli("bundle", "tiny", "--recipes", str(cat), "-o", str(bundle), env=online)
    assert made.returncode == 0, made.stderr
    again = cli("bundle", "tiny", "--recipes", str(cat), "-o", str(bundle), env=online)
    assert again.returncode == 1 and again.stderr.strip().startswith(f"bundle: {bundle} exists")

    # the site: a controller with caches of its own and no route to the Hub or the registry
    inv = write_inventory(tmp_path / "inventory.py", [test_hosts["gpu1"]])
    site = {
        "HF_ENDPOINT": f"http://{hosts_json['unreachable']}:9",
        "HF_HUB_CACHE": str(tmp_path / "site-hub"),
        "XDG_CACHE_HOME": str(tmp_path / "site-xdg"),
        "CONTAINERS_REGISTRIES_CONF": str(registries),
    }
    with offline_controller(hosts_json, hf):
        gone = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "--max-time", "3", f"{hf.url}/"], check=False
        )
        assert gone.returncode != 0  # the controller really cannot reach the model server

        # a bad part: refused in one line, and nothing reaches the host
        bad = tmp_path / "bad.bundle"
        shutil.copytree(bundle, bad)
        model = next((bad / "model").iterdir())
        data = bytearray(model.read_bytes())
        data[1000] ^= 0xFF
        model.write_bytes(bytes(data))
        rc, refused = _deploy(inv, bad, site)
        (line,) = refused["error"]["lines"]
        assert rc == 1 and f"part model/{model.name} has sha256" in line, refused
        assert ssh("gpu1", f"ls -A {BLOBS} 2>/dev/null", check=False).stdout.strip() == ""
        assert (
            ssh("gpu1", "ls -A /var/lib/tensorless/transfer 2>/dev/null", check=False).stdout == ""
        )

        rc, host = _deploy(inv, bundle, site)
        assert rc == 0, host
        assert host["transfer"].startswith("push")
        size = hosts_json["tiny_gguf"]["size"]
        assert f"model: sent {size} bytes (resumed from 0)" in host["transfer"], host
        assert "image: sent" in host["transfer"]
        answer = ssh("gpu1", "curl -fsS http://127.0.0.1:8080/v1/models").stdout
        assert TINY_REPO in answer

        rc, host = _deploy(inv, bundle, site)
        assert rc == 0 and host["outcome"] == "unchanged", host
        assert "sent" not in host["transfer"]
    assert not (tmp_path / "site-hub").exists()  # the controller fetched nothing itself


def test_pull_and_run_from_a_bundle_on_this_machine(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    hf: HFServer,
    local_gpu: dict[str, str],  # noqa: F811
) -> None:
    """pull --from-bundle loads the image (digest checked by the hosts' own loader) and puts
    the GGUF into this machine's Hub cache; run --from-bundle serves it; both with this
    machine's route to the model server and the registry cut."""
    registries = local_gpu["CONTAINERS_REGISTRIES_CONF"]
    online = {**local_gpu, "HF_ENDPOINT": hf.url, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    cat = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    bundle = tmp_path / "tiny.bundle"
    made = cli("bundle", "tiny", "--recipes", str(cat), "-o", str(bundle), env=online)
    assert made.returncode == 0, made.stderr
    ref = hosts_json["image"]["ref"]
    env = {
        **local_gpu,
        "HF_ENDPOINT": f"http://{hosts_json['unreachable']}:9",
        "HF_HUB_CACHE": str(tmp_path / "site-hub"),
        "XDG_CACHE_HOME": str(tmp_path / "site-xdg"),
        "CONTAINERS_REGISTRIES_CONF": registries,
    }
    podman_env = {**os.environ, **env}
    subprocess.run(["podman", "rmi", "-f", ref], env=podman_env, capture_output=True, check=False)
    with offline_controller(hosts_json, hf):
        pull = cli("pull", "tiny", "--from-bundle", str(bundle), "--json", env=env)
        assert pull.returncode == 0, pull.stderr
        assert f"image {ref}: loaded from the bundle" in pull.stderr
        assert json.loads(pull.stdout)["image_pulled"] is True
        exists = subprocess.run(["podman", "image", "exists", ref], env=podman_env, check=False)
        assert exists.returncode == 0
        port = PORT + 10 * int(hosts_json["set"]) + 1  # not another set's, nor test_local_hosts'
        run = _cli("run", "tiny", "--from-bundle", str(bundle), "--port", str(port), env=env)
        assert run.stdout is not None
        t0, line = time.monotonic(), ""
        while time.monotonic() - t0 < 120:
            line = run.stdout.readline()
            if line.startswith("serving") or run.poll() is not None:
                break
        try:
            assert line.startswith(f"serving {TINY_REPO} on http://127.0.0.1:{port}"), line + (
                run.stderr.read() if run.poll() is not None and run.stderr else ""
            )
        finally:
            run.send_signal(signal.SIGTERM)
            assert run.wait(timeout=60) == 0
