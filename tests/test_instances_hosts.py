"""One llama-server per matching card, on real test hosts: two P100 stand-ins serve two
instances on two ports (one card each, one shared model file), a second deploy changes nothing,
scaling 2 -> 1 removes one and leaves the other running as it was; plan, deploy --dry and doctor
agree on the instances of 2-card, 4-card and mixed P100 + H200 hosts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner

pytestmark = pytest.mark.hosts

BASE = "tensorless-tiny-p100"
TINY_FILE = "tiny-llama.gguf"
P100_A = "GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90"
P100_B = "GPU-a7d41c9e-2b35-4f86-8e1a-5c9b0d3e6f21"


def _run(*args: str, env: dict[str, str]) -> tuple[int, Any]:
    proc = cli(*args, "--json", env=env, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith("{"), proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _complete(ssh: SshRunner, host: str, port: int) -> dict[str, Any]:
    body = json.dumps({"prompt": "hello", "max_tokens": 4, "temperature": 0})
    out = ssh(
        host,
        f"curl -fsS -H 'Content-Type: application/json' -d '{body}' "
        f"http://127.0.0.1:{port}/v1/completions",
        timeout=60,
    ).stdout
    answer: dict[str, Any] = json.loads(out)
    return answer


def _started(ssh: SshRunner, host: str, name: str) -> str:
    return str(ssh(host, f"podman inspect --format '{{{{.State.StartedAt}}}}' {name}").stdout)


def test_two_cards_two_instances_then_scale_down(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    profile: Any,
    ssh: SshRunner,
    hf: HFServer,
) -> None:
    gpu1 = gpu_hosts[0]
    profile(gpu1, "p100x2")
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    env = {"HF_ENDPOINT": hf.url}

    def deploy(*extra: str, instances: object = None) -> tuple[int, Any]:
        data = {} if instances is None else {gpu1.name: {"tensorless_instances": instances}}
        inventory = write_inventory(tmp_path / "inventory.py", [gpu1], data=data)
        return _run(
            "deploy", "-i", str(inventory), "tiny", "--recipes", str(catalog), *extra, env=env
        )

    rc, report = deploy()
    (host,) = report["hosts"]
    assert rc == 0 and host["outcome"] == "changed", report
    assert host["addresses"] == ["127.0.0.1:8080", "127.0.0.1:8081"]
    # one download, one hash, for both instances
    assert hf.stats(TINY_REPO, TINY_FILE).bytes_sent == hosts_json["tiny_gguf"]["size"]
    for name, port, uuid in ((BASE, 8080, P100_A), (f"{BASE}-1", 8081, P100_B)):
        assert _complete(ssh, gpu1.name, port)["model"] == TINY_REPO
        # the container sees exactly one card: its own CDI device, nothing else
        nodes = ssh(gpu1.name, f"podman exec {name} sh -c 'ls /dev/nvidia[0-9]*'").stdout.split()
        assert nodes == ["/dev/nvidia0" if uuid == P100_A else "/dev/nvidia1"], (name, nodes)
        unit = ssh(gpu1.name, f"cat /etc/containers/systemd/{name}.container").stdout
        assert f"AddDevice=nvidia.com/gpu={uuid}\n" in unit and unit.count("AddDevice=") == 1
        assert f'"--port" "{port}"' in unit
    before = _started(ssh, gpu1.name, BASE)

    hf.reset_stats()
    rc, again = deploy()
    assert rc == 0 and again["hosts"][0]["outcome"] == "unchanged", again
    assert {s["outcome"] for s in again["hosts"][0]["steps"]} == {"unchanged"}
    assert hf.stats(TINY_REPO, TINY_FILE).bytes_sent == 0

    # dry run of the scale-down names the surplus instance, changes nothing
    rc, dry = deploy("--dry", instances=1)
    steps = {s["name"]: s["outcome"] for s in dry["hosts"][0]["steps"]}
    assert rc == 0 and steps[f"remove {BASE}-1"] == "would change", steps
    assert steps["unit"] == "no change" and dry["hosts"][0]["addresses"] == ["127.0.0.1:8080"]
    assert _complete(ssh, gpu1.name, 8081)["model"] == TINY_REPO

    rc, down = deploy(instances=1)
    assert rc == 0 and down["hosts"][0]["outcome"] == "changed", down
    assert ssh(gpu1.name, f"ls /etc/containers/systemd/{BASE}-1.container", check=False).returncode
    assert ssh(gpu1.name, f"podman container exists {BASE}-1", check=False).returncode == 1
    assert _started(ssh, gpu1.name, BASE) == before  # the remaining instance never restarted
    assert _complete(ssh, gpu1.name, 8080)["model"] == TINY_REPO
    rc, converged = deploy(instances=1)
    assert rc == 0 and converged["hosts"][0]["outcome"] == "unchanged", converged

    # status reports each instance; stop removes every instance of the model
    rc, _ = deploy(instances=[0, 1])
    assert rc == 0
    inventory = write_inventory(tmp_path / "inventory.py", [gpu1])
    rc, status = _run("status", "-i", str(inventory), "--recipes", str(catalog), env=env)
    units = {u["unit"]: u for u in status["hosts"][0]["units"]}
    assert set(units) == {BASE, f"{BASE}-1"} and all(u["healthy"] for u in units.values())
    assert units[f"{BASE}-1"]["address"] == "127.0.0.1:8081"
    rc, stopped = _run("stop", "tiny", "-i", str(inventory), "--recipes", str(catalog), env=env)
    assert rc == 0, stopped
    left = ssh(gpu1.name, "ls /etc/containers/systemd/ | grep tensorless", check=False).stdout
    assert left == ""


def test_instances_asked_for_are_refused_when_the_cards_are_not_there(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    profile: Any,
    hf: HFServer,
) -> None:
    gpu1 = gpu_hosts[0]
    profile(gpu1, "p100x2")
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    for instances, why in (
        (3, "3 instance(s) asked, but 2 usable card(s) here"),
        ([0, 5], "GPU 5 is not a usable card here"),
    ):
        data = {gpu1.name: {"tensorless_instances": instances}}
        inventory = write_inventory(tmp_path / "inventory.py", [gpu1], data=data)
        rc, doctor = _run(
            "doctor",
            "-i",
            str(inventory),
            "tiny",
            "--recipes",
            str(catalog),
            env={"HF_ENDPOINT": hf.url},
        )
        (result,) = doctor["hosts"][0]["results"]
        check = next(c for c in result["checks"] if c["id"] == "instances.cards")
        assert rc == 1 and check["status"] == "fail" and why in check["evidence"], check
        assert check["fix"]


def test_plan_dry_deploy_and_doctor_agree_on_instances(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    profile: Any,
    hf: HFServer,
) -> None:
    """2 and 4 P100s and a P100 beside an H200: the same instances (cards and addresses) in
    all three; the mixed host serves only on its P100."""
    shapes = {"p100x2": 2, "p100x4": 4, "p100-h200": 1}
    hosts = gpu_hosts[: len(shapes)]
    for h, name in zip(hosts, shapes, strict=True):
        profile(h, name)
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    inventory = write_inventory(tmp_path / "inventory.py", hosts)
    env = {"HF_ENDPOINT": hf.url, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    common = ("-i", str(inventory), "tiny", "--recipes", str(catalog))
    _, doctor = _run("doctor", *common, env=env)
    _, dry = _run("deploy", *common, "--dry", env=env)
    _, plan = _run("plan", *common, env=env)
    d = {h["host"]: h["results"][0] for h in doctor["hosts"]}
    x = {h["host"]: h for h in dry["hosts"]}
    rows: dict[str, list[dict[str, Any]]] = {}
    for row in plan["models"][0]["placements"]:
        rows.setdefault(row["host"], []).append(row)
    for h, name in zip(hosts, shapes, strict=True):
        n = shapes[name]
        inst = d[h.name]["instances"]
        assert d[h.name]["ok"] and len(inst) == n, (name, d[h.name])
        assert [i["name"] for i in inst] == [BASE] + [f"{BASE}-{k}" for k in range(1, n)]
        assert [i["address"] for i in inst] == [f"127.0.0.1:{8080 + k}" for k in range(n)]
        assert all(len(i["gpu_uuids"]) == 1 for i in inst)
        assert x[h.name]["addresses"] == [i["address"] for i in inst], name
        assert sorted(r["gpu"]["uuid"] for r in rows[h.name] if r["ok"]) == sorted(
            i["gpu_uuids"][0] for i in inst
        ), name
