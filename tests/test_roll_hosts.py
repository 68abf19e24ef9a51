"""deploy --serial on four real hosts: the third host's new unit fails its health check for real
(a corrupted model file that passed verification earlier), the roll stops there."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.hub import DEFAULT_MODELS_DIR, host_state_dir
from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner
from tests.hosts.tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.hosts

V2_FILE = "tiny-llama-v2.gguf"
REPO_DIR = "/var/lib/tensorless/models/models--tensorless-test--tiny-llama-GGUF"


def test_roll_stops_at_the_first_failed_host(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    hf: HFServer,
    ssh: SshRunner,
    profile: Any,
    clean_hosts: None,
) -> None:
    names = ["gpu1", "gpu2", "gpu3", "legacy1"]
    if any(n not in test_hosts for n in names):
        pytest.skip("needs four hosts: tests/hosts/setup.sh 3 (./check all boots them)")
    profile("gpu2", "p100")
    v2 = tmp_path / V2_FILE
    write_tiny_gguf(str(v2), seed=7)
    v2_bytes = v2.read_bytes()
    v2_sha = hashlib.sha256(v2_bytes).hexdigest()
    tiny = Path(hosts_json["tiny_gguf"]["path"])
    hf.publish(
        TINY_REPO, {hosts_json["tiny_gguf"]["hf_file"]: tiny, V2_FILE: v2}, commit=TINY_COMMIT
    )
    inventory = write_inventory(tmp_path / "inventory.py", [test_hosts[n] for n in names])
    catalog = tmp_path / "recipes"
    env = {"HF_ENDPOINT": hf.url}
    base = ["deploy", "-i", str(inventory), "tiny", "--recipes", str(catalog), "--json"]

    write_catalog(catalog, tiny_recipe(hosts_json, TINY_COMMIT))
    first = cli(*base, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    old = {h["host"]: h["recipe_digest"] for h in json.loads(first.stdout)["hosts"]}

    new_recipe = tiny_recipe(hosts_json, TINY_COMMIT)
    new_recipe["model"].update(file=V2_FILE, sha256=v2_sha, size_bytes=len(v2_bytes))
    write_catalog(catalog, new_recipe)
    # gpu3 already "has" the v2 file, verified earlier, and it has rotted since: same size and
    # mtime as its stamp says, so deploy trusts it, and llama-server cannot load it
    blob = f"{REPO_DIR}/blobs/{v2_sha}"
    stamp = f"{host_state_dir(DEFAULT_MODELS_DIR)}/verified/{v2_sha}"  # where deploy stamps
    ssh(
        "gpu3",
        f"mkdir -p {REPO_DIR}/blobs $(dirname {stamp}) && "
        f"head -c {len(v2_bytes)} /dev/urandom > {blob} && "
        f"echo \"$(stat -c '%s %Y' {blob}) {blob}\" > {stamp}",
    )

    proc = cli(*base, "--serial", "1", env=env)
    assert proc.returncode == 1
    hosts = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert [hosts[n]["outcome"] for n in names] == ["changed", "changed", "failed", "untouched"]
    new = hosts["gpu1"]["recipe_digest"]
    assert new != old["gpu1"]
    assert hosts["gpu1"]["serving_digest"] == new and hosts["gpu2"]["serving_digest"] == new
    assert hosts["gpu3"]["serving_digest"] == old["gpu3"]  # restored, healthy on the old recipe
    assert hosts["legacy1"]["serving_digest"] == old["legacy1"]  # untouched
    failed = hosts["gpu3"]["steps"]
    out = " ".join(line for s in failed for line in s["output"])
    assert "restored the previous unit; it is healthy again" in out
