"""The Pascal guard on the real test hosts (issue 28): what breaks an old P100 fleet, one stand-in
profile each (docs/test-hosts.md), driven through the CLI as an operator would.

* a 590 driver hiding a P100 (p100-590), the open kernel module (p100-open), a card with a
  double-bit error and a page pending retirement (p100-pending), a wedged NVML (p100-hung): doctor
  names each with its fix; deploy refuses each before any change (the host's state read before
  and after over SSH is the same), and does not hang on the wedged one; the healthy P100 passes
  and serves; status shows the cards and the engine's code;
* engine images in the set's registry whose labels or contents hold only PTX for sm_60: refused
  at doctor and deploy before any pull; one with sm_60 machine code passes;
* the driver installed as packages from a signed apt repository with newer branches: prepare
  locks the branch it finds (driver.lock) and never installs, upgrades or removes the driver.
"""

from __future__ import annotations

import difflib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.facts.nvidia import DRIVER_PIN_FILE as PIN_FILE
from tests.hosts.apt_repo import RepoServer, build_repo
from tests.hosts.fleet import cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.pascal import pascal_image
from tests.hosts.plugin import TINY_COMMIT, SshRunner
from tests.test_doctor_hosts import SNAPSHOT

pytestmark = pytest.mark.hosts

# one profile per host: the four failures and the healthy card beside them
PROFILES = {
    "gpu1": "p100-590",
    "gpu2": "p100-open",
    "gpu3": "p100-pending",
    "legacy1": "p100-hung",
    "persist1": "p100",
}
REFUSED = {
    "gpu1": ("driver.branch", "install the 580 branch"),
    "gpu2": ("driver.module", "proprietary kernel module"),
    "gpu3": ("card.pages", "reboot the host"),
    "legacy1": ("gpu.responsive", "nvidia-smi -r"),
}
# what a deploy would change on a host: the snapshot of test_doctor_hosts plus the model tree
STATE = SNAPSHOT + "\nfind /var/lib/tensorless -xdev 2>/dev/null | sort\n"
# podman mounts its overlay storage the first time a command of it needs the store (the survey
# lists the images), and systemd shows the mount as a unit: podman's doing, not a change


def _no_podman_mount(state: str) -> str:
    return "".join(
        line
        for line in state.splitlines(keepends=True)
        if not line.startswith("var-lib-containers-storage-overlay.mount ")
    )


@dataclass
class Pascal:
    tmp: Path
    inventory: Path
    catalog: Path
    env: dict[str, str]
    ssh: SshRunner
    hosts_json: dict[str, Any]

    def run(self, *args: str, timeout: float = 240) -> tuple[int, Any, str]:
        proc = cli(*args, "--recipes", str(self.catalog), env=self.env, timeout=timeout)
        out = proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr, out
        return proc.returncode, json.loads(proc.stdout) if "--json" in args else None, out

    def state(self, hosts: tuple[str, ...]) -> dict[str, str]:
        return {h: _no_podman_mount(self.ssh(h, STATE, timeout=60).stdout) for h in hosts}

    def recipe(self, name: str, **engine: str) -> dict[str, Any]:
        """The tiny recipe under another short name, with another engine (arch, image)."""
        data = tiny_recipe(self.hosts_json, TINY_COMMIT)
        data["model"]["name"] = name
        data["model"]["hf_repo"] = f"tensorless-test/{name}-GGUF"
        data["run"]["alias"] = data["model"]["hf_repo"]
        data["engine"].update(engine)
        return data


@pytest.fixture
def pascal(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    ssh: SshRunner,
    hf: HFServer,
    clean_hosts: None,
) -> Iterator[Pascal]:
    hosts = [test_hosts[n] for n in PROFILES]
    inventory = write_inventory(tmp_path / "inventory.py", hosts)
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    registries = tmp_path / "registries.conf"
    registries.write_text(f'[[registry]]\nlocation = "{hosts_json["registry"]}"\ninsecure = true\n')
    env = {
        "HF_ENDPOINT": hf.url,
        "NO_COLOR": "1",
        "CONTAINERS_REGISTRIES_CONF": str(registries),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # engine-image answers read afresh
    }
    yield Pascal(tmp_path, inventory, catalog, env, ssh, hosts_json)


def _checks(report: dict[str, Any], host: str) -> dict[str, dict[str, Any]]:
    (h,) = [x for x in report["hosts"] if x["host"] == host]
    (r,) = h["results"]
    return {c["id"]: c for c in r["checks"]}


def test_doctor_names_each_failure_with_its_fix_and_deploy_refuses_before_any_change(
    pascal: Pascal, profile: Any
) -> None:
    for host, name in PROFILES.items():
        profile(host, name)
    inv = str(pascal.inventory)

    t0 = time.monotonic()
    rc, report, out = pascal.run("doctor", "-i", inv, "tiny", "--json")
    doctor_s = time.monotonic() - t0
    assert rc == 1, out
    assert doctor_s < 90, f"doctor took {doctor_s:.0f} s: a wedged NVML must cost one bound"
    ready = {h["host"]: h["ok"] for h in report["hosts"]}
    assert ready == {h: h == "persist1" for h in PROFILES}, out
    for host, (check, fix) in REFUSED.items():
        c = _checks(report, host)[check]
        assert c["status"] == "fail" and fix in c["fix"], (host, c)
    b = _checks(report, "gpu1")
    assert "590.44.01 (kernel module, proprietary) is past 580" in b["driver.branch"]["evidence"]
    assert "580.xx Legacy drivers" in b["driver.branch"]["evidence"]
    assert "No devices were found" in b["driver.branch"]["evidence"]
    assert "driver.branch" in b["driver.present"]["evidence"]
    o = _checks(report, "gpu2")["driver.module"]
    assert "open kernel module" in o["evidence"] and "10de:15f8" in o["evidence"], o
    dying = _checks(report, "gpu3")
    assert dying["card.ecc"]["status"] == "fail" and dying["card.xid"]["status"] == "fail"
    assert "Xid 48" in dying["card.xid"]["evidence"]
    assert "GPU hung" in _checks(report, "legacy1")["gpu.responsive"]["evidence"]
    healthy = _checks(report, "persist1")
    assert {healthy[i]["status"] for i in ("driver.branch", "driver.module", "card.health")} == {
        "ok"
    }
    assert "CPU build" in healthy["engine.code"]["evidence"]

    before = pascal.state(tuple(REFUSED))
    t0 = time.monotonic()
    rc, deployed, out = pascal.run("deploy", "-i", inv, "tiny", "--json", timeout=400)
    deploy_s = time.monotonic() - t0
    assert rc == 1, out
    assert deploy_s < 180, f"deploy took {deploy_s:.0f} s"
    print(f"\ndoctor, five hosts, one NVML wedged: {doctor_s:.1f} s; deploy: {deploy_s:.1f} s")
    by_host = {h["host"]: h for h in deployed["hosts"]}
    for host, (check, _) in REFUSED.items():
        assert by_host[host]["outcome"] == "skipped", by_host[host]
        assert check in [c["id"] for c in by_host[host]["failed_checks"]], by_host[host]
        assert by_host[host]["steps"] == []
    after = pascal.state(tuple(REFUSED))
    for host in REFUSED:
        diff = "\n".join(difflib.unified_diff(before[host].splitlines(), after[host].splitlines()))
        assert after[host] == before[host], f"deploy changed {host}:\n{diff}"
    assert by_host["persist1"]["outcome"] == "changed", by_host["persist1"]
    health = pascal.ssh("persist1", "curl -fsS http://127.0.0.1:8080/health", timeout=30)
    assert '"ok"' in health.stdout

    # status: the healthy host serves a CPU engine on healthy cards; the dying card fails it
    rc, status, out = pascal.run("status", "-i", inv, "--json", timeout=120)
    assert rc == 1, out
    hosts = {h["host"]: h for h in status["hosts"]}
    (unit,) = hosts["persist1"]["units"]
    assert unit["state"] == "serving" and unit["engine_code"]["status"] == "ok", unit
    assert {c["id"]: c["status"] for c in hosts["persist1"]["cards"]}.get("card.health") == "ok"
    assert "card.pages" in [c["id"] for c in hosts["gpu3"]["cards"] if c["status"] == "fail"]
    assert "gpu.responsive" in [c["id"] for c in hosts["legacy1"]["cards"]]
    rc, _, text = pascal.run("status", "-i", inv, "--limit", "gpu3", "--limit", "persist1")
    assert rc == 1 and "FAIL card.ecc, card.pages, card.xid" in text, text
    assert "a card fails its health checks (exit 1)" in text


def test_an_engine_without_machine_code_for_the_card_is_refused_before_any_pull(
    pascal: Pascal,
) -> None:
    """gpu1 keeps its healthy P100 (profile p100): the PTX-only image is refused by its labels,
    the unlabelled one by the fatbins of its layers, the sm_60 one passes; deploy pulls
    nothing."""
    images = {v: pascal_image(pascal.hosts_json, v) for v in ("ptx", "ptx-unlabelled", "sm60")}
    write_catalog(
        pascal.catalog,
        pascal.recipe("ptx", arch="sm60", image=images["ptx"]),
        pascal.recipe("blind", arch="sm60", image=images["ptx-unlabelled"]),
        pascal.recipe("native", arch="sm60", image=images["sm60"]),
    )
    inv = str(pascal.inventory)
    rc, report, out = pascal.run("doctor", "-i", inv, "--limit", "gpu1", "ptx", "blind", "native",
                                 "--json")  # fmt: skip
    assert rc == 1, out
    (gpu1,) = report["hosts"]
    codes = {r["model"]: {c["id"]: c for c in r["checks"]}["engine.code"] for r in gpu1["results"]}
    ptx, blind, native = (codes[f"tensorless-test/{n}-GGUF"] for n in ("ptx", "blind", "native"))
    assert ptx["status"] == "fail" and "only PTX for sm_60" in ptx["evidence"], ptx
    assert "labels read from the registry" in ptx["evidence"] and "60-real" in ptx["fix"]
    assert blind["status"] == "fail" and "fatbins of its libggml-cuda" in blind["evidence"], blind
    assert native["status"] == "ok" and "machine code for sm_60" in native["evidence"], native

    before = pascal.state(("gpu1",))
    rc, deployed, out = pascal.run("deploy", "-i", inv, "--limit", "gpu1", "ptx", "--json")
    assert rc == 1, out
    (h,) = deployed["hosts"]
    assert h["outcome"] == "skipped" and h["steps"] == [], h
    assert [c["id"] for c in h["failed_checks"]] == ["engine.code"], h
    assert pascal.state(("gpu1",)) == before, "deploy changed gpu1 (an image pulled?)"
    held = pascal.ssh("gpu1", "podman images --format '{{.Repository}}'").stdout
    assert "pascal" not in held, held


# The stand-in driver as packages (tests/hosts/apt_repo.py), and how to take them off again.
DRIVER_SOURCE = "/etc/apt/sources.list.d/tensorless-test-driver.list"
DRIVER_KEYRING = "/usr/share/keyrings/tensorless-test-driver.gpg"
UNDRIVER = (
    "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q nvidia-driver libcuda1 >/dev/null 2>&1; "
    f"rm -f {DRIVER_SOURCE} {DRIVER_KEYRING} {PIN_FILE} /var/lib/apt/lists/*nvidia-driver*; "
    "apt-get update -q >/dev/null 2>&1; true"
)


@pytest.fixture
def driver_repo(tmp_path: Path, hosts_json: dict[str, Any], ssh: SshRunner) -> Iterator[RepoServer]:
    srv = RepoServer(build_repo(tmp_path / "repo"), hosts_json["gateway"]).start()
    yield srv
    ssh("gpu3", UNDRIVER, timeout=120)
    srv.stop()


def test_prepare_locks_the_driver_branch_it_finds_and_never_moves_the_driver(
    pascal: Pascal, profile: Any, driver_repo: RepoServer
) -> None:
    """gpu3, a healthy P100 on 535.183.01 installed from a signed apt repository that also has
    535.216.03, 580 and 590 (and Ubuntu's nvidia-driver-590): doctor warns driver.lock; prepare
    writes the pin and installs, upgrades or removes nothing; apt then offers only the 535
    branch; doctor passes it; a second prepare changes nothing."""
    profile("gpu3", "p100")
    key = driver_repo.url + "/gpgkey"
    sh = pascal.ssh
    sh("gpu3", f"curl -fsS {key} | gpg --dearmor > {DRIVER_KEYRING} && "
       f"echo 'deb [signed-by={DRIVER_KEYRING}] {driver_repo.driver_url} ./' > {DRIVER_SOURCE} && "
       "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
       "nvidia-driver=535.183.01-1 libcuda1=535.183.01-1 >/dev/null", timeout=180)  # fmt: skip
    installed = "dpkg-query -W -f '${Package}=${Version} ' nvidia-driver libcuda1"
    candidate = "apt-cache policy nvidia-driver | sed -n 's/^ *Candidate: //p'"
    assert sh("gpu3", candidate).stdout.strip() == "590.44.01-1", "no other branch to move to"
    inv = str(pascal.inventory)

    rc, report, out = pascal.run("doctor", "-i", inv, "--limit", "gpu3", "tiny", "--json")
    lock = _checks(report, "gpu3")["driver.lock"]
    assert rc == 0 and lock["status"] == "warn" and "not locked" in lock["evidence"], lock
    assert "prepare" in lock["fix"], lock

    rc, first, out = pascal.run("prepare", "-i", inv, "--limit", "gpu3", "--json", timeout=300)
    assert rc == 0, out
    (h,) = first["hosts"]
    done = {s["check"]: s["outcome"] for s in h["steps"]}
    assert done.get("driver.lock") == "changed", h
    # never installs, upgrades or removes the driver; apt now keeps it on its branch
    assert sorted(sh("gpu3", installed).stdout.split()) == [
        "libcuda1=535.183.01-1",
        "nvidia-driver=535.183.01-1",
    ]
    assert sh("gpu3", candidate).stdout.strip() == "535.216.03-1"
    for pkg in ("nvidia-driver-590", "nvidia-driver=590.44.01-1", "nvidia-driver=580.159.04-1"):
        r = sh("gpu3", f"apt-get install -s {pkg}", check=False)
        assert r.returncode == 100, (pkg, r.stdout)
    upgrade = sh("gpu3", "apt-get -s dist-upgrade").stdout
    assert "Inst nvidia-driver [535.183.01-1] (535.216.03-1" in upgrade, upgrade

    rc, report, out = pascal.run("doctor", "-i", inv, "--limit", "gpu3", "tiny", "--json")
    lock = _checks(report, "gpu3")["driver.lock"]
    assert rc == 0 and lock["status"] == "ok" and "pinned to branch 535" in lock["evidence"], lock

    pin = sh("gpu3", f"sha256sum {PIN_FILE}").stdout
    rc, second, out = pascal.run("prepare", "-i", inv, "--limit", "gpu3", "--json", timeout=300)
    assert rc == 0, out
    (h,) = second["hosts"]
    assert "driver.lock" not in {s["check"] for s in h["steps"]}, h
    assert h["outcome"] == "unchanged" and sh("gpu3", f"sha256sum {PIN_FILE}").stdout == pin
