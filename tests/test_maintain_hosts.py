"""The maintenance window (``maintain begin`` / ``maintain end``, docs/maintain.md) on the real
test hosts, driven as an operator would: the CLI as a subprocess, the driver updated by hand
with apt between the phases, a real reboot in between, the outcome read back over SSH.

* persist1 (it can reboot), a healthy P100 on 535.183.01 installed as packages from a signed
  apt repository that also has 535.216.03, 580 and 590: prepare locks the branch; begin stops
  and holds the unit (a start by hand, a deploy and the boot do not start it); the operator's
  ``apt-get install --only-upgrade`` takes 535.216.03, not 590, and the host reboots; end
  regenerates the stale CDI spec, reruns doctor, starts the unit healthy and benches it
  against the receipt; the window's record and drop-in are gone;
* gpu3: a 590 driver installed in the window (it ignores the P100): end refuses, naming
  driver.branch with its fix, and the unit stays stopped, the window open; back on 535, end
  serves again. An end without a window is one clear line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.facts.maintain import MAINTENANCE_RECORD, hold_dropin
from tests.doc_tests import blocks, json_problems, normalize, output_diff, output_matches
from tests.hosts.apt_repo import RepoServer, build_repo
from tests.hosts.fleet import cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host, apply_profile
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner
from tests.test_pascal_hosts import DRIVER_KEYRING, DRIVER_SOURCE, UNDRIVER

pytestmark = pytest.mark.hosts

DOC = Path(__file__).parent.parent / "docs" / "maintain.md"
UNIT = "tensorless-tiny-p100"
SERVICE = f"{UNIT}.service"
AS_IN_DOC = {"persist1": "gpu1"}  # the page's host
HEALTH = "curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.1:8080/health"


@dataclass
class Window:
    inventory: Path
    catalog: Path
    env: dict[str, str]
    ssh: SshRunner
    repo: RepoServer

    def run(self, *args: str, timeout: float = 400) -> tuple[int, Any, str]:
        argv = [args[0], "-i", str(self.inventory), "--recipes", str(self.catalog), *args[1:]]
        proc = cli(*argv, env=self.env, timeout=timeout)
        out = proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr, out
        doc = json.loads(proc.stdout) if "--json" in args else None
        return proc.returncode, doc, out

    def sh(self, host: str, cmd: str, check: bool = True, timeout: float = 180) -> str:
        return str(self.ssh(host, cmd, check=check, timeout=timeout).stdout)

    def install_driver(self, host: str, version: str) -> None:
        self.sh(
            host,
            f"curl -fsS {self.repo.url}/gpgkey | gpg --dearmor > {DRIVER_KEYRING} && "
            f"echo 'deb [signed-by={DRIVER_KEYRING}] {self.repo.driver_url} ./' > {DRIVER_SOURCE}"
            " && apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install "
            f"-y -q nvidia-driver={version} libcuda1={version} >/dev/null",
        )


@pytest.fixture
def window(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    ssh: SshRunner,
    hf: HFServer,
    clean_hosts: None,
) -> Iterator[Window]:
    srv = RepoServer(build_repo(tmp_path / "repo"), hosts_json["gateway"]).start()
    hosts = [test_hosts["persist1"], test_hosts["gpu3"]]
    inventory = write_inventory(tmp_path / "inventory.py", hosts)
    recipe = tiny_recipe(hosts_json, TINY_COMMIT)
    # a receipt the shared CPU meets under load: the bench's verdict is bench's own test
    recipe["receipt"]["decode_tps"] = {"short": 1.0}
    catalog = write_catalog(tmp_path / "recipes", recipe)
    env = {"HF_ENDPOINT": hf.url, "NO_COLOR": "1", "TENSORLESS_LOG_DIR": str(tmp_path / "logs")}
    for h in hosts:
        apply_profile(h, "p100")
    yield Window(inventory, catalog, env, ssh, srv)
    for h in hosts:
        ssh(h, UNDRIVER, timeout=180)
        apply_profile(h, str(h.extra.get("default_profile", h.profile)))
    srv.stop()


def _doc_block(lang: str) -> str:
    found = [b.body for b in blocks(DOC) if b.lang == lang and b.mark and b.mark.kind == "by"]
    assert len(found) == 1, f"docs/maintain.md: one ```{lang} block marked by this test"
    return found[0]


def _doc_output(command: str) -> list[str]:
    """The lines docs/maintain.md shows under ``$ tensorless-deploy maintain COMMAND ...``."""
    lines, out, inside = _doc_block("console").splitlines(), [], False
    for line in lines:
        if line.startswith("$ "):
            inside = line.startswith(f"$ tensorless-deploy maintain {command} ")
            continue
        if inside:
            out.append(line)
    assert out, f"docs/maintain.md shows no output of maintain {command}"
    return out


def _held(w: Window, host: str) -> None:
    """The unit is stopped, and held: a start by hand does not start it."""
    assert w.sh(host, f"systemctl is-active {SERVICE}", check=False).strip() == "inactive"
    w.sh(host, f"systemctl start {SERVICE}")
    time.sleep(1)
    assert w.sh(host, f"systemctl is-active {SERVICE}", check=False).strip() == "inactive"
    assert w.sh(host, f"systemctl show -p ConditionResult --value {SERVICE}").strip() == "no"
    assert w.sh(host, HEALTH, check=False) == "000"


def test_a_window_around_a_driver_update_and_a_reboot(
    window: Window, reboot: Any, persist_host: Host
) -> None:
    w = window
    w.install_driver("persist1", "535.183.01-1")
    rc, _, out = w.run("deploy", "tiny", "--limit", "persist1")
    assert rc == 0 and w.sh("persist1", HEALTH) == "200", out
    rc, _, out = w.run("prepare", "--limit", "persist1")
    assert rc == 0 and "driver.lock" in out, out

    t0 = time.monotonic()
    rc, _, out = w.run("maintain", "begin", "--limit", "persist1")
    begin_s = time.monotonic() - t0
    assert rc == 0, out
    shown = normalize(out, AS_IN_DOC)
    assert output_matches(_doc_output("begin"), shown), output_diff(_doc_output("begin"), shown)
    assert "sudo apt-get install --only-upgrade libcuda1 nvidia-driver" in out
    _held(w, "persist1")
    record = json.loads(w.sh("persist1", f"cat {MAINTENANCE_RECORD}"))
    assert record["driver"] == "535.183.01" and [u["name"] for u in record["units"]] == [UNIT]
    # begin again: the same window, the record as it was
    rc, again, out = w.run("maintain", "begin", "--limit", "persist1", "--json")
    assert rc == 0 and again["hosts"][0]["outcome"] == "already open", out
    assert json.loads(w.sh("persist1", f"cat {MAINTENANCE_RECORD}")) == record
    # nothing deploys into an open window
    rc, deployed, out = w.run("deploy", "tiny", "--limit", "persist1", "--json")
    (h,) = deployed["hosts"]
    assert rc == 1 and h["outcome"] == "skipped" and h["steps"] == [], out
    assert "host.maintenance" in [c["id"] for c in h["failed_checks"]], h
    rc, doctor, out = w.run("doctor", "--limit", "persist1", "--json")
    (result,) = doctor["hosts"][0]["results"]
    row = {c["id"]: c for c in result["checks"]}["host.maintenance"]
    assert rc == 1 and row["status"] == "fail" and "maintain end" in row["fix"], row

    # the operator's part: update within the branch (the pin keeps 590 out), then reboot
    w.sh("persist1", "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --only-upgrade "
         "nvidia-driver libcuda1 >/dev/null")  # fmt: skip
    got = w.sh("persist1", "dpkg-query -W -f '${Version}' nvidia-driver")
    assert got == "535.216.03-1", got
    apply_profile(persist_host, "p100-updated")
    r = reboot(persist_host)
    assert r.new_boot_id != r.old_boot_id
    # a real driver makes its device nodes and /proc/driver again at boot; the stand-in's went
    apply_profile(persist_host, "p100-updated")
    time.sleep(3)
    assert w.sh("persist1", f"systemctl is-active {SERVICE}", check=False).strip() == "inactive"
    assert w.sh("persist1", f"systemctl show -p ConditionResult --value {SERVICE}").strip() == "no"
    assert "host-driver-version=535.183.01" in w.sh("persist1", "cat /etc/cdi/nvidia.yaml")

    t0 = time.monotonic()
    rc, _, out = w.run("maintain", "end", "--limit", "persist1", "--runs", "1")
    end_s = time.monotonic() - t0
    assert rc == 0, out
    shown = normalize(out, AS_IN_DOC)
    assert output_matches(_doc_output("end"), shown), output_diff(_doc_output("end"), shown)
    assert "host-driver-version=535.216.03" in w.sh("persist1", "cat /etc/cdi/nvidia.yaml")
    assert w.sh("persist1", HEALTH) == "200"
    gone = f"[ ! -e {MAINTENANCE_RECORD} ] && [ ! -e {hold_dropin(SERVICE)} ] && echo gone"
    assert w.sh("persist1", gone).strip() == "gone"
    rc, doctor, out = w.run("doctor", "--limit", "persist1", "tiny", "--json")
    (result,) = doctor["hosts"][0]["results"]
    ids = {c["id"]: c["status"] for c in result["checks"]}
    assert rc == 0 and "host.maintenance" not in ids and ids["toolkit.cdi"] == "ok", out
    print(
        f"\nmaintain begin {begin_s:.1f} s; maintain end (CDI, doctor, start, bench) {end_s:.1f} s"
    )


def test_end_refuses_a_driver_that_ignores_the_card_and_keeps_the_window(window: Window) -> None:
    w = window
    rc, _, out = w.run("maintain", "end", "--limit", "gpu3")
    assert rc == 1 and "not in a maintenance window (nothing to end)" in out, out
    rc, _, out = w.run("deploy", "tiny", "--limit", "gpu3")
    assert rc == 0, out
    rc, _, out = w.run("maintain", "begin", "--limit", "gpu3")
    assert rc == 0, out
    # the operator installed the 590 branch: it loads and ignores the P100
    apply_profile(w.ssh.host("gpu3"), "p100-590")
    rc, ended, out = w.run("maintain", "end", "--limit", "gpu3", "--json")
    assert rc == 1, out
    (h,) = ended["hosts"]
    assert h["outcome"] == "refused" and h["started"] == [], h
    failed = {c["id"]: c for c in h["failed_checks"]}
    assert "install the 580 branch" in failed["driver.branch"]["fix"], failed
    assert h["driver"]["branch_changed"] is True and h["driver"]["after"] == "590.44.01", h
    _held(w, "gpu3")
    assert w.sh("gpu3", f"[ -f {MAINTENANCE_RECORD} ] && echo open").strip() == "open"
    rc, _, text = w.run("maintain", "end", "--limit", "gpu3", "--runs", "0")
    assert rc == 1 and "FAIL driver.branch" in text and "fix: install the 580 branch" in text
    # back on the branch the card supports: the window closes and the unit serves
    apply_profile(w.ssh.host("gpu3"), "p100")
    rc, back, out = w.run("maintain", "end", "--limit", "gpu3", "--json", "--runs", "1")
    assert rc == 0, out
    (h,) = back["hosts"]
    assert h["outcome"] == "ended" and h["started"] == [UNIT], h
    assert h["driver"] == {
        "before": "535.183.01",
        "after": "535.183.01",
        "branch_before": 535,
        "branch_after": 535,
        "branch_changed": False,
    }
    steps = {s["name"]: s["outcome"] for s in h["steps"]}
    assert steps[f"start {UNIT}"] == "changed" and steps["close the window"] == "changed", steps
    (bench,) = back["bench"]["results"]
    assert bench["runs"] == 1 and bench["comparisons"][0]["key"] == "decode_tps.short", bench
    assert json_problems(json.loads(_doc_block("json")), [ended, back]) == []
    assert w.sh("gpu3", HEALTH) == "200"
    rc, _, out = w.run("maintain", "begin")
    assert rc == 2 and "--limit HOST" in out, out
