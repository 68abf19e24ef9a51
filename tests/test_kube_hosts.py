"""export --format podman-kube played for real: `podman kube play` (podman 5.4 on a test host)
of the tiny recipe's export runs the init step (the host download script, from the test Hub
server at the pinned revision, sha256-verified), then the real llama-server with the stand-in
GPU mapped through its CDI name in resources.limits; /health and a completion answer on the
host port. A tampered download is refused by the init step and the server never starts; a
gated model downloads with the token from a podman Secret, never from the manifest."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner

pytestmark = pytest.mark.hosts

NAME = "tensorless-tiny-p100"
POD = f"{NAME}-pod"  # podman names a Deployment's pod <name>-pod, its containers <pod>-<name>
SERVER = f"{POD}-{NAME}"
INIT = f"{POD}-model-download"
FILE = "tiny-llama.gguf"
REMOTE = "/srv/tensorless-kube/tiny.yaml"
TOKEN = "hf_kube_play_test_token"


@pytest.fixture
def host(gpu_hosts: list[Host]) -> Host:
    return gpu_hosts[0]  # the p100 profile: a CDI spec whose nvidia0 is /dev/zero


@pytest.fixture
def manifest(
    tmp_path: Path, hosts_json: dict[str, Any], hf: HFServer, ssh: SshRunner, host: Host
) -> Iterator[str]:
    """The tiny recipe's podman-kube export (the init step downloads from the test Hub), on
    the host; the pod taken down afterwards (a host reset removes it too)."""
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    out = tmp_path / "tiny.yaml"
    proc = cli(
        "export",
        "tiny",
        "--recipes",
        str(catalog),
        "--format",
        "podman-kube",
        "-o",
        str(out),
        env={"HF_ENDPOINT": hf.url},
    )
    assert proc.returncode == 0, proc.stderr
    assert hf.resolve_url(TINY_REPO, FILE) in out.read_text()  # the pinned revision's URL
    ssh.put(host, out, REMOTE)
    yield REMOTE
    ssh(host, f"podman kube down {REMOTE}; podman secret rm tensorless-hf-token", check=False)


def _play(ssh: SshRunner, host: Host) -> Any:
    return ssh(host, f"podman kube play {REMOTE}", check=False, timeout=300)


def _state(ssh: SshRunner, host: Host, container: str) -> str:
    return str(
        ssh(host, f"podman inspect --format '{{{{.State.Status}}}}' {container}").stdout
    ).strip()


def _health(ssh: SshRunner, host: Host, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        r = ssh(host, "curl -fsS --max-time 5 http://127.0.0.1:8080/health", check=False)
        if r.returncode == 0 or time.monotonic() > deadline:
            return str(r.stdout)
        time.sleep(0.5)


def test_kube_play_serves_health_and_a_completion(
    manifest: str, ssh: SshRunner, host: Host, hf: HFServer
) -> None:
    played = _play(ssh, host)
    assert played.returncode == 0, played.stdout + played.stderr
    assert json.loads(_health(ssh, host)) == {"status": "ok"}
    body = json.dumps({"prompt": "hello", "max_tokens": 8, "temperature": 0})
    out = ssh(
        host,
        "curl -fsS --max-time 60 http://127.0.0.1:8080/v1/completions "
        f"-H 'Content-Type: application/json' -d '{body}'",
    ).stdout
    reply = json.loads(out)
    assert reply["model"] == TINY_REPO and reply["usage"]["completion_tokens"] == 8
    assert reply["choices"][0]["text"]
    # the init step fetched the file once, at the pinned revision, from the test Hub
    stats = hf.stats(TINY_REPO, FILE)
    assert stats.get >= 1 and stats.bytes_sent >= 520800
    # the server runs as the option set says: the CDI stand-in's device, the engine's user,
    # the model mounted read-only where llama-server's -m points
    inspect = json.loads(ssh(host, f"podman inspect {SERVER}").stdout)[0]
    devices = [d["PathInContainer"] for d in inspect["HostConfig"]["Devices"]]
    assert "/dev/nvidia0" in devices, devices
    model = next(m for m in inspect["Mounts"] if m["Destination"] == "/models/tiny-llama.gguf")
    assert model["RW"] is False
    args = inspect["Config"]["Cmd"] or inspect["Args"]
    assert "/models/tiny-llama.gguf" in args and "0.0.0.0" in args
    assert _state(ssh, host, SERVER) == "running"


def test_a_tampered_download_is_refused_and_the_server_never_starts(
    manifest: str, ssh: SshRunner, host: Host, hf: HFServer
) -> None:
    hf.add_fault("corrupt", repo_id=TINY_REPO, filename=FILE)
    played = _play(ssh, host)
    assert played.returncode != 0
    assert "init container" in played.stderr and "exited with code 1" in played.stderr
    log = ssh(host, f"podman logs {INIT}").stderr
    assert "refused and deleted" in log, log
    assert _state(ssh, host, SERVER) == "created"  # never started
    r = ssh(host, "curl -fsS --max-time 3 http://127.0.0.1:8080/health", check=False)
    assert r.returncode != 0


def test_a_gated_model_downloads_with_the_token_from_a_podman_secret(
    manifest: str, ssh: SshRunner, host: Host, hf: HFServer, tmp_path: Path
) -> None:
    hf.require_token(TINY_REPO, TOKEN)
    refused = _play(ssh, host)
    assert refused.returncode != 0  # no Secret: the optional reference is empty, the Hub says 401
    ssh(host, f"podman kube down {REMOTE}", check=False)
    secret = tmp_path / "secret.yaml"
    secret.write_text(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: tensorless-hf-token\n"
        f"stringData:\n  token: {TOKEN}\n"
    )
    ssh.put(host, secret, "/srv/tensorless-kube/secret.yaml")
    made = ssh(host, "podman kube play /srv/tensorless-kube/secret.yaml", check=False)
    assert made.returncode == 0, made.stderr
    played = _play(ssh, host)
    assert played.returncode == 0, played.stdout + played.stderr
    assert json.loads(_health(ssh, host)) == {"status": "ok"}
    assert hf.stats(TINY_REPO, FILE).auth_seen[-1] is True
    manifest_text = ssh(host, f"cat {REMOTE}").stdout
    assert TOKEN not in manifest_text


SECRETS = Path(__file__).parent / "fixtures" / "secrets"


def _secret_yaml(name: str, data: dict[str, str], kind: str | None = None) -> str:
    """A Secret for `podman kube play`, made as the export's header says."""
    lines = ["apiVersion: v1", "kind: Secret", "metadata:", f"  name: {name}"]
    if kind:
        lines.append(f"type: {kind}")
    lines.append("stringData:")
    lines += [f"  {k}: {json.dumps(v)}" for k, v in data.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("tls", [False, True], ids=["keyed", "keyed-tls"])
def test_a_keyed_export_serves_under_kube_play_with_and_without_tls(
    tmp_path: Path, hosts_json: dict[str, Any], hf: HFServer, ssh: SshRunner, host: Host, tls: bool
) -> None:
    """The keyed (and TLS) export once never served: podman writes a Secret's files root:root
    and ignores fsGroup, so llama-server (uid 10001) could not open /run/tensorless/api-key
    and exited in a loop; with TLS podman's own probe (curl -f https://localhost, no -k)
    failed. Played here with its Secrets made as its header says: healthy, not restarting,
    401 without the key and 200 with it."""
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    out = tmp_path / "keyed.yaml"
    access = ["--api-key-file", str(SECRETS / "api.key")]
    if tls:
        access += ["--tls-cert-file", str(SECRETS / "tls.crt")]
        access += ["--tls-key-file", str(SECRETS / "tls.key")]
    proc = cli(
        *("export", "tiny", "--recipes", str(catalog), "--format", "podman-kube", "-o", str(out)),
        *access,
        env={"HF_ENDPOINT": hf.url},
    )
    assert proc.returncode == 0, proc.stderr
    header = out.read_text().split("---", 1)[0]
    assert "podman secret tensorless-api-key" in header, header
    key = (SECRETS / "api.key").read_text().strip()
    assert key not in out.read_text()
    secrets = _secret_yaml("tensorless-api-key", {"api-key": key})
    if tls:
        pair = {n: (SECRETS / n).read_text() for n in ("tls.crt", "tls.key")}
        secrets += "---\n" + _secret_yaml("tensorless-tls", pair, "kubernetes.io/tls")
    (tmp_path / "secrets.yaml").write_text(secrets)
    ssh.put(host, out, REMOTE)
    ssh.put(host, tmp_path / "secrets.yaml", "/srv/tensorless-kube/secrets.yaml")
    scheme = "https" if tls else "http"
    curl = f"curl -sk -o /dev/null -w '%{{http_code}}' --max-time 10 {scheme}://127.0.0.1:8080"
    try:
        made = ssh(host, "podman kube play /srv/tensorless-kube/secrets.yaml", check=False)
        assert made.returncode == 0, made.stderr
        played = _play(ssh, host)
        assert played.returncode == 0, played.stdout + played.stderr
        deadline = time.monotonic() + 90
        health = ""
        while time.monotonic() < deadline:
            health = ssh(host, f"podman inspect --format '{{{{.State.Health.Status}}}}' {SERVER}")
            if health.stdout.strip() == "healthy":
                break
            time.sleep(1)
        assert health.stdout.strip() == "healthy", ssh(host, f"podman logs {SERVER}").stderr
        assert ssh(host, f"{curl}/health").stdout == "200"
        assert ssh(host, f"{curl}/v1/models").stdout == "401"
        with_key = ssh(host, f"{curl}/v1/models -H 'Authorization: Bearer {key}'").stdout
        assert with_key == "200"
        restarts = ssh(host, f"podman inspect --format '{{{{.RestartCount}}}}' {SERVER}")
        assert restarts.stdout.strip() == "0"
        assert _state(ssh, host, SERVER) == "running"
    finally:
        ssh(host, f"podman kube down --force {REMOTE}", check=False)
        ssh(host, "podman kube down --force /srv/tensorless-kube/secrets.yaml", check=False)
        ssh(host, "podman secret rm tensorless-api-key tensorless-tls", check=False)
