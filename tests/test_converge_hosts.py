"""Converging at the limit on the real test hosts: a converged host costs one SSH command (the
survey) and no pyinfra operation; a dry run says "no change" the same way, and shows the unit
diff where a unit would change; the model's bytes are hashed as they arrive, pulled or pushed
(the kernel sees no read of the file after its last byte arrived); a download or a push never
goes past the recipe's size_bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.recipe import load_catalog
from tensorless_deploy.recipe.catalog import model_paths
from tests.arrival_watch import Watch, guest_root
from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner

pytestmark = pytest.mark.hosts

UNIT = "tensorless-tiny-p100"
FILE = "tiny-llama.gguf"
BLOBS = "/var/lib/tensorless/models/models--tensorless-test--tiny-llama-GGUF/blobs"


@dataclass
class Setting:
    tmp: Path
    catalog: Path
    inventory: Path
    env: dict[str, str]
    hosts_json: dict[str, Any]
    hosts: dict[str, Host]
    ssh: SshRunner
    hf: HFServer

    def write(self, **run: Any) -> None:
        write_catalog(self.catalog, tiny_recipe(self.hosts_json, TINY_COMMIT, **run))

    def cli(self, *args: str) -> tuple[int, dict[str, Any], str]:
        proc = cli(
            "deploy",
            "-i",
            str(self.inventory),
            "tiny",
            "--recipes",
            str(self.catalog),
            *args,
            env=self.env,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        doc = json.loads(proc.stdout) if proc.stdout.startswith("{") else {}
        return proc.returncode, doc, proc.stdout + proc.stderr


@pytest.fixture
def setting(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    hf: HFServer,
    ssh: SshRunner,
    profile: Any,
    clean_hosts: None,
) -> Setting:
    profile("gpu2", "p100")
    registries = tmp_path / "registries.conf"
    registries.write_text(f'[[registry]]\nlocation = "{hosts_json["registry"]}"\ninsecure = true\n')
    env = {
        "HF_ENDPOINT": hf.url,
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "CONTAINERS_REGISTRIES_CONF": str(registries),
    }
    hosts = [test_hosts["gpu1"], test_hosts["gpu2"]]
    s = Setting(
        tmp_path,
        tmp_path / "recipes",
        write_inventory(tmp_path / "inventory.py", hosts),
        env,
        hosts_json,
        test_hosts,
        ssh,
        hf,
    )
    s.write()
    return s


@pytest.fixture
def in_process(setting: Setting) -> Any:
    """deploy() (tests/count_deploy.py, a process of its own) counting every SSH command pyinfra
    runs on each host, every @deploy added, and every look-up of the Hub token."""

    def go(*names: str, dry: bool = False) -> dict[str, Any]:
        argv = [sys.executable, "-m", "tests.count_deploy", *(["--dry-run"] if dry else [])]
        argv += [str(setting.inventory), str(setting.catalog), *names]
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **setting.env},
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert proc.returncode == 0, proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc

    return go


ALL_UNCHANGED = {
    "image": "unchanged",
    "model": "unchanged",
    "unit": "unchanged",
    "restart": "unchanged",
    "serving": "unchanged",
}


def test_a_converged_host_costs_one_ssh_command_and_no_operation(
    setting: Setting, in_process: Any
) -> None:
    first = in_process("gpu1", "gpu2")
    assert {n: r["outcome"] for n, r in first["results"].items()} == {
        "gpu1": "changed",
        "gpu2": "changed",
    }
    assert first["tokens"] == 1  # both hosts download: looked up once
    assert first["deploys"] == {"gpu1": 1, "gpu2": 1}
    again = in_process("gpu1", "gpu2")
    for name in ("gpu1", "gpu2"):
        r = again["results"][name]
        assert r["outcome"] == "unchanged" and r["ok"]
        assert r["steps"] == ALL_UNCHANGED
        assert r["addresses"] == ["127.0.0.1:8080"]
    assert again["commands"] == {"gpu1": 1, "gpu2": 1}  # the survey, nothing else
    assert again["deploys"] == {} and again["tokens"] == 0
    dry = in_process("gpu1", "gpu2", dry=True)
    assert {n: r["outcome"] for n, r in dry["results"].items()} == {
        "gpu1": "no change",
        "gpu2": "no change",
    }
    assert dry["commands"] == {"gpu1": 1, "gpu2": 1} and dry["deploys"] == {}
    # a server that stopped answering is not converged: its serving step runs, on it alone
    setting.ssh("gpu2", f"systemctl stop {UNIT}.service")
    healed = in_process("gpu1", "gpu2")
    assert healed["results"]["gpu1"]["outcome"] == "unchanged"
    assert healed["commands"]["gpu1"] == 1 and healed["deploys"] == {"gpu2": 1}
    steps = healed["results"]["gpu2"]["steps"]
    assert steps["serving"] == "changed" and steps["model"] == "unchanged", steps
    assert healed["tokens"] == 0  # nothing to download
    health = "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8080/health"
    assert setting.ssh("gpu2", health).stdout == "200"


def test_dry_run_shows_the_unit_diff_and_reads_only_the_changing_unit(
    setting: Setting, in_process: Any
) -> None:
    rc, _, out = setting.cli("--json")
    assert rc == 0, out
    setting.write(context=1024)
    rc, _, text = setting.cli("--dry-run", "--limit", "gpu1")
    assert rc == 0, text
    assert "gpu1: would change" in text
    assert f"--- /etc/containers/systemd/{UNIT}.container (on gpu1)" in text
    assert f"+++ /etc/containers/systemd/{UNIT}.container (rendered)" in text
    minus = [ln for ln in text.splitlines() if ln.strip().startswith("-Exec")]
    plus = [ln for ln in text.splitlines() if ln.strip().startswith("+Exec")]
    assert minus and plus and '"-c" "1024"' in plus[0] and '"-c" "4096"' in minus[0], text
    dry = in_process("gpu1", "gpu2", dry=True)
    assert dry["results"]["gpu1"]["steps"] == {
        "image": "no change",
        "model": "no change",
        "unit": "would change",
        "restart": "would change",
        "serving": "no change",
    }
    assert dry["commands"] == {"gpu1": 2, "gpu2": 2}  # the survey, the changing unit's text
    assert dry["deploys"] == {}
    unit = setting.ssh("gpu1", f"cat /etc/containers/systemd/{UNIT}.container").stdout
    assert '"-c" "4096"' in unit  # nothing was changed


def _watch(setting: Setting, host: str) -> Watch:
    setting.ssh(host, f"mkdir -p {BLOBS}")
    netns = next(h["netns"] for h in setting.hosts_json["hosts"] if h["name"] == host)
    return Watch(guest_root(netns) / BLOBS.lstrip("/"))


def test_bytes_are_hashed_as_they_arrive_pulled_and_pushed(setting: Setting) -> None:
    sha = setting.hosts_json["tiny_gguf"]["sha256"]
    watches = {h: _watch(setting, h) for h in ("gpu1", "gpu2")}
    try:
        rc, doc, out = setting.cli("--json", "--limit", "gpu1", "--transfer", "pull")
        assert rc == 0, out
        rc, doc, out = setting.cli("--json", "--limit", "gpu2", "--transfer", "push")
        assert rc == 0, out
        assert "model: sent 520800 bytes (resumed from 0)" in doc["hosts"][0]["transfer"]
        for host, watch in watches.items():
            partial = f"{sha}.incomplete"
            assert watch.writes(partial) > 0, host
            assert watch.reads_after_last_write(partial) == 0, host
    finally:
        for watch in watches.values():
            watch.close()
    for host in ("gpu1", "gpu2"):
        listing = setting.ssh(host, f"ls -A {BLOBS}").stdout.split()
        assert listing == [sha], (host, listing)  # no partial, no hash record left behind


def test_downloads_and_pushes_stop_at_size_bytes(setting: Setting) -> None:
    size = setting.hosts_json["tiny_gguf"]["size"]
    data = tiny_recipe(setting.hosts_json, TINY_COMMIT)
    data["model"]["size_bytes"] = size - 800  # the server's file is 800 bytes longer
    write_catalog(setting.catalog, data)
    rc, doc, out = setting.cli("--json", "--limit", "gpu1", "--transfer", "pull")
    assert rc == 1 and doc["hosts"][0]["outcome"] == "failed", out
    assert f"announced more than the recipe's {size - 800} bytes" in out
    assert setting.ssh("gpu1", f"ls -A {BLOBS} 2>/dev/null", check=False).stdout == ""
    # the controller's own copy is longer than size_bytes (stamped as verified): the host takes
    # size_bytes + 1 and refuses it
    recipe = load_catalog(setting.catalog).find("tiny")[0].recipe
    paths = model_paths(setting.env["HF_HUB_CACHE"], recipe)
    blob = Path(paths.blob)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(Path(setting.hosts_json["tiny_gguf"]["path"]).read_bytes())
    st = blob.stat()
    Path(paths.stamp).parent.mkdir(parents=True)
    Path(paths.stamp).write_text(paths.stamp_text(st.st_size, int(st.st_mtime)) + "\n")
    rc, doc, out = setting.cli("--json", "--limit", "gpu2", "--transfer", "push")
    assert rc == 1 and doc["hosts"][0]["outcome"] == "failed", out
    assert f"longer than the recipe's {size - 800} bytes" in out and "refused and deleted" in out
    assert setting.ssh("gpu2", f"ls -A {BLOBS} 2>/dev/null", check=False).stdout == ""
    assert os.path.exists(paths.blob)  # the controller's file is the operator's to fix
    assert TINY_REPO in json.dumps(data)
