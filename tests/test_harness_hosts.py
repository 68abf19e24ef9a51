"""The test-host harness itself, through real clients (needs tests/hosts/setup.sh; -m hosts)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import write_inventory
from tests.hosts.harness import IFNAME_MAX, MAX_SET, Host, apply_profile, host_set, reset_host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import SshRunner, TinyGguf

pytestmark = pytest.mark.hosts

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
QUERY = (
    "nvidia-smi --query-gpu=index,uuid,name,compute_cap,memory.total,memory.used,driver_version"
    " --format=csv,noheader,nounits"
)


def _http(url: str, data: bytes | None = None, timeout: float = 5) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        return int(e.code), bytes(e.read())


def _wait_health(url: str, limit: float = 60) -> None:
    end = time.monotonic() + limit
    last: object = None
    while time.monotonic() < end:
        try:
            status, _ = _http(url, timeout=2)
            if status == 200:
                return
            last = status
        except OSError as e:  # refused while starting: "loading"
            last = e
        time.sleep(0.2)
    raise AssertionError(f"{url} not healthy within {limit}s (last: {last!r})")


# ------------------------------------------------------------------------------ hosts


def test_every_host_boots_systemd_with_ssh(ssh: SshRunner, test_hosts: dict[str, Host]) -> None:
    for name, h in test_hosts.items():
        out = ssh(h, "cat /proc/1/comm; hostname; systemctl is-system-running || true").stdout
        comm, hostname, state = out.split()
        assert comm == "systemd", name
        assert hostname == name
        assert state in ("running", "degraded"), (name, state)


def test_hosts_json_follows_the_set_plan(
    hosts_json: dict[str, Any], test_hosts: dict[str, Host]
) -> None:
    """hosts.json, the bridge and the namespaces are the plan of TL_SET; no two sets collide."""
    hs = host_set()
    assert hosts_json["set"] == hs.index and hosts_json["base"] == str(hs.base)
    assert (hosts_json["bridge"], hosts_json["gateway"]) == (hs.bridge, hs.gateway)
    assert (hosts_json["subnet"], hosts_json["unreachable"]) == (hs.subnet, hs.unreachable)
    assert hosts_json["registry"] == hs.registry and hosts_json["image"]["ref"].startswith(
        hs.registry + "/"
    )
    for name, h in test_hosts.items():
        assert (h.ip, h.netns, h.extra["veth"]) == (hs.host_ip(name), hs.netns(name), hs.veth(name))
        assert Path(f"/run/netns/{h.netns}").exists(), name
    addr = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "dev", hs.bridge], capture_output=True, text=True
    )
    assert f"inet {hs.gateway}/24" in addr.stdout, addr
    # every set's names fit the interface limit and differ from every other set's
    plans = [host_set(i) for i in range(MAX_SET + 1)]
    names = [(p.bridge, p.subnet, p.netns("persist1"), p.veth("persist1")) for p in plans]
    for col in zip(*names, strict=True):
        assert len(set(col)) == len(plans), col
    assert max(len(p.peer("persist1")) for p in plans) <= IFNAME_MAX


def test_operator_has_passwordless_sudo_only(
    ssh: SshRunner, test_hosts: dict[str, Host], tmp_path: Path
) -> None:
    for name, h in test_hosts.items():
        op = h.as_user(h.sudo_user)
        assert ssh(op, "id -un").stdout.strip() == "operator", name
        assert ssh(op, "sudo -n true").returncode == 0, name
        denied = ssh(op, "cat /etc/shadow", check=False)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, name
        assert ssh(op, "sudo -n head -1 /etc/shadow").stdout.startswith("root:"), name
    # pyinfra as operator: plain commands run as operator, _sudo (--sudo) ones as root
    hosts = list(test_hosts.values())
    inv = write_inventory(tmp_path / "inventory.py", [h.as_user(h.sudo_user) for h in hosts])
    pyinfra = [sys.executable, "-m", "pyinfra", "-y"]
    cmd = ["exec", "--", 'test "$(id -u)" = 0']
    as_root = subprocess.run(
        [*pyinfra, "--sudo", str(inv), *cmd], capture_output=True, text=True, timeout=120
    )
    assert as_root.returncode == 0, as_root.stdout + as_root.stderr
    plain = subprocess.run([*pyinfra, str(inv), *cmd], capture_output=True, text=True, timeout=120)
    assert plain.returncode != 0, plain.stdout + plain.stderr


def test_podman_versions_and_quadlet(
    testinfra_hosts: dict[str, Any], gpu_hosts: list[Host], legacy_host: Host
) -> None:
    for h in gpu_hosts:
        th = testinfra_hosts[h.name]
        assert th.check_output("podman version --format '{{.Client.Version}}'").startswith("5.")
        assert th.file("/usr/libexec/podman/quadlet").exists
        assert th.file("/usr/lib/systemd/system-generators/podman-system-generator").exists
        assert h.podman_major == 5 and h.quadlet
    th = testinfra_hosts[legacy_host.name]
    assert th.check_output("podman version --format '{{.Client.Version}}'").startswith("4.3.")
    assert not th.file("/usr/libexec/podman/quadlet").exists
    assert legacy_host.podman_major == 4 and not legacy_host.quadlet


# ------------------------------------------------------------------------------ engine


def _gpu_uuid(ssh: SshRunner, host: Host) -> str:
    return ssh(host, QUERY).stdout.split(", ")[1]


@pytest.mark.usefixtures("clean_hosts")
def test_engine_by_digest_serves_tiny_gguf_with_cdi_gpu(
    ssh: SshRunner, gpu_hosts: list[Host], engine_image: str, tiny_gguf: TinyGguf
) -> None:
    h = gpu_hosts[0]
    ssh.put(h, tiny_gguf.path, "/srv/models/tiny.gguf")
    uuid = _gpu_uuid(ssh, h)
    ssh(h, f"podman pull -q {engine_image}", timeout=180)
    ssh(
        h,
        f"podman run -d --name harness-engine --device nvidia.com/gpu={uuid} "
        f"-v /srv/models:/models:ro -p 18080:8080 {engine_image} "
        "-m /models/tiny.gguf --host 0.0.0.0 --port 8080 -c 512",
        timeout=60,
    )
    _wait_health(f"http://{h.ip}:18080/health")
    status, body = _http(
        f"http://{h.ip}:18080/v1/completions",
        json.dumps({"prompt": "hello", "max_tokens": 8, "temperature": 0}).encode(),
        timeout=30,
    )
    assert status == 200, body
    timings = json.loads(body)["timings"]
    assert timings["predicted_n"] == 8 and timings["predicted_per_second"] > 0
    digest = engine_image.split("@")[1]
    assert ssh(h, "podman inspect harness-engine --format '{{.ImageDigest}}'").stdout.strip() == (
        digest
    )
    # the CDI device really landed in the container
    assert ssh(h, "podman exec harness-engine ls /dev/nvidia0").returncode == 0


@pytest.mark.usefixtures("clean_hosts")
def test_engine_on_legacy_podman4(
    ssh: SshRunner, legacy_host: Host, engine_image: str, tiny_gguf: TinyGguf
) -> None:
    h = legacy_host
    ssh.put(h, tiny_gguf.path, "/srv/models/tiny.gguf")
    ssh(h, f"podman pull -q {engine_image}", timeout=180)
    ssh(
        h,
        f"podman run -d --name harness-legacy --device nvidia.com/gpu=0 "
        f"-v /srv/models:/models:ro -p 18082:8080 {engine_image} "
        "-m /models/tiny.gguf --host 0.0.0.0 --port 8080 -c 512",
        timeout=60,
    )
    _wait_health(f"http://{h.ip}:18082/health")


@pytest.mark.usefixtures("clean_hosts")
def test_quadlet_adddevice_unit(
    ssh: SshRunner, gpu_hosts: list[Host], engine_image: str, tiny_gguf: TinyGguf
) -> None:
    h = gpu_hosts[-1]
    ssh.put(h, tiny_gguf.path, "/srv/models/tiny.gguf")
    unit = (
        "[Container]\nContainerName=harness-quadlet\n"
        f"Image={engine_image}\nAddDevice=nvidia.com/gpu=all\n"
        "Volume=/srv/models:/models:ro\nPublishPort=18081:8080\n"
        "Exec=-m /models/tiny.gguf --host 0.0.0.0 --port 8080 -c 512\n"
        "[Service]\nTimeoutStartSec=300\n"
    )
    ssh(
        h,
        "mkdir -p /etc/containers/systemd && cat > /etc/containers/systemd/harness.container",
        input=unit,
    )
    ssh(h, "systemctl daemon-reload && timeout 240 systemctl start harness.service", timeout=260)
    _wait_health(f"http://{h.ip}:18081/health")
    assert ssh(h, "systemctl is-active harness.service").stdout.strip() == "active"


# ------------------------------------------------------------------------------ HF server


def _hf_download(
    hf: HFServer, cache: Path, revision: str, **env: str
) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from huggingface_hub import hf_hub_download; a = sys.argv; "
        "print(hf_hub_download(a[1], a[2], revision=a[3], cache_dir=a[4]))"
    )
    full_env = {
        **os.environ,
        "HF_ENDPOINT": hf.url,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_ETAG_TIMEOUT": "5",
        "HF_HUB_DOWNLOAD_TIMEOUT": "5",
        **env,
    }
    if "HF_TOKEN" not in env:
        full_env.pop("HF_TOKEN", None)
    return subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "tensorless-test/tiny-llama-GGUF",
            "tiny-llama.gguf",
            revision,
            str(cache),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=full_env,
        check=False,
    )


def test_hf_hub_download_at_commit(hf: HFServer, tiny_gguf: TinyGguf, tmp_path: Path) -> None:
    p = _hf_download(hf, tmp_path / "c1", tiny_gguf.commit)
    assert p.returncode == 0, p.stderr
    got = Path(p.stdout.strip())
    assert hashlib.sha256(got.read_bytes()).hexdigest() == tiny_gguf.sha256
    assert f"snapshots/{tiny_gguf.commit}/" in str(got)
    st = hf.stats(tiny_gguf.repo_id, tiny_gguf.filename)
    assert st.bodies == 1 and st.bytes_sent == tiny_gguf.size
    # a second call with the cache warm transfers no body (metadata only, or nothing at all)
    p = _hf_download(hf, tmp_path / "c1", "main")
    assert p.returncode == 0, p.stderr
    assert st.bodies == 1 and st.bytes_sent == tiny_gguf.size


def test_hf_faults_drop_retry_and_token(hf: HFServer, tiny_gguf: TinyGguf, tmp_path: Path) -> None:
    # within one call the client resumes a dropped connection with Range
    hf.add_fault(
        "drop", repo_id=tiny_gguf.repo_id, filename=tiny_gguf.filename, after_bytes=100_000, times=1
    )
    p = _hf_download(hf, tmp_path / "c2", tiny_gguf.commit)
    assert p.returncode == 0, p.stderr
    assert hashlib.sha256(Path(p.stdout.strip()).read_bytes()).hexdigest() == tiny_gguf.sha256
    st = hf.stats(tiny_gguf.repo_id, tiny_gguf.filename)
    # huggingface_hub 2.4.0 retried this small file from byte 0 (its 10 MB write chunks mean
    # nothing of the cut body reached the temp file); larger files resume with Range
    assert st.bodies == 2 and st.bytes_sent == 100_000 + tiny_gguf.size
    # private repo: 401 without the token, success with it; the value is never recorded
    hf.require_token(tiny_gguf.repo_id, "hf_testtoken")
    p = _hf_download(hf, tmp_path / "c3", tiny_gguf.commit)
    assert p.returncode != 0
    p = _hf_download(hf, tmp_path / "c4", tiny_gguf.commit, HF_TOKEN="hf_testtoken")
    assert p.returncode == 0, p.stderr
    assert True in st.auth_seen and 401 in st.statuses
    assert "hf_testtoken" not in json.dumps(hf.log)
    # errors travel in X-Error-Code
    for url, code in (
        (f"{hf.url}/nobody/none/resolve/main/x.gguf", "RepoNotFound"),
        (f"{hf.url}/{tiny_gguf.repo_id}/resolve/{'0' * 40}/tiny-llama.gguf", "RevisionNotFound"),
        (f"{hf.url}/{tiny_gguf.repo_id}/resolve/main/missing.gguf", "EntryNotFound"),
    ):
        hf.require_token(tiny_gguf.repo_id, None)
        req = urllib.request.Request(url, method="HEAD")
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(req, timeout=5)
        assert ei.value.code == 404 and ei.value.headers["X-Error-Code"] == code


def test_curl_resumes_cut_download_on_host(
    ssh: SshRunner, gpu_hosts: list[Host], hf: HFServer, tiny_gguf: TinyGguf
) -> None:
    h = gpu_hosts[0]
    url = hf.resolve_url(tiny_gguf.repo_id, tiny_gguf.filename)
    hf.add_fault(
        "drop", repo_id=tiny_gguf.repo_id, filename=tiny_gguf.filename, after_bytes=200_000, times=1
    )
    f = "/tmp/harness-resume.gguf.partial"
    ssh(h, f"rm -f {f}")
    first = ssh(h, f"curl -fsSL -m 30 -o {f} '{url}'", check=False)
    assert first.returncode != 0  # cut off (curl 18: partial file)
    assert int(ssh(h, f"stat -c %s {f}").stdout) == 200_000
    ssh(h, f"curl -fsSL -m 30 -C - -o {f} '{url}'")
    assert ssh(h, f"openssl dgst -sha256 -r {f}").stdout.split()[0] == tiny_gguf.sha256
    st = hf.stats(tiny_gguf.repo_id, tiny_gguf.filename)
    assert st.bytes_sent == tiny_gguf.size  # nothing re-transferred
    assert st.ranges == ["bytes=200000-"]
    # resuming a complete file: the server answers 416; curl 8.14 (trixie) then exits 0, curl
    # 7.88 (bookworm) exits 22: either way "complete, now verify"
    again = ssh(h, f"curl -fsSL -m 30 -C - -o {f} '{url}'", check=False)
    assert st.statuses[-1] == 416 and again.returncode in (0, 22)
    assert st.bytes_sent == tiny_gguf.size
    ssh(h, f"rm -f {f}")


# ------------------------------------------------------------------------------ GPU profiles


def test_h200_profile_replays_real_nvidia_smi_bytes(
    ssh: SshRunner, test_hosts: dict[str, Host], profile: Any
) -> None:
    h = test_hosts["gpu1"]
    profile(h, "h200")
    fx = FIXTURES / "h200-driver-580"
    for cmd, ref, rc in (
        (QUERY, "query-csv.out", 0),
        ("nvidia-smi -L", "list.out", 0),
        ("nvidia-smi --version", "version.out", 0),
        ("nvidia-smi", "plain.out", 0),
        ("nvidia-smi --query-gpu=index,no_such_field --format=csv,noheader", "query-bad.out", 2),
    ):
        p = ssh(h, cmd, check=False)
        assert p.returncode == rc, cmd
        assert p.stdout == (fx / ref).read_text(), cmd
    units = ssh(
        h,
        QUERY.replace(",driver_version", ",driver_version,pci.bus_id,persistence_mode").replace(
            "csv,noheader,nounits", "csv"
        ),
    ).stdout
    assert units.splitlines()[0] == (fx / "query-csv-units.out").read_text().splitlines()[0]


def test_profiles_switch_over_ssh(
    ssh: SshRunner, test_hosts: dict[str, Host], profile: Any
) -> None:
    h = test_hosts["gpu1"]
    profile(h, "no-driver")
    p = ssh(h, QUERY, check=False)
    assert p.returncode == 9
    assert p.stdout == (FIXTURES / "no-driver" / "query-csv.out").read_text()
    profile(h, "mixed")
    assert (
        ssh(h, QUERY).stdout
        == (FIXTURES / "mixed-p100-t4-driver-535" / "query-csv.out").read_text()
    )
    assert "nvidia.com/gpu=all" in ssh(h, "nvidia-ctk cdi list").stdout
    profile(h, "no-smi")
    gone = ssh(h, "command -v nvidia-smi nvidia-ctk; ls /etc/cdi /var/run/cdi", check=False)
    assert gone.stdout.split() == ["/etc/cdi:", "/var/run/cdi:"]
    profile(h, "dup-cdi")
    assert ssh(h, "ls /etc/cdi/nvidia.yaml /var/run/cdi/nvidia.yaml").returncode == 0
    profile(h, "p100")
    assert ssh(h, "nvidia-ctk --version").stdout.startswith("NVIDIA Container Toolkit CLI version ")
    assert ssh(h, QUERY).stdout == (FIXTURES / "p100-driver-535" / "query-csv.out").read_text()
    assert ssh(h, "ls /var/run/cdi").stdout == ""


# ------------------------------------------------------------------------------ reset


MESS_UNIT = "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n"


def test_a_test_that_leaves_a_mess_behind(
    ssh: SshRunner, test_hosts: dict[str, Host], engine_image: str
) -> None:
    """Leaves units, a container, files, an nft table and a foreign profile on gpu1; the next
    test (and every host test) must still start from a pristine host."""
    h = test_hosts["gpu1"]
    ssh(h, "cat > /etc/systemd/system/tl-mess.service", input=MESS_UNIT)
    ssh(
        h,
        "mkdir -p /etc/containers/systemd && cat > /etc/containers/systemd/tl-mess-q.container",
        input=f"[Container]\nImage={engine_image}\nExec=600\nEntrypoint=/bin/sleep\n",
    )
    ssh(
        h,
        "systemctl daemon-reload && systemctl enable --now tl-mess.service && "
        "mkdir -p /srv/mess /var/lib/tensorless/models--x /home/operator/.cache && "
        "touch /srv/mess/f /home/operator/.cache/x /etc/cdi/extra.yaml && "
        "systemd-run --unit=tl-mess-transient sleep 600 && nft add table inet tl_mess",
        timeout=60,
    )
    ssh(h, f"podman run -d --name tl-mess --entrypoint /bin/sleep {engine_image} 600", timeout=180)
    apply_profile(h, "no-driver")
    assert ssh(
        h, "systemctl is-active tl-mess.service tl-mess-transient.service"
    ).stdout.split() == [
        "active",
        "active",
    ]


def test_the_next_test_starts_from_reset_hosts(ssh: SshRunner, test_hosts: dict[str, Host]) -> None:
    h = test_hosts["gpu1"]
    out = ssh(
        h,
        "ls /etc/systemd/system/tl-mess.service /etc/containers/systemd/tl-mess-q.container "
        "/srv/mess /var/lib/tensorless/models--x /home/operator/.cache /etc/cdi/extra.yaml "
        "2>/dev/null; systemctl is-active tl-mess.service tl-mess-transient.service; "
        "podman ps -aq; nft list tables | grep tl_; cat /var/lib/tensorless-test/profile",
        check=False,
    ).stdout.split()
    assert out == ["inactive", "inactive", "p100"], out
    assert ssh(h, QUERY).stdout == (FIXTURES / "p100-driver-535" / "query-csv.out").read_text()


def test_reset_changes_nothing_on_a_pristine_host(test_hosts: dict[str, Host]) -> None:
    for h in test_hosts.values():
        out = reset_host(h)
        assert "profile " in out and "unchanged" in out, (h.name, out)
        assert "0 added paths removed, units stopped: none" in out, (h.name, out)


# ------------------------------------------------------------------------------ reboot


def test_persist_host_reboots_for_real(
    ssh: SshRunner, persist_host: Host, gpu_hosts: list[Host], reboot: Any, reset_host: Any
) -> None:
    h = persist_host
    unit = (
        "[Unit]\nDescription=tensorless reboot probe\n[Service]\nType=oneshot\n"
        "RemainAfterExit=yes\nExecStart=/bin/sh -c 'cat /proc/sys/kernel/random/boot_id "
        "> /run/tl-reboot-probe'\n[Install]\nWantedBy=multi-user.target\n"
    )
    ssh(h, "cat > /etc/systemd/system/tl-reboot-probe.service", input=unit)
    ssh(
        h,
        "systemctl daemon-reload && systemctl enable tl-reboot-probe.service && "
        "mkdir -p /etc/tensorless-deploy /var/lib/tensorless-deploy && "
        "echo etc > /etc/tensorless-deploy/reboot-probe && "
        "echo var > /var/lib/tensorless-deploy/reboot-probe && "
        "podman volume create tl-reboot-vol >/dev/null && "
        "echo vol > \"$(podman volume inspect tl-reboot-vol --format '{{.Mountpoint}}')/f\"",
        timeout=60,
    )
    r = reboot(h)
    assert r.new_boot_id != r.old_boot_id and r.seconds < 120, r
    got = ssh(
        h,
        "cat /proc/sys/kernel/random/boot_id /etc/tensorless-deploy/reboot-probe "
        "/var/lib/tensorless-deploy/reboot-probe /run/tl-reboot-probe; "
        "systemctl is-enabled tl-reboot-probe.service; "
        "systemctl is-active tl-reboot-probe.service; "
        "cat \"$(podman volume inspect tl-reboot-vol --format '{{.Mountpoint}}')/f\"",
        timeout=60,
    ).stdout.split()
    # the enabled unit ran in the new boot (its /run file names the new boot id)
    assert got == [r.new_boot_id, "etc", "var", r.new_boot_id, "enabled", "active", "vol"], got
    # a reset still returns it to pristine (unit, files, volume gone)
    reset_host(h)
    left = ssh(
        h,
        "ls /etc/systemd/system/tl-reboot-probe.service /etc/tensorless-deploy/reboot-probe "
        "/var/lib/tensorless-deploy/reboot-probe 2>/dev/null; podman volume ls -q; "
        "systemctl is-enabled tl-reboot-probe.service",
        check=False,
    ).stdout.split()
    assert left in (["not-found"], []), left
    # a volatile host cannot reboot: the harness refuses instead of losing it
    with pytest.raises(ValueError, match="volatile"):
        reboot(gpu_hosts[0])
