"""pytest fixtures for the real test hosts (see docs/test-hosts.md).

Loaded by tests/conftest.py. Tests that use these fixtures carry ``@pytest.mark.hosts`` (the
default ``pytest`` run deselects them; ``pytest -m hosts`` selects them). When BASE/hosts.json is
missing (tests/hosts/setup.sh was not run), every fixture here skips with a message saying so.

Session fixtures:
  hosts_json       the parsed BASE/hosts.json (dict)
  test_hosts       {name: Host}; gpu_hosts (list of gpu* Hosts), legacy_host (legacy1)
  ssh              SshRunner: ssh(host_or_name, "cmd", timeout=60, check=True) -> CompletedProcess
  testinfra_hosts  {name: testinfra Host} over paramiko, host keys checked against known_hosts
  engine_image     "10.253.0.1:5000/tensorless-engine-cpu@sha256:..."
  tiny_gguf        TinyGguf(path, sha256, size, repo_id, filename, commit)
  hf_server        HFServer on the gateway address (hosts and this process reach it), serving
                   tensorless-test/tiny-llama-GGUF at TINY_COMMIT
Function fixtures:
  hf               hf_server with faults cleared and counters reset (before and after the test)
  reset_host       callable reset_host(host_or_name, images=False): see harness-side docs below
  clean_hosts      resets every host after the test
  profile          callable profile(host_or_name, "no-driver"): applies a profile for this test
                   and restores the host's default profile afterwards
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.harness import (
    Host,
    apply_profile,
    base_dir,
    load_hosts_json,
    ssh_run,
)
from tests.hosts.hf_server import HFServer

TINY_REPO = "tensorless-test/tiny-llama-GGUF"
TINY_FILE = "tiny-llama.gguf"
TINY_COMMIT = "7c1d0f3a9e2b4d6c8a1f3e5b7d9c0a2e4f6b8d01"
TINY_README = (
    b"---\nlicense: apache-2.0\ntags: [gguf, test]\n---\n"
    b"# tiny-llama-GGUF\n\nA 2-layer random-weight llama GGUF for tensorless-deploy tests.\n"
)

# Paths a reset returns to their pristine (rootfs) content: anything a test added there is
# removed; units defined there are stopped first.
RESET_DIRS = (
    "/etc/systemd/system",
    "/etc/containers/systemd",
    "/etc/tensorless-deploy",
    "/var/lib/tensorless-deploy",
    "/var/lib/tensorless",  # the default models_dir: models--ORG--NAME/..., .tensorless/
    "/run/tensorless",  # where a download token file lives for the length of a download
    "/srv",
    "/opt",
)
QUADLET_SUFFIX = {
    ".container": "",
    ".pod": "-pod",
    ".network": "-network",
    ".volume": "-volume",
    ".kube": "",
    ".image": "-image",
    ".build": "-build",
}


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

    def __init__(self, hosts: dict[str, Host]) -> None:
        self.hosts = hosts

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
def ssh(test_hosts: dict[str, Host]) -> SshRunner:
    return SshRunner(test_hosts)


@pytest.fixture(scope="session")
def testinfra_hosts(test_hosts: dict[str, Host]) -> Iterator[dict[str, Any]]:
    import paramiko
    import testinfra

    out: dict[str, Any] = {}
    clients: list[paramiko.SSHClient] = []
    for name, h in test_hosts.items():
        th = testinfra.get_host(h.testinfra_url)
        # same URL as documented, but with the host key checked against the harness known_hosts
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
        th.backend.__dict__["client"] = client  # testinfra's cached_property
        clients.append(client)
        out[name] = th
    yield out
    for c in clients:
        c.close()


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


def _pristine_files(hosts_json: dict[str, Any], host: Host) -> set[str]:
    root = Path(hosts_json["base"]) / "rootfs" / host.suite
    found: set[str] = set()
    for d in RESET_DIRS:
        top = root / d.lstrip("/")
        if top.is_dir():
            for p in top.rglob("*"):
                found.add("/" + p.relative_to(root).as_posix())
    return found


def reset_host_state(hosts_json: dict[str, Any], host: Host, *, images: bool = False) -> None:
    """Return ``host`` to a pristine-enough state. Covers:

    * every unit file / quadlet file a test added under /etc/systemd/system or
      /etc/containers/systemd (i.e. absent from the pristine rootfs): its unit is stopped, the
      file removed, then ``daemon-reload`` and ``reset-failed``;
    * all podman containers, pods, unused networks and volumes (and all images with ``images``);
    * anything added under RESET_DIRS (/etc/tensorless-deploy, /var/lib/tensorless-deploy, /srv,
      /opt, ...);
    * the GPU stand-in profile: the host's default profile is re-applied.
    Not covered: other files a test wrote elsewhere (the overlay root is only pristine again
    after a reboot of the host: teardown + setup), and images (kept as a pull cache by default).
    """
    quoted = " ".join(RESET_DIRS)
    listing = ssh_run(
        host,
        f"for d in {quoted}; do [ -d $d ] && find $d -mindepth 1; done; true",
        timeout=30,
    ).stdout.split()
    extra = sorted(set(listing) - _pristine_files(hosts_json, host))
    units: list[str] = []
    for p in extra:
        name = os.path.basename(p)
        stem, suffix = os.path.splitext(name)
        if p.startswith("/etc/containers/systemd/") and suffix in QUADLET_SUFFIX:
            units.append(f"{stem}{QUADLET_SUFFIX[suffix]}.service")
        elif p.startswith("/etc/systemd/system/") and suffix in (".service", ".timer", ".socket"):
            units.append(name)
    units = sorted(set(units))
    script = ["set -u"]
    if units:
        script.append(f"timeout 60 systemctl stop {' '.join(units)} || true")
        script.append(f"systemctl disable {' '.join(u for u in units)} >/dev/null 2>&1 || true")
    # podman is slow to start (many hosts, 2 cores): only call it when its state has something
    ctrs = "/var/lib/containers/storage/overlay-containers/containers.json"
    script += [
        f'if [ -s {ctrs} ] && [ "$(cat {ctrs})" != "[]" ]; then',
        "  timeout 60 podman pod rm -af -t 2 >/dev/null 2>&1 || true",
        "  timeout 60 podman rm -af -t 2 >/dev/null 2>&1 || true",
        "fi",
        "if ls /etc/containers/networks/*.json >/dev/null 2>&1; then",
        "  timeout 30 podman network prune -f >/dev/null 2>&1 || true",
        "fi",
        'if [ -n "$(ls -A /var/lib/containers/storage/volumes 2>/dev/null)" ]; then',
        "  timeout 30 podman volume prune -f >/dev/null 2>&1 || true",
        "fi",
    ]
    if images:
        script.append("timeout 60 podman rmi -af >/dev/null 2>&1 || true")
    # deepest first so directories are empty when their turn comes
    for p in sorted(extra, key=lambda s: -s.count("/")):
        script.append(f"rm -rf -- '{p}'")
    if extra:
        script.append("systemctl daemon-reload")
    script.append("systemctl reset-failed || true")
    ssh_run(host, "\n".join(script), timeout=180)
    apply_profile(host, str(host.extra.get("default_profile", host.profile)))


@pytest.fixture
def reset_host(hosts_json: dict[str, Any], ssh: SshRunner) -> Callable[..., None]:
    def _reset(ref: HostRef, *, images: bool = False) -> None:
        reset_host_state(hosts_json, ssh.host(ref), images=images)

    return _reset


@pytest.fixture
def clean_hosts(hosts_json: dict[str, Any], test_hosts: dict[str, Host]) -> Iterator[None]:
    yield
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        for f in [pool.submit(reset_host_state, hosts_json, h) for h in test_hosts.values()]:
            f.result()


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


def pytest_configure(config: pytest.Config) -> None:
    # paramiko's host-key policy warnings never fire (we check known_hosts); keep output quiet
    warnings.filterwarnings("ignore", category=UserWarning, module="paramiko")
