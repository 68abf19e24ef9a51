"""doctor against the real test hosts, driven as an operator would: the CLI as a subprocess,
`--json` and exit codes. Every GPU stand-in profile, a taken port, an unreachable host, and proof
that a doctor run changes nothing on any host. Several hosts share one doctor run (it is
parallel), so the whole file costs a few doctor runs."""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.decisions.checks import QUADLET_MIN
from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner

pytestmark = pytest.mark.hosts

HOSTS = ("gpu1", "gpu2", "legacy1")
RECIPE = "tensorless-test/tiny-llama-GGUF/p100.toml"
P100_A = "GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90"
P100_B = "GPU-a7d41c9e-2b35-4f86-8e1a-5c9b0d3e6f21"
T4 = "GPU-5e0b9d72-8c14-43a6-b2f9-0a6d1c7e3b58"
PORT_UNIT = "tl-doctor-test-port"


@dataclass
class Doctor:
    catalog: Path
    inventory: Path
    ssh: SshRunner

    def run(
        self, *args: str, hosts: Sequence[str] = (), json_out: bool = True
    ) -> tuple[int, Any, str]:
        argv = ["doctor", "-i", str(self.inventory), "--recipes", str(self.catalog), *args]
        for h in hosts:
            argv += ["--limit", h]
        if json_out:
            argv.append("--json")
        proc = cli(*argv, env={"NO_COLOR": "1"}, timeout=120)
        out = proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr, out
        assert proc.returncode in (0, 1), out  # 2 would be a usage error
        if not json_out:
            return proc.returncode, proc.stdout, proc.stderr
        assert proc.stdout.startswith("{"), out
        return proc.returncode, json.loads(proc.stdout), out


def hosts_of(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in report["hosts"]}


def result(report: dict[str, Any], host: str) -> dict[str, Any]:
    (r,) = hosts_of(report)[host]["results"]
    return dict(r)


def checks(report: dict[str, Any], host: str) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in result(report, host)["checks"]}


def failed(report: dict[str, Any], host: str) -> list[str]:
    return [c["id"] for c in result(report, host)["checks"] if c["status"] == "fail"]


@pytest.fixture
def doctor(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    ssh: SshRunner,
    clean_hosts: None,
) -> Iterator[Doctor]:
    hosts = [test_hosts[n] for n in HOSTS]
    inventory = write_inventory(tmp_path / "inventory.py", hosts, unreachable=True)
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    yield Doctor(catalog, inventory, ssh)


# ------------------------------------------------------------------- nothing changes on a host

MARKER = "/run/tl-doctor-test.marker"
# Files and units a host's own state is made of: /etc by content, units, containers, images,
# listeners, device nodes. Taken before and after a doctor run; they must be equal.
# podman's storage overlay mount (var-lib-containers-storage-overlay.mount) comes and goes
# with podman's own runs, the snapshot's `podman ps` among them (seen in CI): not doctor's doing.
# systemctl pads its columns to the longest name it lists, the filtered mounts included (a CI
# run saw every line of the list change width at once), so the columns are read, not the padding.
# list-units --all also shows units systemd holds in memory only because something asked for
# them by name (`systemctl show UNIT` of a unit with no file: "not-found inactive dead"), until its
# garbage collection drops them at a moment of its own: no file, no process, nothing on the host.
# netavark's DHCP proxy starts at boot and exits by itself after 30 s idle (`dhcp-proxy -a 30`):
# a test right after a boot saw it go from running to dead during the deploy (not its doing).
SNAPSHOT = r"""
export LC_ALL=C
find /etc -xdev -type f -exec sha256sum {} + | sort -k2
find /etc /var/lib /srv /opt /usr/local -xdev -printf '%y %m %u %p -> %l\n' | sort
systemctl list-units --all --no-legend --plain \
  | grep -v '^var-lib-containers-storage-\|^netavark-dhcp-proxy\.' \
  | awk '{$1 = $1; print}' | grep -v '^[^ ]* not-found inactive dead ' | sort
systemctl list-unit-files --no-legend | awk '{$1 = $1; print}' | sort
podman ps -a --format '{{.ID}} {{.Names}} {{.State}} {{.Image}}'
podman images --no-trunc --format '{{.ID}} {{.Repository}} {{.Digest}}'
ss -Hltn | sort
ls -l /dev/nvidia* /dev/char 2>&1 | grep -i nvidia
"""
# Everything newer than the marker, on every filesystem doctor could write to.
NEWER = f"find / /run /tmp /dev /var/lib/containers -xdev -newer {MARKER} 2>/dev/null | sort"
# An SSH login's own bookkeeping (sshd, PAM, journald), not doctor's doing.
LOGIN_NOISE = re.compile(
    r"/run|/run/motd\.dynamic|/run/utmp|/run/systemd/(sessions|users|netif)(/.*)?"
    r"|/var/log|/var/log/(wtmp|btmp|lastlog)|(/var|/run)/log/journal(/.*)?"
)
# podman takes its storage locks to list images (the survey asks which it holds), and podman 4.3
# makes and removes a scratch file in /var/tmp: lock files' and /var/tmp's mtimes move; no file
# is left and nothing in the images changes (the snapshot of images says so). The survey keeps
# its sections' outputs in a scratch directory under /tmp while they run side by side
# (facts/scripts/bound.sh) and removes it: /tmp's mtime moves; one left behind is a path here.
READ_LOCKS = re.compile(r"/var/lib/containers/storage/(.+/)?[a-z]+\.lock|/var/tmp|/tmp")


def snapshot_all(ssh: SshRunner, script: str) -> dict[str, str]:
    with ThreadPoolExecutor(len(HOSTS)) as pool:
        outs = pool.map(lambda h: ssh(h, script, timeout=60).stdout, HOSTS)
        return dict(zip(HOSTS, outs, strict=True))


def test_fleet_report_changes_nothing_and_finds_port_and_servable(
    doctor: Doctor, profile: Any, ssh: SshRunner
) -> None:
    """gpu1 P100 passes, gpu2 H200 is refused, legacy1 with 2x P100 + T4 gets only the P100s,
    ghost is one failed row; nothing on any host changes. Then readiness without MODEL: the
    human output, and --json while something else holds gpu1's port."""
    profile("legacy1", "mixed")
    before = snapshot_all(ssh, f"{SNAPSHOT}\ntouch {MARKER}")
    rc, report, out = doctor.run("tiny")
    newer = snapshot_all(ssh, NEWER)
    after = snapshot_all(ssh, SNAPSHOT)
    for h in HOSTS:
        touched = [
            p
            for p in newer[h].split()
            if p != MARKER and not LOGIN_NOISE.fullmatch(p) and not READ_LOCKS.fullmatch(p)
        ]
        assert touched == [], f"doctor wrote on {h}: {touched}"
        diff = difflib.unified_diff(before[h].splitlines(), after[h].splitlines(), lineterm="")
        assert after[h] == before[h], f"{h} changed under doctor:\n" + "\n".join(diff)

    assert rc == 1 and report["ok"] is False, out
    hosts = hosts_of(report)
    assert list(hosts) == [*HOSTS, "ghost"]  # inventory order, whatever finished first
    # gpu1: the P100 stand-in passes for the tiny P100 recipe
    assert hosts["gpu1"]["ok"] is True and hosts["gpu1"]["error"] is None
    r1 = result(report, "gpu1")
    assert (r1["model"], r1["card"], r1["recipe"], r1["ok"], r1["engine"]) == (
        TINY_REPO,
        "p100",
        RECIPE,
        True,
        "podman",
    )
    assert r1["gpu_uuids"] == [P100_A] and r1["servable"] == []
    assert {c["status"] for c in r1["checks"]} == {"ok"}
    assert [g["name"] for g in hosts["gpu1"]["gpus"]] == ["Tesla P100-PCIE-16GB"]
    # gpu2: the H200 is refused, and the evidence says what it is
    assert hosts["gpu2"]["ok"] is False and failed(report, "gpu2") == ["card.match"]
    r2 = result(report, "gpu2")
    assert (r2["card"], r2["recipe"], r2["gpu_uuids"]) == (None, None, [])
    match = checks(report, "gpu2")["card.match"]
    assert "compute 9.0" in match["evidence"] and "143771 MiB" in match["evidence"], match
    assert "NVIDIA H200" in match["evidence"] and "doctor (no MODEL)" in match["fix"]
    # legacy1 (mixed): the P100 that is free; the busy one and the T4 are named as left out
    assert hosts["legacy1"]["ok"] is True, out
    r3 = result(report, "legacy1")
    assert r3["gpu_uuids"] == [P100_A] and P100_B not in r3["gpu_uuids"]
    fit = checks(report, "legacy1")["memory.fit"]
    assert fit["status"] == "warn" and "GPU 1 (Tesla P100-PCIE-16GB)" in fit["evidence"], fit
    assert "free the card" in fit["fix"]
    isolation = checks(report, "legacy1")["card.isolation"]
    assert isolation["status"] == "ok" and "Tesla T4" in isolation["evidence"]
    assert T4 not in r3["gpu_uuids"] and "compute 7.5" in isolation["evidence"]
    assert checks(report, "legacy1")["engine.quadlet"]["status"] == "warn"  # podman 4.3
    # ghost: one failed row with the SSH error; the others reported anyway
    ghost = hosts["ghost"]
    assert ghost["ok"] is False and ghost["results"] == [] and ghost["gpus"] == []
    assert ghost["error"].startswith("cannot connect") and ssh.unreachable in ghost["error"]

    # the human output, readiness without MODEL: a host no recipe of the catalog fits is not
    # ready for anything (it once said "ready" beside "no recipe fits") -> exit 1
    rc, text, err = doctor.run(hosts=HOSTS, json_out=False)
    assert rc == 1, text + err
    assert text.splitlines()[:2] == ["gpu1: ready", f"  can serve: {RECIPE}"]
    assert "gpu2: NOT READY\n  can serve: no recipe in the catalog fits this host's GPUs\n" in text
    assert "gpu2: ready" not in text
    assert f"legacy1: ready\n  can serve: {RECIPE}\n" in text
    assert f"fix: upgrade podman to {QUADLET_MIN}" in text  # legacy1's warning carries its fix
    assert err.strip() == "2 of 3 host(s) ready; not ready: gpu2"
    rc, text, err = doctor.run(hosts=("gpu1", "legacy1"), json_out=False)
    assert rc == 0 and err.strip() == "2 of 2 host(s) ready", text + err

    # readiness without MODEL, while something else listens on gpu1's 127.0.0.1:8080
    listener = shlex.join(
        [
            "systemd-run",
            f"--unit={PORT_UNIT}",
            "--collect",
            "systemd-socket-activate",
            "-l",
            "127.0.0.1:8080",
            "cat",
        ]
    )
    ssh(
        "gpu1",
        f"{listener} && for i in $(seq 50); do ss -Hltn 'sport = :8080' | grep -q . "
        "&& exit 0; sleep 0.1; done; exit 1",
    )
    try:
        rc, report, out = doctor.run(hosts=HOSTS)
    finally:
        ssh("gpu1", f"systemctl stop {PORT_UNIT}", check=False)
    assert rc == 1, out
    for h in HOSTS:
        r = result(report, h)
        assert (r["model"], r["card"], r["recipe"], r["gpu_uuids"]) == (None, None, None, [])
    assert result(report, "gpu1")["servable"] == [RECIPE]
    assert result(report, "gpu2")["servable"] == []  # the H200: no recipe fits
    assert result(report, "legacy1")["servable"] == [RECIPE]
    assert failed(report, "gpu1") == ["port.free"]
    port = checks(report, "gpu1")["port.free"]
    assert port["evidence"] == "127.0.0.1:8080 is taken (listening: 127.0.0.1:8080)", port
    assert "--port N" in port["fix"] and "sport = :8080" in port["fix"]
    assert hosts_of(report)["gpu2"]["ok"] is False  # no recipe fits it
    assert hosts_of(report)["legacy1"]["ok"] is True
    assert checks(report, "gpu2")["port.free"]["status"] == "ok"


# --------------------------------------------------------------- each failing profile, per host

# host -> (profile, the one failing check, words of its evidence, words of its fix)
ROUNDS = {
    "driver": {
        "gpu1": (
            "old-driver",
            "driver.version",
            "driver 515.105.01 is older than 525.60.13",
            "install NVIDIA driver 525.60.13 or newer",
        ),
        "gpu2": ("no-driver", "driver.loaded", "nvidia-smi exit 9", "sudo modprobe nvidia"),
        "legacy1": (
            "no-smi",
            "driver.present",
            "nvidia-smi not found",
            "install the NVIDIA driver",
        ),
    },
    "toolkit": {
        "gpu1": (
            "no-toolkit",
            "toolkit.present",
            "nvidia-ctk not found",
            "sudo apt install nvidia-container-toolkit",
        ),
        "gpu2": (
            "dup-cdi",
            "toolkit.cdi",
            "2 CDI specs declare nvidia.com/gpu: /etc/cdi/nvidia.yaml, /var/run/cdi/nvidia.yaml",
            "sudo rm /etc/cdi/nvidia.yaml  (keep /var/run/cdi/nvidia.yaml)",
        ),
        "legacy1": (
            "stale-cdi",
            "toolkit.cdi",
            "CDI spec /etc/cdi/nvidia.yaml was generated for another driver than 535.183.01",
            "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
        ),
    },
}


@pytest.mark.parametrize("round_name", list(ROUNDS))
def test_each_broken_profile_fails_its_own_check(
    doctor: Doctor, profile: Any, round_name: str
) -> None:
    expect = ROUNDS[round_name]
    with ThreadPoolExecutor(len(expect)) as pool:
        list(pool.map(lambda h: profile(h, expect[h][0]), expect))
    rc, report, out = doctor.run("tiny", hosts=list(expect))
    assert rc == 1 and report["ok"] is False, out
    for host, (name, check_id, evidence, fix) in expect.items():
        assert hosts_of(report)[host]["ok"] is False, (name, out)
        assert failed(report, host) == [check_id], (name, out)
        c = checks(report, host)[check_id]
        assert evidence in c["evidence"], (name, c)
        assert fix in c["fix"], (name, c)
    # no driver talking: no GPU listed, so no card is claimed for the container
    for host, (name, *_rest) in expect.items():
        if name in ("no-driver", "no-smi"):
            assert hosts_of(report)[host]["gpus"] == [] and result(report, host)["gpu_uuids"] == []
        if name == "old-driver":  # the card is right, only the driver is too old
            assert checks(report, host)["card.match"]["status"] == "ok"
            assert result(report, host)["gpu_uuids"] == []


# ------------------------------------------------------------------- a host already serving it


def test_deployed_recipe_holds_its_own_port(doctor: Doctor, hf: HFServer) -> None:
    """After deploy, doctor for the same recipe is still ready: the port is held by the
    recipe's own unit and the model file is already there (as deploy itself sees it)."""
    proc = cli(
        "deploy",
        "-i",
        str(doctor.inventory),
        "tiny",
        "--recipes",
        str(doctor.catalog),
        "--limit",
        "gpu1",
        "--json",
        env={"HF_ENDPOINT": hf.url},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rc, report, out = doctor.run("tiny", hosts=["gpu1"])
    assert rc == 0 and failed(report, "gpu1") == [], out
    assert checks(report, "gpu1")["port.free"]["evidence"] == (
        "127.0.0.1:8080 is held by this recipe's own unit tensorless-tiny-p100"
    )
    assert checks(report, "gpu1")["disk.model"]["evidence"] == (
        "the model file is already on the host"
    )
