"""prepare against the real test hosts, driven as an operator would (the CLI as a subprocess,
--json and exit codes): doctor fails on the stand-in profiles, prepare changes exactly what its
checks name, doctor then passes them, a second prepare changes nothing, and a deploy serves.

The toolkit comes from a real signed apt repository on the set's gateway (tests/hosts/apt_repo.py:
the stand-in nvidia-ctk as a .deb with the real package names), installed through the same key,
repository and apt path as from NVIDIA's. Three hosts share every run (prepare is parallel):

* gpu1 (trixie): profile bare-driver with its nvidia-uvm nodes and /dev/char links removed;
  the toolkit unpinned (the repository's newest, 1.18.0-1, which ships its refresh units);
* legacy1 (bookworm, podman 4.3), as the sudo operator: bare-driver, toolkit pinned to 1.17.8-1
  (no refresh units: tensorless-cdi-refresh.path keeps the spec fresh);
* persist1 (trixie): stale-cdi (toolkit 1.17.8 present, spec generated for another driver).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.apt_repo import RepoServer, build_repo
from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner

pytestmark = pytest.mark.hosts

HOSTS = ("gpu1", "legacy1", "persist1")
PIN = "1.17.8-1"
P100 = "GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90"
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
# What prepare may leave on a host outside the harness's reset paths: removed after each test
# (a harness hook for packages and apt sources would make this unnecessary).
UNPREPARE = f"""set -u
if dpkg-query -W -f '${{Status}}' nvidia-container-toolkit-base 2>/dev/null | grep -q installed
then DEBIAN_FRONTEND=noninteractive apt-get purge -y -q {" ".join(TOOLKIT_PACKAGES)} >/dev/null
fi
rm -f /etc/apt/sources.list.d/nvidia-container-toolkit.list \
  /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg \
  /var/lib/apt/lists/*libnvidia-container* \
  /etc/modules-load.d/nvidia-uvm.conf /etc/udev/rules.d/71-nvidia-dev-char.rules \
  /etc/cdi/*.tensorless-moved /var/run/cdi/*.tensorless-moved /var/run/cdi/nvidia.yaml \
  /var/cache/apt/archives/*nvidia-container*.deb /var/cache/apt/*.bin
rm -rf /etc/nvidia-container-toolkit
systemctl disable --now tensorless-cdi-refresh.path tensorless-cdi-refresh.service >/dev/null 2>&1
rm -f /etc/systemd/system/tensorless-cdi-refresh.path \
  /etc/systemd/system/tensorless-cdi-refresh.service
systemctl daemon-reload
"""
# Every file, link and device node prepare could touch, with a hash (files) or target (links).
SNAPSHOT_DIRS = (
    "/etc",
    "/usr/bin",
    "/usr/lib/systemd/system",
    "/usr/share/keyrings",
    "/usr/share/nvidia-standin",
    "/var/run/cdi",
    "/var/lib/tensorless",
    "/dev/char",
)
SNAPSHOT = (
    f"for d in {' '.join(SNAPSHOT_DIRS)}; do [ -d $d ] && find $d \\( -type l -o -type c \\) "
    "-printf '%p -> %l %y\\n'; [ -d $d ] && find $d -type f -exec sha256sum {} +; done; "
    "ls -d /dev/nvidia* 2>/dev/null; [ -d /var/lib/tensorless/models ] && "
    "stat -c '%n dir %U:%G %a' /var/lib/tensorless/models; true"
)
# Bookkeeping a package install rewrites beside its own files (never a file of its own).
SNAPSHOT_IGNORE = ("/etc/ld.so.cache", "/etc/apt/", "/etc/systemd/system/multi-user.target.wants")


@dataclass
class Prep:
    inventory: Path
    catalog: Path
    repo: RepoServer
    ssh: SshRunner
    env: dict[str, str]

    def run(self, command: str, *args: str, timeout: float = 300) -> tuple[int, Any, str, float]:
        argv = [command, "-i", str(self.inventory), "--recipes", str(self.catalog), *args]
        t0 = time.monotonic()
        proc = cli(*argv, "--json", env=self.env, timeout=timeout)
        seconds = time.monotonic() - t0
        out = proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr, out
        assert proc.stdout.startswith("{"), out
        return proc.returncode, json.loads(proc.stdout), out, seconds

    def sh(self, host: str, cmd: str, check: bool = True) -> str:
        return str(self.ssh(host, cmd, check=check, timeout=120).stdout)

    def snapshot(self, host: str) -> dict[str, str]:
        rows: dict[str, str] = {}
        for line in self.sh(host, SNAPSHOT).splitlines():
            if " -> " in line:
                path, _, rest = line.partition(" -> ")
            elif "  " in line:  # sha256sum: HASH  PATH
                rest, _, path = line.partition("  ")
            else:
                path, _, rest = line.partition(" ")
            if not path.startswith(SNAPSHOT_IGNORE):
                rows[path] = rest
        return rows


def by_host(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in report["hosts"]}


def doctor_checks(report: dict[str, Any], host: str) -> dict[str, str]:
    (result,) = by_host(report)[host]["results"]
    return {c["id"]: c["status"] for c in result["checks"]}


def not_ok(report: dict[str, Any], host: str) -> dict[str, str]:
    return {k: v for k, v in doctor_checks(report, host).items() if v != "ok"}


def steps(report: dict[str, Any], host: str) -> dict[str, str]:
    return {s["check"]: s["outcome"] for s in by_host(report)[host]["steps"]}


def diff(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


@pytest.fixture(scope="module")
def toolkit_repo(
    tmp_path_factory: pytest.TempPathFactory, hosts_json: dict[str, Any]
) -> Iterator[RepoServer]:
    repo = build_repo(tmp_path_factory.mktemp("toolkit-repo"))
    srv = RepoServer(repo, hosts_json["gateway"]).start()
    yield srv
    srv.stop()


@pytest.fixture
def prep(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    ssh: SshRunner,
    hf: HFServer,
    toolkit_repo: RepoServer,
    reset_host: Any,
) -> Iterator[Prep]:
    gpu1, legacy1, persist1 = (test_hosts[n] for n in HOSTS)

    def unprepare() -> None:
        for h in (gpu1, legacy1, persist1):
            ssh(h, UNPREPARE, timeout=120)
            reset_host(h)

    unprepare()
    from tests.hosts.harness import apply_profile

    apply_profile(gpu1, "bare-driver")
    # a host whose nvidia-uvm nodes were never made and that has no /dev/char links at all
    ssh(gpu1, "rm -f /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/char/238:* /dev/char/195:*")
    apply_profile(legacy1, "bare-driver")
    apply_profile(persist1, "stale-cdi")
    url = toolkit_repo.url
    inventory = write_inventory(
        tmp_path / "inventory.py",
        [gpu1, legacy1.as_user(legacy1.sudo_user), persist1],
        data={
            "gpu1": {"tensorless_toolkit_repo": url},
            "legacy1": {"tensorless_toolkit_repo": url, "tensorless_toolkit_version": PIN,
                        "_sudo": True},
            "persist1": {"tensorless_toolkit_repo": url},
        },
    )  # fmt: skip
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    env = {"NO_COLOR": "1", "HF_ENDPOINT": hf.url, "TENSORLESS_LOG_DIR": str(tmp_path / "logs")}
    yield Prep(inventory, catalog, toolkit_repo, ssh, env)
    unprepare()


def test_doctor_prepare_doctor_then_nothing_to_do_and_a_deploy_serves(prep: Prep) -> None:
    rc, before, out, _ = prep.run("doctor")
    assert rc == 1, out
    assert not_ok(before, "gpu1") == {
        "gpu.uvm": "fail",
        "gpu.char_links": "warn",
        "toolkit.present": "fail",
    }, out
    assert not_ok(before, "legacy1") == {"engine.quadlet": "warn", "toolkit.present": "fail"}
    assert not_ok(before, "persist1") == {"toolkit.cdi": "fail"}, out
    snap = {h: prep.snapshot(h) for h in HOSTS}

    # --dry-run: what each host would get, and nothing changes
    rc, dry, out, _ = prep.run("prepare", "--dry-run")
    assert rc == 0, out
    want = {
        "gpu1": ["toolkit.present", "toolkit.cdi", "gpu.uvm", "gpu.char_links", "disk.model"],
        "legacy1": ["toolkit.present", "toolkit.cdi", "disk.model"],
        "persist1": ["toolkit.cdi", "disk.model"],
    }
    for h in HOSTS:
        assert by_host(dry)[h]["outcome"] == "would change", out
        assert steps(dry, h) == dict.fromkeys(want[h], "would change"), out
        assert prep.snapshot(h) == snap[h], f"{h}: a dry run changed something"
    assert [x["id"] for x in by_host(dry)["legacy1"]["left"]] == ["engine.quadlet"]
    assert prep.repo.requests == [], "a dry run fetched from the repository"

    rc, first, out, secs_first = prep.run("prepare")
    assert rc == 0, out
    for h in HOSTS:
        assert by_host(first)[h]["outcome"] == "changed", out
        assert steps(first, h) == dict.fromkeys(want[h], "changed"), out
    print(f"prepare, three hosts from the profiles: {secs_first:.1f} s")
    # the real key, repository and apt path: signed index, then the pinned or newest packages
    fetched = {p for _, p, code in prep.repo.requests if code == 200}
    base = "/libnvidia-container"
    assert f"{base}/gpgkey" in fetched and f"{base}/stable/deb/amd64/InRelease" in fetched
    for v in ("1.18.0-1", PIN):
        assert f"{base}/stable/deb/amd64/./nvidia-container-toolkit-base_{v}_amd64.deb" in fetched
    assert prep.sh("gpu1", "dpkg-query -W -f '${Version}' nvidia-container-toolkit") == "1.18.0-1"
    query = "dpkg-query -W -f '${Package}=${Version} ' " + " ".join(TOOLKIT_PACKAGES)
    assert sorted(prep.sh("legacy1", query).split()) == sorted(
        f"{p}={PIN}" for p in TOOLKIT_PACKAGES
    )

    # exactly those things changed, host by host
    changed = {h: diff(snap[h], prep.snapshot(h)) for h in HOSTS}
    toolkit_files = {
        "/usr/bin/nvidia-ctk",
        "/usr/bin/nvidia-cdi-hook",
        "/usr/share/nvidia-standin/ctk/version.out",
        "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg",
    }
    refresh_1_18 = {
        "/usr/lib/systemd/system/nvidia-cdi-refresh.path",
        "/usr/lib/systemd/system/nvidia-cdi-refresh.service",
        "/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env",
    }
    ours = {
        "/etc/systemd/system/tensorless-cdi-refresh.path",
        "/etc/systemd/system/tensorless-cdi-refresh.service",
    }
    models = "/var/lib/tensorless/models"
    links = {f"/dev/char/{m}" for m in ("195:0", "195:255", "238:0", "238:1")}
    assert changed["gpu1"] == toolkit_files | refresh_1_18 | links | {
        "/var/run/cdi/nvidia.yaml",
        "/etc/modules-load.d/nvidia-uvm.conf",
        "/etc/udev/rules.d/71-nvidia-dev-char.rules",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        # the nodes and links again at every boot, before the served units (gpu.uvm's fix)
        "/etc/systemd/system/tensorless-nvidia-devices.service",
        "/etc/systemd/system/sysinit.target.wants/tensorless-nvidia-devices.service",
        models,
    }, sorted(changed["gpu1"])
    assert changed["legacy1"] == toolkit_files | ours | {"/etc/cdi/nvidia.yaml", models}, sorted(
        changed["legacy1"]
    )
    assert changed["persist1"] == ours | {"/etc/cdi/nvidia.yaml", models}, sorted(
        changed["persist1"]
    )
    assert prep.sh("gpu1", f"stat -c '%U:%G %a' {models}") == "root:root 755\n"
    assert prep.sh("gpu1", "systemctl is-enabled nvidia-cdi-refresh.path") == "enabled\n"
    assert prep.sh("legacy1", "systemctl is-active tensorless-cdi-refresh.path") == "active\n"
    assert prep.sh("persist1", "systemctl is-enabled tensorless-cdi-refresh.path") == "enabled\n"

    # doctor passes every check prepare fixed (legacy1 keeps its podman 4.3 warning)
    rc, after, out, _ = prep.run("doctor")
    assert rc == 0, out
    assert not_ok(after, "gpu1") == {} and not_ok(after, "persist1") == {}, out
    assert not_ok(after, "legacy1") == {"engine.quadlet": "warn"}, out

    # a second prepare changes nothing
    snap_after = {h: prep.snapshot(h) for h in HOSTS}
    rc, second, out, secs_second = prep.run("prepare")
    assert rc == 0, out
    for h in HOSTS:
        assert by_host(second)[h]["outcome"] == "unchanged", out
        assert steps(second, h) == {"disk.model": "unchanged"}, out
        assert prep.snapshot(h) == snap_after[h]
    print(f"second prepare, same hosts: {secs_second:.1f} s")

    # and the model serves on the prepared hosts (the container gets the GPU through CDI)
    rc, deployed, out, _ = prep.run("deploy", "tiny", "--limit", "gpu1", "--limit", "legacy1")
    assert rc == 0, out
    for h in ("gpu1", "legacy1"):
        assert by_host(deployed)[h]["outcome"] == "changed", out
        body = json.dumps({"prompt": "hello", "max_tokens": 4, "temperature": 0})
        answer = json.loads(
            prep.sh(
                h,
                "curl -fsS http://127.0.0.1:8080/v1/completions "
                f"-H 'Content-Type: application/json' -d '{body}'",
            )
        )
        assert answer["model"] == TINY_REPO


OLD_DRIVER = Path(__file__).parent / "hosts" / "profiles" / "old-driver" / "root"


def test_our_refresh_unit_regenerates_the_spec_after_a_driver_change(prep: Prep) -> None:
    rc, report, out, _ = prep.run("prepare", "--limit", "legacy1")
    assert rc == 0 and steps(report, "legacy1")["toolkit.cdi"] == "changed", out
    assert "host-driver-version=535.183.01" in prep.sh("legacy1", "cat /etc/cdi/nvidia.yaml")
    # a driver change as a package manager makes it: new libraries and data, then nvidia-smi
    # replaced by a rename
    standin = "/usr/share/nvidia-standin"
    for rel in ("smi/gpus.tsv", "smi/list.out", "smi/version.out", "ctk/cdi-generated.yaml"):
        prep.ssh.put("legacy1", OLD_DRIVER / standin.lstrip("/") / rel, f"{standin}/{rel}")
    for lib in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"):
        name = f"usr/lib/x86_64-linux-gnu/{lib}.so.515.105.01"
        prep.ssh.put("legacy1", OLD_DRIVER / name, f"/{name}")
    prep.sh("legacy1", "cp -p /usr/bin/nvidia-smi /usr/bin/.nvidia-smi.new && "
            "mv -f /usr/bin/.nvidia-smi.new /usr/bin/nvidia-smi")  # fmt: skip
    deadline = time.monotonic() + 30
    while "515.105.01" not in prep.sh("legacy1", "cat /etc/cdi/nvidia.yaml"):
        assert time.monotonic() < deadline, prep.sh(
            "legacy1", "journalctl -u tensorless-cdi-refresh.service --no-pager | tail -5"
        )
        time.sleep(0.5)
    rc, after, out, _ = prep.run("doctor", "--limit", "legacy1")
    assert doctor_checks(after, "legacy1")["toolkit.cdi"] == "ok", out
    assert "toolkit.cdi" not in steps(prep.run("prepare", "--limit", "legacy1")[1], "legacy1")


def test_a_host_that_cannot_be_prepared_fails_alone(prep: Prep, tmp_path: Path) -> None:
    text = prep.inventory.read_text().replace(f"'{PIN}'", "'9.9.9-1'")
    prep.inventory.write_text(text)
    rc, report, out, _ = prep.run("prepare", "--limit", "gpu1", "--limit", "legacy1")
    assert rc == 1, out
    assert by_host(report)["gpu1"]["outcome"] == "changed", out
    bad = by_host(report)["legacy1"]
    assert bad["outcome"] == "failed" and "\n" not in bad["reason"], out
    assert bad["reason"].startswith("toolkit.present failed: "), bad["reason"]
    assert "9.9.9-1" in bad["reason"] and bad["reason"].endswith(f"read {bad['log']}")
    log = Path(bad["log"]).read_text()
    assert "== toolkit.present: failed" in log and "9.9.9-1" in log
    assert steps(report, "legacy1") == {
        "toolkit.present": "failed",
        "toolkit.cdi": "not run",
        "disk.model": "not run",
    }
    assert prep.sh("legacy1", "command -v nvidia-ctk", check=False) == ""
