"""gate run on the real test hosts, as a recipe author runs it on a draft copy of the tiny recipe
in a git repository of its own: the receipt measured by the real llama-server (its own timings)
and written into the file with its comments kept, status released, `check` and `gate check`
passing; an untuned run and a run below an absurd old receipt refused, the file untouched; the
serving unit deployed beside it untouched (the same start, invocation and container), and no
scratch unit, container or port left, read back with ssh, systemctl, podman and curl; a SIGTERM
mid-run removes the scratch instance too; a host whose only card serves is refused."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.hostplan.gate import SCRATCH_PORTS
from tests.hosts.fleet import cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner
from tests.recipe_tools import to_toml

pytestmark = pytest.mark.hosts

SERVING = "tensorless-tiny-p100"
REL = "tensorless-test/tiny-llama-GGUF/p100.toml"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
COMMENTS = (
    "# tiny on the P100 stand-in: a draft until the gate measures it",
    '"status" = "draft"  # gate run --promote releases it',
    "# the receipt below is the gate's to write",
)


class Author:
    """A recipe author's checkout: a git repository holding a draft copy of the tiny recipe."""

    def __init__(self, tmp: Path, hosts_json: dict[str, Any], host: Host, hf: HFServer) -> None:
        self.host = host
        self.repo = tmp / "drafts"
        self.repo.mkdir()
        self.file = self.repo / REL
        self.inventory = write_inventory(tmp / "inventory.py", [host])
        self.env = {"HF_ENDPOINT": hf.url, "NO_COLOR": "1"}
        self.serving_catalog = write_catalog(tmp / "serving", tiny_recipe(hosts_json, TINY_COMMIT))
        self.image = str(hosts_json["image"]["ref"])
        self.hosts_json = hosts_json
        self.git("init", "-q", "-b", "main")
        self.write(decode=1.0)

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.repo), *args],
            capture_output=True,
            text=True,
            env={**os.environ, **GIT_ENV},
            check=True,
        ).stdout

    def write(self, decode: float) -> None:
        """The draft, with comments, and an old receipt of ``decode`` tok/s; committed."""
        recipe = tiny_recipe(self.hosts_json, TINY_COMMIT)
        recipe["receipt"] = {"decode_tps": {"short": decode}, "summary": "typed by hand"}
        text = to_toml(recipe)
        text = text.replace('"status" = "released"', "\n".join(COMMENTS[:2]))
        text = text.replace('\n["receipt"]', f'\n{COMMENTS[2]}\n["receipt"]')
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.file.write_text(text, encoding="utf-8")
        self.git("add", "-A")
        self.git("commit", "-q", "-m", f"tiny: a draft, receipt {decode}")

    def gate_run(self, *extra: str, code: int) -> dict[str, Any]:
        proc = cli(
            "gate", "run", "-i", str(self.inventory), "tiny", "--recipes", str(self.repo),
            "--promote", "--json", *extra, env=self.env, timeout=900,
        )  # fmt: skip
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode == code, (proc.stdout, proc.stderr)
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc


def _author(tmp: Path, hosts_json: dict[str, Any], host: Host, hf: HFServer) -> Author:
    return Author(tmp, hosts_json, host, hf)


def _serving(ssh: SshRunner, host: Host) -> tuple[str, str]:
    """What would change if the serving unit were touched: its start and its container."""
    unit = ssh(
        host,
        f"systemctl show -p ActiveEnterTimestamp -p InvocationID -p NRestarts {SERVING}.service",
    ).stdout.strip()
    container = ssh(
        host, f"podman inspect --format '{{{{.Id}}}} {{{{.State.StartedAt}}}}' {SERVING}"
    )
    return unit, container.stdout.strip()


def _nothing_left(ssh: SshRunner, host: Host) -> None:
    """No scratch unit (transient or not), container, listener or answer on a scratch port."""
    units = ssh(host, "systemctl list-units --all --no-legend --plain 'tensorless-gate-*'").stdout
    assert units.strip() == "", units
    transient = ssh(host, "ls /run/systemd/transient/").stdout
    assert "tensorless-gate" not in transient, transient
    containers = ssh(host, "podman ps -a --format '{{.Names}}'").stdout.split()
    assert not [c for c in containers if c.startswith("tensorless-gate-")], containers
    listening = ssh(host, "ss -Hltn").stdout
    scratch = [p for p in re.findall(r":(\d+)\s", listening) if int(p) in SCRATCH_PORTS]
    assert scratch == [], listening
    probe = ssh(host, f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{SCRATCH_PORTS.start}/health",
                check=False)  # fmt: skip
    assert probe.returncode != 0 and probe.stdout.strip() in ("000", ""), probe


def test_gate_run_promotes_a_draft_beside_a_serving_unit_it_never_touches(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    hf: HFServer,
    ssh: SshRunner,
    profile: Any,
) -> None:
    host = gpu_hosts[0]
    profile(host, "p100x2")  # two P100s: one serves, the gate measures on the other
    author = _author(tmp_path, hosts_json, host, hf)
    deployed = cli(
        "deploy", "-i", str(author.inventory), "tiny", "--recipes", str(author.serving_catalog),
        "--instances", "1", env=author.env,
    )  # fmt: skip
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    before = _serving(ssh, host)
    original = author.file.read_text(encoding="utf-8")

    doc = author.gate_run(code=0)
    assert doc["ok"] and doc["written"] and doc["promoted"] and doc["tuned"], doc
    assert doc["host"] == host.name and doc["gpu"]["index"] == 1  # GPU 0 serves
    assert doc["unit"].startswith("tensorless-gate-tiny-p100-") and doc["unit"] != SERVING
    assert doc["port"] != 8080 and doc["image"] == author.image.rpartition("@")[2]
    # the real llama-server's own timings: 3 runs of 256 tokens, prefill at 4k with 4095
    assert doc["runs"] == 3 and doc["generated_tokens"] == 256 and doc["prompt_tokens"] > 100
    assert doc["prefill_4k_tokens"] == 4095 and doc["decode_tps"]["median"] > 1.0
    assert doc["comparisons"][0]["key"] == "decode_tps.short" and doc["comparisons"][0]["meets"]
    assert doc["cleanup"][0].startswith(f"gone: unit {doc['unit']}.service")

    text = author.file.read_text(encoding="utf-8")
    for line in COMMENTS[:1] + COMMENTS[2:]:
        assert line in text.splitlines(), line
    assert '"status" = "released"  # gate run --promote releases it' in text
    kept = original[: original.index('"status"')]
    assert text.startswith(kept)  # every line before the status, byte for byte
    decode = round(doc["decode_tps"]["median"], 2)
    assert f'decode_tps" = {{ short = {decode:.2f} }}' in text, text
    source = re.search(r'^source = "(.*)"$', text, re.M)
    assert source is not None, text
    assert author.image in source.group(1) and "p100 (Tesla P100-PCIE-16GB)" in source.group(1)
    assert "driver 535.183.01" in source.group(1) and "engine-cpu-test" in source.group(1)
    assert re.search(r"gate run \d{4}-\d\d-\d\d:", source.group(1))
    checked = cli("check", str(author.repo))
    assert checked.returncode == 0, checked.stderr
    gated = cli("gate", "check", "--base", "HEAD", "--recipes", str(author.repo))
    assert gated.returncode == 0 and "0 new, 1 changed, 0 deleted; all hold" in gated.stdout, gated

    assert _serving(ssh, host) == before  # same start, same invocation, same container
    health = ssh(host, "curl -fsS http://127.0.0.1:8080/health").stdout
    assert "ok" in health
    _nothing_left(ssh, host)

    # untuned: refused for --promote before anything starts; the file untouched
    author.git("commit", "-qam", "tiny: measured and released")
    written = author.file.read_bytes()
    proc = cli(
        "gate", "run", "-i", str(author.inventory), "tiny", "--recipes", str(author.repo),
        "--promote", "--", "--top-k", "5", env=author.env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith(
        "--promote refused: the run would be untuned (extra llama-server args: --top-k 5)"
    ), proc.stderr
    assert author.file.read_bytes() == written

    # an absurd old receipt: measured honestly, refused, nothing written
    author.write(decode=1e9)
    written = author.file.read_bytes()
    doc = author.gate_run(code=1)
    assert not doc["written"] and not doc["promoted"] and doc["file"] == str(author.file)
    (why,) = doc["refusals"]
    assert (
        why.startswith("decode_tps.short ") and "below it by more than the tolerance (10%)" in why
    )
    assert doc["not_written"].startswith("--promote refused: decode_tps.short")
    assert author.file.read_bytes() == written
    assert _serving(ssh, host) == before
    _nothing_left(ssh, host)


def test_sigterm_mid_run_removes_the_scratch_instance(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    hf: HFServer,
    ssh: SshRunner,
) -> None:
    host = gpu_hosts[0]
    author = _author(tmp_path, hosts_json, host, hf)
    written = author.file.read_bytes()
    argv = [
        sys.executable, "-m", "tensorless_deploy", "gate", "run", "-i", str(author.inventory),
        "tiny", "--recipes", str(author.repo), "--promote",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **author.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            up = ssh(host, "systemctl list-units --no-legend --plain 'tensorless-gate-*'").stdout
            if "running" in up:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.5)
        else:
            pytest.fail("the scratch instance never ran")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in err, (out, err)
    assert "Traceback" not in err
    assert author.file.read_bytes() == written
    _nothing_left(ssh, host)


def test_a_host_whose_only_card_serves_is_refused(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    hf: HFServer,
    ssh: SshRunner,
) -> None:
    host = gpu_hosts[0]  # its default profile: one P100
    author = _author(tmp_path, hosts_json, host, hf)
    deployed = cli(
        "deploy", "-i", str(author.inventory), "tiny", "--recipes", str(author.serving_catalog),
        env=author.env,
    )  # fmt: skip
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    before = _serving(ssh, host)
    proc = cli(
        "gate", "run", "-i", str(author.inventory), "tiny", "--recipes", str(author.repo),
        env=author.env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{host.name}: every p100 card here is busy (GPU 0 serves {SERVING})" in proc.stderr, (
        proc.stderr
    )
    assert _serving(ssh, host) == before
    _nothing_left(ssh, host)


def test_a_host_whose_commands_do_not_run_as_root_is_refused_first(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    hf: HFServer,
    ssh: SshRunner,
) -> None:
    """The scratch instance is a transient unit of root's, as deploy's units are: gate run as
    the SSH user operator without _sudo is refused with access.root and its fix before anything
    is fetched or started, as deploy's preflight refuses it; the recipe file is untouched."""
    host = gpu_hosts[0]
    author = _author(tmp_path, hosts_json, host, hf)
    plain = write_inventory(tmp_path / "operator.py", [host.as_user(host.sudo_user)])
    proc = cli(
        "gate", "run", "-i", str(plain), "tiny", "--recipes", str(author.repo), "--promote",
        env=author.env,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        f"{host.name}: access.root: commands run as operator (uid " in proc.stderr
        and "not root, and the inventory does not set _sudo (fix: give operator NOPASSWD sudo"
        in proc.stderr
    ), proc.stderr
    assert author.git("status", "--porcelain") == ""  # no receipt written, nothing promoted
    _nothing_left(ssh, host)
