"""doctor, plan, deploy --dry and run --dry-run agree, for every GPU stand-in profile: the same
recipe, the same cards, the same port and address, and doctor's verdict is deploy's. They
compute one host plan (hostplan.plan_host); this drives all four as an operator would, on real
test hosts (run --dry-run on this machine, with the profile's recorded nvidia-smi)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.hostplan.plan import CARD_CHECKS  # what refuses a card: one list
from tests.hosts.fleet import cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT

pytestmark = pytest.mark.hosts

PROFILES_DIR = Path(__file__).parent / "hosts" / "profiles"
PROFILES = sorted(p.name for p in PROFILES_DIR.iterdir() if (p / "profile.json").is_file())
PORT = 8099  # a flag: it must win over every default, everywhere


def _json(*args: str, env: dict[str, str], ok: tuple[int, ...] = (0, 1)) -> Any:
    proc = cli(*args, "--json", env=env, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in ok, proc.stdout + proc.stderr
    return json.loads(proc.stdout) if proc.stdout.startswith("{") else None


def _local_run(profile: str, catalog: Path, tmp: Path, hf: HFServer) -> Any:
    """run --dry-run --json on this machine, nvidia-smi replaying the profile's recording."""
    bin_dir = tmp / f"bin-{profile}"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    standin = PROFILES_DIR / profile / "root" / "usr" / "share" / "nvidia-standin"
    if standin.is_dir():  # no-smi: no nvidia-smi at all
        shutil.copy(PROFILES_DIR / "_standin" / "nvidia-smi", smi)
        smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    path = os.environ["PATH"] if standin.is_dir() else "/usr/sbin:/usr/bin:/sbin:/bin"
    env = {
        "PATH": f"{bin_dir}:{path}",
        "NVIDIA_STANDIN_DIR": str(standin),
        "HF_ENDPOINT": hf.url,
        "HF_HUB_CACHE": str(tmp / f"hub-{profile}"),
    }
    proc = cli(
        "run",
        "tiny",
        "--recipes",
        str(catalog),
        "--dry-run",
        "--port",
        str(PORT),
        "--json",
        env=env,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.startswith("{") else None)


def test_four_commands_agree_on_every_profile(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    legacy_host: Host,
    profile: Any,
    hf: HFServer,
) -> None:
    hosts = [*gpu_hosts, legacy_host]
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    inventory = write_inventory(tmp_path / "inventory.py", hosts)
    env = {"HF_ENDPOINT": hf.url, "NO_COLOR": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    common = ("-i", str(inventory), "--recipes", str(catalog))
    seen: set[str] = set()
    for start in range(0, len(PROFILES), len(hosts)):
        batch = dict(
            zip((h.name for h in hosts), PROFILES[start : start + len(hosts)], strict=False)
        )
        for name, prof in batch.items():
            profile(name, prof)
        doctor = _json("doctor", *common, "tiny", "--port", str(PORT), env=env)
        plan = _json("plan", *common, "tiny", "--port", str(PORT), env=env)
        dry = _json("deploy", *common, "tiny", "--dry", "--port", str(PORT), env=env)
        d_hosts = {h["host"]: h for h in doctor["hosts"]}
        p_rows: dict[str, list[dict[str, Any]]] = {}
        for row in plan["models"][0]["placements"]:
            p_rows.setdefault(row["host"], []).append(row)
        x_hosts = {h["host"]: h for h in dry["hosts"]}
        for name, prof in batch.items():
            seen.add(prof)
            why = f"profile {prof} on {name}"
            (d,) = d_hosts[name]["results"]
            x = x_hosts[name]
            # doctor's verdict is deploy's: the same ok, the same failed checks
            d_failed = [(c["id"], c["evidence"]) for c in d["checks"] if c["status"] == "fail"]
            x_failed = [(c["id"], c["evidence"]) for c in x["failed_checks"]]
            assert d["ok"] == x["ok"], why
            assert d_failed == x_failed, why
            assert x["outcome"] in (("would change", "no change") if d["ok"] else ("skipped",))
            # the same recipe, cards and addresses
            assert d["recipe"] == x["recipe"], why
            addresses = [i["address"] for i in d["instances"]]
            # one instance per card, from the flag's port on
            assert addresses == [f"127.0.0.1:{PORT + k}" for k in range(len(addresses))], why
            if d["ok"]:
                assert x["addresses"] == addresses, why
            cards = [u for i in d["instances"] for u in i["gpu_uuids"]]
            assert cards == d["gpu_uuids"], why
            rows = p_rows[name]
            placed = sorted(r["gpu"]["uuid"] for r in rows if r["ok"])
            if d["ok"]:
                # one memory verdict: plan places exactly the cards doctor counts
                assert placed == sorted(cards), why
                assert {r["recipe"] for r in rows if r["ok"]} == {d["recipe"]}, why
            else:
                assert placed == [], why
            # run --dry-run on this machine, same recording: the same recipe, cards, address
            rc, run = _local_run(prof, catalog, tmp_path, hf)
            card_fail = [i for i, _ in d_failed if i in CARD_CHECKS]
            if card_fail:
                assert rc == 1 and run is not None and run["ok"] is False, why  # JSON refusal
                continue
            # a dry run exits as the real run would: 1 where this machine itself lacks what a
            # run needs beyond the recording (the toolkit, a CDI spec), with the same plan
            assert run is not None and rc in (0, 1) and "recipe" in run, (why, rc, run)
            assert run["recipe"] == d["recipe"], why
            assert run["gpu_uuids"] == cards[:1], why  # a foreground run: the first card
            assert run["address"] == f"127.0.0.1:{PORT}" == addresses[0], why
    assert seen == set(PROFILES)
