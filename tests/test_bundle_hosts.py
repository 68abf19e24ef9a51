"""bundle, then deploy --from-bundle to an air-gapped host while the controller cannot reach
the model server or the registry either: every part verified first, the bytes pushed over
SSH, the host healthy, a converged re-run changes nothing; a bundle with a bad part is refused
in one line before anything reaches the host."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner
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
