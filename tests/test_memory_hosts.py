"""One memory verdict, on real test hosts: plan, doctor and deploy refuse the same full card
with the same numbers, deploy puts no instance there (the host says so), and memory held by the
model's own running instance counts as free when the model is deployed again, while the same
memory held by anything else refuses the card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner

pytestmark = pytest.mark.hosts

BASE = "tensorless-tiny-p100"
P100_0 = "GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90"
STANDIN = "/usr/share/nvidia-standin/smi"


def _json(*args: str, env: dict[str, str]) -> tuple[int, Any]:
    proc = cli(*args, "--json", env=env, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith("{"), proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _memory(checks: list[dict[str, Any]]) -> dict[str, Any]:
    return next(c for c in checks if c["id"] == "memory.fit")


def _units(ssh: SshRunner, host: str) -> list[str]:
    out = ssh(host, "ls /etc/containers/systemd/ /etc/systemd/system/ 2>/dev/null").stdout
    return sorted(
        w
        for w in out.split()
        if w.endswith((".container", ".service")) and w.startswith("tensorless-")
    )


def _setup(tmp_path: Path, hosts_json: dict[str, Any], host: Host, hf: HFServer) -> tuple[Any, ...]:
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    inventory = write_inventory(tmp_path / "inventory.py", [host])
    env = {"HF_ENDPOINT": hf.url, "NO_COLOR": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return ("-i", str(inventory), "--recipes", str(catalog)), env


def test_plan_doctor_and_deploy_refuse_the_full_card_with_the_same_numbers(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    profile: Any,
    ssh: SshRunner,
    hf: HFServer,
) -> None:
    gpu1 = gpu_hosts[0]
    profile(gpu1, "mixed")  # P100 0 empty, P100 1 with 15876 of 16384 MiB used, a T4
    common, env = _setup(tmp_path, hosts_json, gpu1, hf)

    rc, plan = _json("plan", *common, "tiny", env=env)
    assert rc == 0
    rows = {p["gpu"]["index"]: p for p in plan["models"][0]["placements"]}
    assert rows[0]["ok"]
    full = rows[1]
    assert full["error_code"] == "no_valid_placement" and "usable" in full["error"]

    rc, doctor = _json("doctor", *common, "tiny", env=env)
    assert rc == 0, doctor
    result = doctor["hosts"][0]["results"][0]
    memory = _memory(result["checks"])
    assert memory["status"] == "warn" and full["error"] in memory["evidence"]
    assert [i["gpu_uuids"] for i in result["instances"]] == [[P100_0]]

    rc, deployed = _json("deploy", *common, "tiny", env=env)
    assert rc == 0, deployed
    assert _units(ssh, gpu1.name) == [f"{BASE}.container"]  # GPU 1 got no instance
    unit = ssh(gpu1.name, f"cat /etc/containers/systemd/{BASE}.container").stdout
    assert f"AddDevice=nvidia.com/gpu={P100_0}" in unit
    assert ssh(gpu1.name, "curl -fsS http://127.0.0.1:8080/health").returncode == 0

    # asking for the full card: every command refuses it, naming why; the host is untouched
    rc, doctor = _json("doctor", *common, "tiny", "--instances", "1,0", env=env)
    assert rc == 1
    checks = doctor["hosts"][0]["results"][0]["checks"]
    cards = next(c for c in checks if c["id"] == "instances.cards")
    assert cards["status"] == "fail" and "GPU 1 does not fit" in cards["evidence"]
    before = ssh(gpu1.name, f"systemctl show -p ActiveEnterTimestamp {BASE}").stdout
    rc, deployed = _json("deploy", *common, "tiny", "--instances", "1,0", env=env)
    assert rc != 0 and deployed["hosts"][0]["outcome"] == "skipped"
    assert "GPU 1 does not fit" in deployed["hosts"][0]["reason"]
    assert ssh(gpu1.name, f"systemctl show -p ActiveEnterTimestamp {BASE}").stdout == before
    assert _units(ssh, gpu1.name) == [f"{BASE}.container"]


def _fill_card(ssh: SshRunner, host: str, pid: int, mib: int) -> None:
    """Stand in for the driver: GPU 0 holds `mib` MiB, all of it by process `pid`."""
    gpus = ssh(host, f"cat {STANDIN}/gpus.tsv").stdout.splitlines()
    head = gpus[0].split("\t")
    used, free = head.index("memory.used"), head.index("memory.free")
    rows = [gpus[0]]
    for line in gpus[1:]:
        cells = line.split("\t")
        cells[used], cells[free] = str(mib + 2), str(16384 - mib - 2)
        rows.append("\t".join(cells))
    apps = f"gpu_uuid\tpid\tused_memory\tprocess_name\n{P100_0}\t{pid}\t{mib}\tllama-server\n"
    ssh(host, f"cat > {STANDIN}/gpus.tsv", input="\n".join(rows) + "\n")
    ssh(host, f"cat > {STANDIN}/apps.tsv", input=apps)


def test_the_models_own_instance_is_counted_as_free_and_nothing_else_is(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    profile: Any,
    ssh: SshRunner,
    hf: HFServer,
) -> None:
    gpu1 = gpu_hosts[0]
    profile(gpu1, "p100")
    common, env = _setup(tmp_path, hosts_json, gpu1, hf)
    rc, _ = _json("deploy", *common, "tiny", env=env)
    assert rc == 0
    pid = int(ssh(gpu1.name, f"podman inspect --format '{{{{.State.Pid}}}}' {BASE}").stdout)
    started = ssh(gpu1.name, f"podman inspect --format '{{{{.State.StartedAt}}}}' {BASE}").stdout

    # the card is full, all of it held by the model's own running instance: it fits again
    _fill_card(ssh, gpu1.name, pid, 16000)
    rc, plan = _json("plan", *common, "tiny", env=env)
    assert rc == 0, plan
    row = plan["models"][0]["placements"][0]
    assert row["error"] is None
    assert any("own running instances" in n for n in row["notes"])
    rc, deployed = _json("deploy", *common, "tiny", env=env)
    assert rc == 0 and deployed["hosts"][0]["outcome"] == "unchanged", deployed
    now = ssh(gpu1.name, f"podman inspect --format '{{{{.State.StartedAt}}}}' {BASE}").stdout
    assert now == started

    # the same memory held by a process that is not the model's (PID 1): refused, untouched
    _fill_card(ssh, gpu1.name, 1, 16000)
    rc, plan = _json("plan", *common, "tiny", env=env)
    assert rc == 1
    why = plan["models"][0]["placements"][0]["error"]
    rc, doctor = _json("doctor", *common, "tiny", env=env)
    assert rc == 1
    memory = _memory(doctor["hosts"][0]["results"][0]["checks"])
    assert memory["status"] == "fail" and why in memory["evidence"]
    assert "held by other processes" in memory["evidence"]
    rc, deployed = _json("deploy", *common, "tiny", env=env)
    assert rc != 0 and deployed["hosts"][0]["outcome"] == "skipped"
    assert "memory.fit" in deployed["hosts"][0]["reason"]
    now = ssh(gpu1.name, f"podman inspect --format '{{{{.State.StartedAt}}}}' {BASE}").stdout
    assert now == started
