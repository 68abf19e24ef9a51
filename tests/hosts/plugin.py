"""pytest fixtures for the real test hosts (see docs/test-hosts.md).

Loaded by tests/conftest.py. Tests that use these fixtures carry ``@pytest.mark.hosts`` (the
default ``pytest`` run deselects them; ``pytest -m hosts`` selects them). The host set is
``TL_SET`` (0..7, default 0): its BASE/hosts.json names the hosts. When BASE/hosts.json is
missing (tests/hosts/setup.sh was not run), every fixture here skips with a message saying so.

Every test marked ``hosts`` starts from reset hosts: an autouse fixture resets every host of the
set, in parallel, before the test (only what differs from pristine; see harness.reset_host).

Session fixtures:
  hosts_json       the parsed BASE/hosts.json (dict)
  test_hosts       {name: Host}; gpu_hosts (list of gpu* Hosts), legacy_host (legacy1),
                   persist_host (persist1: persistent root, can reboot)
  subnet           the set's subnet, "10.253.S.0/24" (also ``ssh.subnet``); unreachable_ip
  ssh              SshRunner: ssh(host_or_name, "cmd", timeout=60, check=True) -> CompletedProcess
                   (as root; ``ssh(host.as_user(host.sudo_user), ...)`` as operator)
  testinfra_hosts  {name: testinfra Host} over paramiko, host keys checked against known_hosts
  engine_image     "10.253.S.1:5000/tensorless-engine-cpu@sha256:..."
  tiny_gguf        TinyGguf(path, sha256, size, repo_id, filename, commit)
  hf_server        HFServer on the gateway address (hosts and this process reach it), serving
                   tensorless-test/tiny-llama-GGUF at TINY_COMMIT
Function fixtures:
  hf               hf_server with faults cleared and counters reset (before and after the test)
  reset_host       callable reset_host(host_or_name, images=False): see harness.reset_host
  clean_hosts      resets every host after the test as well
  profile          callable profile(host_or_name, "no-driver"): applies a profile for this test
                   and restores the host's default profile afterwards
  reboot           callable reboot(host_or_name="persist1", timeout=180) -> harness.Reboot
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import TINY_COMMIT, TINY_FILE, TINY_README, TINY_REPO
from tests.hosts.harness import (
    PERSIST_HOST,
    QUADLET_SUFFIX,
    RESET_DIRS,
    Host,
    Reboot,
    apply_profile,
    base_dir,
    host_rootfs,
    load_hosts_json,
    reboot,
    reset_host,
    ssh_run,
)
from tests.hosts.hf_server import HFServer

__all__ = [
    "QUADLET_SUFFIX",
    "RESET_DIRS",
    "TINY_COMMIT",
    "TINY_FILE",
    "TINY_README",
    "TINY_REPO",
    "HostRef",
    "SshRunner",
    "TinyGguf",
    "reset_host_state",
]


@dataclass(frozen=True)
class TinyGguf:
    path: Path
    sha256: str
    size: int
    repo_id: str
    filename: str
    commit: str


HostRef = Host | str


class SshRunner:
    """``ssh(host, cmd)``: run on a test host with the harness key and known_hosts (bounded)."""

    def __init__(
        self, hosts: dict[str, Host], subnet: str = "10.253.0.0/24", unreachable: str = ""
    ) -> None:
        self.hosts = hosts
        self.subnet = subnet  # the set's subnet (hosts.json "subnet")
        self.unreachable = unreachable  # never assigned on the set's bridge

    def host(self, ref: HostRef) -> Host:
        return ref if isinstance(ref, Host) else self.hosts[ref]

    def __call__(
        self,
        ref: HostRef,
        command: str,
        *,
        timeout: float = 60,
        check: bool = True,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return ssh_run(self.host(ref), command, timeout=timeout, check=check, input=input)

    def put(self, ref: HostRef, local: Path, remote: str, *, timeout: float = 120) -> None:
        """Copy a local file to ``remote`` on the host (parent dirs created)."""
        with local.open("rb") as f:
            proc = subprocess.run(
                [
                    *_ssh_argv(self.host(ref)),
                    f"mkdir -p \"$(dirname '{remote}')\" && cat > '{remote}'",
                ],
                stdin=f,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        if proc.returncode != 0:
            raise RuntimeError(f"copy {local} -> {ref}:{remote} failed: {proc.stderr!r}")


def _ssh_argv(host: Host) -> list[str]:
    from tests.hosts.harness import ssh_argv

    return ssh_argv(host)


# ------------------------------------------------------------------------------ session


@pytest.fixture(scope="session")
def hosts_json() -> dict[str, Any]:
    base = base_dir()
    if not (base / "hosts.json").is_file():
        pytest.skip(
            f"test hosts are not set up ({base}/hosts.json missing): run "
            "`sudo bash tests/hosts/setup.sh` first (BASE env overrides the location)"
        )
    return load_hosts_json(base)


@pytest.fixture(scope="session")
def test_hosts(hosts_json: dict[str, Any]) -> dict[str, Host]:
    return {h["name"]: Host.from_json(h) for h in hosts_json["hosts"]}


@pytest.fixture(scope="session")
def gpu_hosts(test_hosts: dict[str, Host]) -> list[Host]:
    return [h for n, h in sorted(test_hosts.items()) if n.startswith("gpu")]


@pytest.fixture(scope="session")
def legacy_host(test_hosts: dict[str, Host]) -> Host:
    return test_hosts["legacy1"]


@pytest.fixture(scope="session")
def persist_host(test_hosts: dict[str, Host]) -> Host:
    if PERSIST_HOST not in test_hosts:
        pytest.skip(f"no {PERSIST_HOST} in hosts.json: re-run tests/hosts/setup.sh")
    return test_hosts[PERSIST_HOST]


def _subnet(hosts_json: dict[str, Any]) -> str:
    return str(hosts_json.get("subnet", "10.253.0.0/24"))


@pytest.fixture(scope="session")
def subnet(hosts_json: dict[str, Any]) -> str:
    """The set's subnet, e.g. for an nft rule that cuts a host off the bridge."""
    return _subnet(hosts_json)


@pytest.fixture(scope="session")
def unreachable_ip(hosts_json: dict[str, Any]) -> str:
    """On the set's bridge, never assigned: connections to it time out."""
    return str(hosts_json.get("unreachable", "10.253.0.250"))


@pytest.fixture(scope="session")
def ssh(hosts_json: dict[str, Any], test_hosts: dict[str, Host]) -> SshRunner:
    return SshRunner(
        test_hosts, _subnet(hosts_json), str(hosts_json.get("unreachable", "10.253.0.250"))
    )


_TESTINFRA: dict[str, tuple[Any, Any]] = {}  # name -> (testinfra Host, paramiko client)


def _connect(h: Host) -> Any:
    import paramiko

    client = paramiko.SSHClient()
    client.load_host_keys(h.known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        h.ip,
        username=h.user,
        key_filename=h.key,
        timeout=10,
        allow_agent=False,
        look_for_keys=False,
    )
    return client


def _reconnect_testinfra(h: Host) -> None:
    """After a reboot the old paramiko session is dead: give testinfra a new one."""
    if h.name in _TESTINFRA:
        th, old = _TESTINFRA[h.name]
        old.close()
        client = _connect(h)
        th.backend.__dict__["client"] = client
        _TESTINFRA[h.name] = (th, client)


@pytest.fixture(scope="session")
def testinfra_hosts(test_hosts: dict[str, Host]) -> Iterator[dict[str, Any]]:
    import testinfra

    out: dict[str, Any] = {}
    for name, h in test_hosts.items():
        th = testinfra.get_host(h.testinfra_url)
        # same URL as documented, but with the host key checked against the harness known_hosts
        client = _connect(h)
        th.backend.__dict__["client"] = client  # testinfra's cached_property
        _TESTINFRA[name] = (th, client)
        out[name] = th
    yield out
    for _, c in _TESTINFRA.values():
        c.close()
    _TESTINFRA.clear()


@pytest.fixture(scope="session")
def engine_image(hosts_json: dict[str, Any]) -> str:
    return str(hosts_json["image"]["ref"])


@pytest.fixture(scope="session")
def tiny_gguf(hosts_json: dict[str, Any]) -> TinyGguf:
    g = hosts_json["tiny_gguf"]
    return TinyGguf(Path(g["path"]), g["sha256"], int(g["size"]), TINY_REPO, TINY_FILE, TINY_COMMIT)


@pytest.fixture(scope="session")
def hf_server(hosts_json: dict[str, Any], tiny_gguf: TinyGguf) -> Iterator[HFServer]:
    bind = os.environ.get("TL_HF_BIND", hosts_json["gateway"])
    srv = HFServer(bind, 0)
    srv.publish(
        TINY_REPO,
        {TINY_FILE: tiny_gguf.path, "README.md": TINY_README},
        commit=TINY_COMMIT,
    )
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def hf(hf_server: HFServer) -> Iterator[HFServer]:
    hf_server.clear_faults()
    hf_server.reset_stats()
    for repo in hf_server.repos.values():
        repo.token = None
    yield hf_server
    hf_server.clear_faults()
    hf_server.reset_stats()
    for repo in hf_server.repos.values():
        repo.token = None


# ------------------------------------------------------------------------------ reset

RESET_TIMES: list[float] = []  # seconds per reset of the whole set (the autouse fixture)


def reset_host_state(hosts_json: dict[str, Any], host: Host, *, images: bool = False) -> None:
    """Return ``host`` to its pristine default (harness.reset_host, one SSH round trip):

    * every unit file / quadlet file a test added under /etc/systemd/system or
      /etc/containers/systemd (absent from the pristine rootfs the host booted from): its unit
      is stopped and disabled, the file removed, then ``daemon-reload``; transient services and
      timers (systemd-run) are stopped; failed units reset;
    * all podman containers, pods, unused networks and volumes (and all images with ``images``);
    * anything added under RESET_DIRS (/etc/tensorless-deploy, /var/lib/tensorless-deploy,
      /var/lib/tensorless, /run/tensorless, /srv, /opt, /home/operator);
    * nftables tables named tl_*;
    * the GPU stand-in profile: the host's default profile, re-applied only when its stamp, file
      sums, CDI directories or device nodes differ.
    Not covered: other files a test wrote elsewhere (a volatile host is only pristine again
    after teardown + setup), and images (kept as a pull cache by default).
    """
    reset_host(host, rootfs=host_rootfs(host, Path(hosts_json["base"])), images=images)


def reset_all(hosts_json: dict[str, Any], hosts: dict[str, Host]) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts)))) as pool:
        for f in [pool.submit(reset_host_state, hosts_json, h) for h in hosts.values()]:
            f.result()


@pytest.fixture(autouse=True)
def _reset_hosts_before_test(request: pytest.FixtureRequest) -> None:
    """Every test marked ``hosts`` starts from reset hosts, whatever ran before it (another
    test, ./demo, a crashed run)."""
    if request.node.get_closest_marker("hosts") is None or os.environ.get("TL_RESET") == "0":
        return  # TL_RESET=0: no reset before tests (debugging only: tests then depend on order)
    hosts_json: dict[str, Any] = request.getfixturevalue("hosts_json")
    hosts: dict[str, Host] = request.getfixturevalue("test_hosts")
    t0 = time.perf_counter()
    reset_all(hosts_json, hosts)
    RESET_TIMES.append(time.perf_counter() - t0)


@pytest.fixture(name="reset_host")
def reset_host_fixture(hosts_json: dict[str, Any], ssh: SshRunner) -> Callable[..., None]:
    def _reset(ref: HostRef, *, images: bool = False) -> None:
        reset_host_state(hosts_json, ssh.host(ref), images=images)

    return _reset


@pytest.fixture
def clean_hosts(hosts_json: dict[str, Any], test_hosts: dict[str, Host]) -> Iterator[None]:
    yield
    reset_all(hosts_json, test_hosts)


@pytest.fixture(name="reboot")
def reboot_fixture(ssh: SshRunner) -> Callable[..., Reboot]:
    """``reboot(host="persist1", timeout=180)``: systemctl reboot, wait for SSH with a new boot
    id and systemd running; testinfra's session to the host is made again."""

    def _reboot(ref: HostRef = PERSIST_HOST, *, timeout: float = 180) -> Reboot:
        h = ssh.host(ref)
        r = reboot(h, timeout=timeout)
        _reconnect_testinfra(h)
        return r

    return _reboot


@pytest.fixture
def profile(ssh: SshRunner) -> Iterator[Callable[[HostRef, str], None]]:
    touched: dict[str, Host] = {}

    def _apply(ref: HostRef, name: str) -> None:
        h = ssh.host(ref)
        touched[h.name] = h
        apply_profile(h, name)

    yield _apply
    for h in touched.values():
        apply_profile(h, str(h.extra.get("default_profile", h.profile)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if RESET_TIMES:
        ms = sorted(t * 1000 for t in RESET_TIMES)
        terminalreporter.write_line(
            f"host resets before tests: {len(ms)}, median {statistics.median(ms):.0f} ms, "
            f"max {ms[-1]:.0f} ms, total {sum(ms) / 1000:.1f} s"
        )


def pytest_configure(config: pytest.Config) -> None:
    # paramiko's host-key policy warnings never fire (we check known_hosts); keep output quiet
    warnings.filterwarnings("ignore", category=UserWarning, module="paramiko")
