"""deploy --transfer push --relay on the test hosts: the controller sends the model and the image
once, and the hosts pass them on to each other over keys made for one hop each (fleet.relay).
A hop cut mid-transfer resumes and verifies; a hop serving wrong bytes is refused and never
loaded; after every run no host keeps a key, an authorized_keys line or a hop's directory."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.fleet.relay import RELAY_ROOT
from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner

pytestmark = pytest.mark.hosts

HOSTS = ("gpu1", "gpu3", "legacy1")  # the P100 profiles of every host set (gpu2: an H200)
BLOBS = "/var/lib/tensorless/models/models--tensorless-test--tiny-llama-GGUF/blobs"
# what a relay may leave: nothing (root's authorized_keys did not exist before the run)
LEFT = f"ls -A /root/.ssh; ls -d {RELAY_ROOT} 2>/dev/null; pgrep -af '^ssh -F /dev/null' || true"


@pytest.fixture
def setting(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    hf: HFServer,
    reset_host: Any,
    ssh: SshRunner,
    clean_hosts: None,
) -> Iterator[dict[str, Any]]:
    for name in HOSTS:
        reset_host(name, images=True)
        assert ssh(name, LEFT).stdout.strip() == "", name
    registries = tmp_path / "registries.conf"
    registries.write_text(f'[[registry]]\nlocation = "{hosts_json["registry"]}"\ninsecure = true\n')
    env = {
        "HF_ENDPOINT": hf.url,
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "CONTAINERS_REGISTRIES_CONF": str(registries),
    }
    cat = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    inv = write_inventory(tmp_path / "inventory.py", [test_hosts[n] for n in HOSTS])
    yield {"env": env, "cat": cat, "inv": inv, "tmp": tmp_path}
    for name in HOSTS:  # whatever the test did, the run left no access behind
        assert ssh(name, LEFT).stdout.strip() == "", name


def _argv(setting: dict[str, Any]) -> list[str]:
    return [
        "deploy",
        "-i",
        str(setting["inv"]),
        "tiny",
        "--recipes",
        str(setting["cat"]),
        "--json",
        "--transfer",
        "push",
        "--relay",
    ]


def _hosts(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    assert proc.stdout.startswith("{"), proc.stdout + proc.stderr
    return {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}


def _senders(transfer: str, what: str) -> list[str]:
    return re.findall(rf"{what}: from (\S+), sent", transfer)


def test_relay_sends_each_byte_once_and_leaves_no_access(
    setting: dict[str, Any], hosts_json: dict[str, Any], ssh: SshRunner
) -> None:
    proc = cli(*_argv(setting), env=setting["env"])
    hosts = _hosts(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    size = hosts_json["tiny_gguf"]["size"]
    for what in ("model", "image"):
        senders = {n: _senders(h["transfer"], what) for n, h in hosts.items()}
        # one host got the file from this machine, every other from a host that held it
        assert sorted(len(s) for s in senders.values()) == [1, 1, 1], senders
        assert [n for n, s in senders.items() if s == ["controller"]] != [], senders
        assert sum(s == ["controller"] for s in senders.values()) == 1, senders
        for name, s in senders.items():
            assert s[0] != name and (s[0] == "controller" or s[0] in HOSTS), senders
    for name, h in hosts.items():
        assert (
            f"model: from {_senders(h['transfer'], 'model')[0]}, sent {size} bytes"
            in (h["transfer"])
        )
        answer = ssh(name, "curl -fsS http://127.0.0.1:8080/v1/models").stdout
        assert TINY_REPO in answer, name


def test_a_host_that_holds_the_model_seeds_the_relay_and_the_controller_sends_none(
    setting: dict[str, Any], hosts_json: dict[str, Any], test_hosts: dict[str, Host], ssh: SshRunner
) -> None:
    """gpu1 downloaded the model itself (an earlier deploy); gpu3 and legacy1, with
    tensorless_relay = true in the inventory (no flag), get it from gpu1 or from each other:
    the controller sends no byte of the model (it never even fetches it), and each host serves.
    gpu1 has an API key by then: a survey that cannot judge a keyed host's steps still sees
    its cache holding the model."""
    first = cli(
        "deploy", "-i", str(setting["inv"]), "tiny", "--recipes", str(setting["cat"]), "--json",
        "--limit", "gpu1", env=setting["env"],
    )  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    key = Path(__file__).parent / "fixtures" / "secrets" / "api.key"
    data: dict[str, dict[str, Any]] = {n: {"tensorless_relay": True} for n in HOSTS}
    data["gpu1"]["tensorless_api_key_file"] = str(key)
    inv = write_inventory(setting["tmp"] / "relay.py", [test_hosts[n] for n in HOSTS], data=data)
    argv = [a for a in _argv(setting) if a != "--relay"]
    argv[argv.index(str(setting["inv"]))] = str(inv)
    proc = cli(*argv, env=setting["env"])
    hosts = _hosts(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    size = hosts_json["tiny_gguf"]["size"]
    senders = {n: _senders(h["transfer"], "model") for n, h in hosts.items() if n != "gpu1"}
    assert all(len(s) == 1 and s[0] in HOSTS for s in senders.values()), senders
    assert "gpu1" in {s[0] for s in senders.values()}, senders
    for name in senders:
        assert f"sent {size} bytes" in hosts[name]["transfer"], hosts[name]["transfer"]
    _serve_and_nothing_fetched(setting, ssh, list(senders))


def _serve_and_nothing_fetched(setting: dict[str, Any], ssh: SshRunner, names: list[str]) -> None:
    """Each host serves the model, and this machine never fetched it (its Hub cache holds no
    blob of it)."""
    for name in names:
        answer = ssh(name, "curl -fsS http://127.0.0.1:8080/v1/models").stdout
        assert TINY_REPO in answer, name
    assert not list((setting["tmp"] / "hub").glob("models--*/blobs/*")), "fetched"


def test_a_pull_through_the_relay_crosses_the_uplink_once(
    setting: dict[str, Any], hosts_json: dict[str, Any], hf: HFServer, ssh: SshRunner
) -> None:
    """deploy --transfer pull --relay to three hosts that lack the model: the dry run names the
    host that would download it; the run has that one host download it from the Hub (the server
    sends its bytes once), the other two get it from the hosts that hold it, never from this
    machine (which fetches nothing); each pulls its image and serves."""
    argv = _argv(setting)
    argv[argv.index("push")] = "pull"
    dry = _hosts(cli(*argv, "--dry-run", env=setting["env"]))
    (seed,) = [n for n, h in dry.items() if "would download here" in h["transfer"]]
    for name in set(HOSTS) - {seed}:
        assert f"would come through the relay (first senders: {seed})" in dry[name]["transfer"]
    hf.reset_stats()
    proc = cli(*argv, env=setting["env"])
    hosts = _hosts(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tiny = hosts_json["tiny_gguf"]
    counted = hf.stats(tiny["hf_repo"], tiny["hf_file"])
    assert counted.bytes_sent == tiny["size"], counted  # one download's bytes, no more
    assert "model: downloaded here, the relay's first sender" in hosts[seed]["transfer"]
    assert _senders(hosts[seed]["transfer"], "model") == []
    for name in set(HOSTS) - {seed}:
        senders = _senders(hosts[name]["transfer"], "model")
        assert len(senders) == 1 and senders[0] in HOSTS and senders[0] != name, senders
        assert f"sent {tiny['size']} bytes" in hosts[name]["transfer"], hosts[name]
        assert _senders(hosts[name]["transfer"], "image") == []  # pulled from the registry
    _serve_and_nothing_fetched(setting, ssh, list(HOSTS))


def test_a_seed_that_cannot_download_fails_and_so_do_the_hosts_that_waited_for_it(
    setting: dict[str, Any], hosts_json: dict[str, Any], hf: HFServer, ssh: SshRunner
) -> None:
    """The Hub serves wrong bytes: the host that downloads for the relay refuses them and fails,
    the hosts that waited for it fail with one line naming it (none downloads for itself), and
    no host keeps a byte of the model."""
    argv = _argv(setting)
    argv[argv.index("push")] = "pull"
    tiny = hosts_json["tiny_gguf"]
    hf.reset_stats()
    hf.add_fault("corrupt", repo_id=tiny["hf_repo"], filename=tiny["hf_file"])
    try:
        proc = cli(*argv, env=setting["env"])
    finally:
        hf.clear_faults()
    hosts = _hosts(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert {h["outcome"] for h in hosts.values()} == {"failed"}, hosts
    (seed,) = [n for n, h in hosts.items() if "first sender" not in str(h["reason"])]
    reason = str(hosts[seed]["reason"])
    assert reason.startswith("the relay's first download of the model: downloaded file has")
    assert reason.endswith(": refused and deleted"), reason
    for name in set(HOSTS) - {seed}:
        reason = str(hosts[name]["reason"])
        assert reason.startswith(f"the relay's first sender {seed} could not download"), reason
    # one whole-file answer (the seed's); a 206 is this machine reading the header to plan
    assert hf.stats(tiny["hf_repo"], tiny["hf_file"]).statuses.count(200) == 1
    for name in HOSTS:
        assert ssh(name, f"ls -A {BLOBS} 2>/dev/null; true").stdout.strip() == "", name


def _nft(host: Host, *words: str, check: bool = True) -> None:
    subprocess.run(["ip", "netns", "exec", host.netns, "nft", *words], check=check)


def test_a_cut_hop_resumes_where_it_stopped_and_verifies(
    setting: dict[str, Any], hosts_json: dict[str, Any], ssh: SshRunner
) -> None:
    """gpu1 (the controller's first receiver) passes the model on to gpu3 over a link slowed to
    200 KB/s; its ssh is killed mid-hop (the link whole again): the hop is tried again from the
    bytes gpu3 has."""
    gpu1, gpu3 = ssh.host("gpu1"), ssh.host("gpu3")
    table = "tl_slow"
    _nft(gpu3, "add", "table", "inet", table)
    try:
        _nft(
            gpu3,
            "add",
            "chain",
            "inet",
            table,
            "input",
            "{ type filter hook input priority -10 ; }",
        )
        _nft(gpu3, "add", "rule", "inet", table, "input", "ip", "saddr", gpu1.ip, "tcp", "dport",
             "22", "limit", "rate", "over", "200", "kbytes/second", "drop")  # fmt: skip
        run = subprocess.Popen(
            [*cli_argv(), *_argv(setting)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(setting["env"]),
        )
        try:
            partial = f"{BLOBS}/{hosts_json['tiny_gguf']['sha256']}.incomplete"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                got = ssh("gpu3", f"stat -c %s {partial} 2>/dev/null || echo 0").stdout.strip()
                if int(got or 0) > 60_000:
                    break
                time.sleep(0.3)
            else:
                pytest.fail("the hop to gpu3 never started")
            ssh("gpu1", "pkill -f '^ssh -F /dev/null -T'")
            _nft(gpu3, "delete", "table", "inet", table)  # the link is whole again
            out, err = run.communicate(timeout=300)
        finally:
            run.kill()
    finally:
        _nft(gpu3, "delete", "table", "inet", table, check=False)
    hosts = _hosts(subprocess.CompletedProcess([], run.returncode, out, err))
    assert run.returncode == 0, out + err
    transfer = hosts["gpu3"]["transfer"]
    assert re.search(
        r"model: from gpu1, sent \d+ bytes \(resumed from 0\) in [0-9.]+ s, then cut", transfer
    ), transfer
    resumed = re.findall(r"model: from \S+, sent \d+ bytes \(resumed from (\d+)\)", transfer)
    assert int(resumed[-1]) > 60_000, transfer
    answer = ssh("gpu3", "curl -fsS http://127.0.0.1:8080/v1/models").stdout
    assert TINY_REPO in answer


def cli_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "tensorless_deploy"]


def cli_env(env: dict[str, str]) -> dict[str, str]:
    import os

    return {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", **env}


RELAY_ONE = """
import json, sys
from pathlib import Path
from tensorless_deploy.fleet.connect import disconnect, new_state, on_each_host
from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
from tensorless_deploy.fleet.relay import Copy, relay
inv, source, sha, size, remote = sys.argv[1:]
inventory = load_inventory(inv, False)
targets = select_hosts(inventory, ["gpu1", "gpu3"])
state = new_state(inventory)
on_each_host(state, targets, lambda h: None, keep_connected=True)
copy = Copy("model", Path(source), sha, int(size), {n: remote for n in ("gpu1", "gpu3")})
r = relay(state, {t.name: t for t in targets}, copy, ["gpu3"], holders=["gpu1"])
disconnect(targets)
hops = [dict(vars(h), line=h.line) for h in r.hops]
print(json.dumps(dict(hops=hops, done=sorted(r.done), failed=sorted(r.failed),
                      controller_bytes=r.controller_bytes)))
"""


def test_a_hop_serving_wrong_bytes_is_refused_and_never_loaded(
    setting: dict[str, Any], hosts_json: dict[str, Any], ssh: SshRunner
) -> None:
    """gpu1 holds a copy whose record says it is verified, but one byte is wrong (rot after it
    was hashed: same size, mtime put back): the hop from it is refused on gpu3, gpu3's copy
    deleted, gpu1 not used again; gpu3 then gets the file from the controller."""
    from tensorless_deploy.fleet.relay import CONTROLLER

    g = hosts_json["tiny_gguf"]
    source = Path(g["path"])
    bad = bytearray(source.read_bytes())
    bad[300_000] ^= 0xFF
    wrong = setting["tmp"] / "wrong.part"
    wrong.write_bytes(bytes(bad))
    remote = "/var/lib/tensorless/relay-test/tiny.part"
    ssh("gpu1", "mkdir -p /var/lib/tensorless/relay-test")
    ssh.put("gpu1", wrong, remote)
    # the record a verified receive leaves: the recipe's sha256, the size and mtime as they are
    ssh("gpu1", f"echo {g['sha256']} $(stat -c '%s %Y' {remote}) > {remote}.sha256")
    # the relay in a process of its own, as deploy runs it (pyinfra's state, gevent and all)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            RELAY_ONE,
            str(setting["inv"]),
            str(source),
            g["sha256"],
            str(g["size"]),
            remote,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    first, second = report["hops"]
    assert first["kind"] == "wrong", first
    assert first["line"].startswith("relay gpu1 -> gpu3: gpu3 hashed sha256 "), first
    assert "refused and deleted there" in first["line"]
    assert second["sender"] == CONTROLLER and second["kind"] == "ok", second
    assert second["offset"] == 0 and report["done"] == ["gpu3"] and report["failed"] == []
    assert report["controller_bytes"] == g["size"]
    got = ssh("gpu3", f"sha256sum {remote}").stdout.split()[0]
    assert got == g["sha256"]
    # gpu1's copy is not trusted again: its record is gone, so its own arrival hashes it again
    assert ssh("gpu1", f"ls {remote}.sha256", check=False).returncode != 0
