"""docs/pyinfra.md's deploy file, run by the real ``pyinfra`` command line against a test host.

The deploy file and the command line are read out of the doc (its ```python block that starts
with ``# deploy.py`` and the ``pyinfra`` line of its ```sh block), so the doc cannot drift from
what is tested. The inventory is this test's: one test host, reached as the ``operator`` user with
sudo, given the tiny test recipe through the host data the deploy file reads.

"No change" is read from pyinfra's own results: the ``--> Results:`` table it prints at the end
of a run (per operation and in its ``Grand total`` row: hosts, success = changed, error, no
change), then from a third run with ``--json`` (``results.totals``, and every operation listing
the host under ``no_change``); the service was not restarted by either.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import TINY_REPO, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner

pytestmark = pytest.mark.hosts

DOC = Path(__file__).parent.parent / "docs" / "pyinfra.md"
PYINFRA = Path(sys.executable).parent / "pyinfra"
HOST = "gpu1"
UNIT = "tensorless-tiny-p100"
FILE = "tiny-llama.gguf"
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def doc_blocks(kind: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(DOC.read_text(encoding="utf-8")) if lang == kind]


def doc_deploy_file() -> str:
    found = [b for b in doc_blocks("python") if b.startswith("# deploy.py\n")]
    assert len(found) == 1, "docs/pyinfra.md: one ```python block starting with # deploy.py"
    return found[0]


def doc_command() -> list[str]:
    lines = [
        line.strip()
        for block in doc_blocks("sh")
        for line in block.splitlines()
        if line.strip().startswith("pyinfra ")
    ]
    assert lines, "docs/pyinfra.md: no pyinfra command line in a ```sh block"
    return shlex.split(lines[0].split("#", 1)[0])


def results(output: str) -> dict[str, dict[str, int]]:
    """pyinfra's ``--> Results:`` table: operation name (its last ``|`` part) or "Grand total"
    -> hosts, success (changed), error, no_change; "-" reads as 0."""
    text = _ANSI.sub("", output)
    assert text.count("--> Results:") == 1, f"no results table in pyinfra's output:\n{output}"
    table = text.split("--> Results:", 1)[1].split("\n\n", 1)[0].strip().splitlines()
    header = re.split(r"\s{2,}", table[0].strip())
    assert header == ["Operation", "Hosts", "Success", "Error", "No Change"], table[0]
    rows: dict[str, dict[str, int]] = {}
    for line in table[1:]:
        name, *counts = re.split(r"\s{2,}", line.strip())
        keys = ("hosts", "success", "error", "no_change")
        values = [0 if v == "-" else int(v) for v in counts]
        rows[name.rsplit(" | ", 1)[-1]] = dict(zip(keys, values, strict=True))
    assert "Grand total" in rows, table
    return rows


def outcomes(rows: dict[str, dict[str, int]]) -> dict[str, str]:
    """Each operation's outcome on the one host: changed, no change or error."""
    names = {"success": "changed", "no_change": "no change", "error": "error"}
    return {
        op: next(names[k] for k in names if counts[k])
        for op, counts in rows.items()
        if op != "Grand total"
    }


def pyinfra(workdir: Path, argv: list[str], env: dict[str, str]) -> tuple[str, str, float]:
    """Run a ``pyinfra ...`` command line from the venv: (stdout, stdout + stderr, seconds)."""
    assert argv[0] == "pyinfra"
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(PYINFRA), *argv[1:]],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}:\n{out}"
    assert "Traceback" not in out, out
    return proc.stdout, out, took


def test_doc_deploy_file_serves_then_second_pyinfra_run_changes_nothing(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    hf: HFServer,
    ssh: SshRunner,
    reset_host: Callable[..., None],
    clean_hosts: None,
) -> None:
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    host = test_hosts[HOST]
    operator = host.as_user(host.sudo_user)
    argv = doc_command()
    deploy_name = next(a for a in argv[1:] if a.endswith(".py") and a != argv[1])
    (tmp_path / deploy_name).write_text(doc_deploy_file(), encoding="utf-8")
    write_inventory(
        tmp_path / argv[1],
        [operator],
        data={HOST: {"serve_model": "tiny", "serve_recipes": str(catalog)}},
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PYINFRA_"))},
        "HF_ENDPOINT": hf.url,
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }

    reset_host(HOST, images=True)  # a first run on a fresh host: the image is pulled too

    _, first, took1 = pyinfra(tmp_path, argv, env)
    assert outcomes(results(first)) == {
        "engine image by digest": "changed",
        "model file, sha256-verified": "changed",
        "unit tensorless-tiny-p100": "changed",
        "restart tensorless-tiny-p100 and /health": "changed",
        "tensorless-tiny-p100 running and /health": "no change",  # _if: the unit did not change
        "no secrets for tensorless-tiny-p100": "no change",  # no API key or TLS asked for
    }, first
    assert hf.stats(TINY_REPO, FILE).bytes_sent == hosts_json["tiny_gguf"]["size"]
    body = json.dumps({"prompt": "hello", "max_tokens": 8, "temperature": 0})
    answer = json.loads(
        ssh(
            HOST,
            "curl -fsS http://127.0.0.1:8080/v1/completions "
            f"-H 'Content-Type: application/json' -d '{body}'",
        ).stdout
    )
    assert answer["model"] == TINY_REPO and answer["choices"][0]["text"], answer
    assert answer["usage"]["completion_tokens"] > 0, answer
    started = ssh(HOST, f"systemctl show -p ActiveEnterTimestampMonotonic --value {UNIT}").stdout

    _, second, took2 = pyinfra(tmp_path, argv, env)
    rows = results(second)
    assert set(outcomes(rows).values()) == {"no change"}, second
    assert rows["Grand total"] == {"hosts": 6, "success": 0, "error": 0, "no_change": 6}, second

    as_json, _, _ = pyinfra(tmp_path, [*argv, "--json"], env)
    summary = json.loads(as_json)["results"]
    assert summary["totals"] == {"hosts": 6, "success": 0, "error": 0, "no_change": 6}, summary
    assert all(op["no_change"] == [HOST] for op in summary["operations"]), summary
    assert hf.stats(TINY_REPO, FILE).bytes_sent == hosts_json["tiny_gguf"]["size"]
    # nothing was restarted by the second and third runs
    assert ssh(HOST, f"systemctl show -p ActiveEnterTimestampMonotonic --value {UNIT}").stdout == (
        started
    )
    print(f"\npyinfra first run {took1:.1f} s, second run {took2:.1f} s")


def doc_fact_commands() -> list[list[str]]:
    """The ``pyinfra INV fact ...`` lines of docs/pyinfra.md's ```sh blocks, split."""
    lines = [
        shlex.split(line)
        for block in doc_blocks("sh")
        for line in block.splitlines()
        if line.startswith("pyinfra ") and " fact " in line
    ]
    assert lines, "docs/pyinfra.md: no pyinfra ... fact line in a ```sh block"
    return lines


def _fact_data(output: str, fact: str) -> dict[str, Any]:
    """The JSON pyinfra's `fact` command prints after "--> Fact data for: FACT ..."."""
    text = _ANSI.sub("", output)
    head = f"--> Fact data for: {fact}"
    assert head in text, text
    body = text.split(head, 1)[1].split("\n", 1)[1]
    end = body.index("\n}\n") + 2
    data: dict[str, Any] = json.loads(body[:end])
    return data


def test_the_pyinfra_cli_prints_every_documented_fact(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    hf: HFServer,
    ssh: SshRunner,
    clean_hosts: None,
) -> None:
    """`pyinfra INV fact tensorless_deploy.facts.pyinfra.HostSurvey` once crashed pyinfra's
    command line ("Cannot serialize: HostFacts"; DeployedUnits and ModelBlob the same): every
    fact returns plain data now, which the typed value reads back from."""
    from tensorless_deploy.facts import pyinfra as facts
    from tensorless_deploy.hub import cache_paths, host_state_dir

    host = test_hosts[HOST]
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    inventory = write_inventory(tmp_path / "inventory.py", [host])
    deployed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensorless_deploy",
            "deploy",
            "-i",
            str(inventory),
            "tiny",
            "--recipes",
            str(catalog),
        ],
        env={**os.environ, "HF_ENDPOINT": hf.url},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    g = hosts_json["tiny_gguf"]
    models = "/var/lib/tensorless/models"
    p = cache_paths(
        models, host_state_dir(models), TINY_REPO, TINY_COMMIT, g["hf_file"], g["sha256"]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYINFRA_")}
    mod = "tensorless_deploy.facts.pyinfra"
    # the doc's own lines first (its inventory and host names swapped for this test's), then
    # the facts an operator asks with arguments, or section by section
    documented = [
        (argv[3], ["--limit", HOST] if "--limit" in argv else []) for argv in doc_fact_commands()
    ]
    assert [f for f, _ in documented] == [f"{mod}.HostSurvey", f"{mod}.DeployedUnits"], documented
    asked = [
        *documented,
        (f"{mod}.ModelBlob", [f"blob={p.blob}", f"stamp={p.stamp}", f"snapshot={p.snapshot}"]),
        (f"{mod}.NvidiaGpus", []),
        (f"{mod}.CdiSpecs", []),
    ]
    # what the host itself says, read over ssh, to hold each fact against
    smi = ssh(HOST, "nvidia-smi --query-gpu=name,uuid --format=csv,noheader").stdout
    name, uuid = (f.strip() for f in smi.strip().split(","))
    specs = ssh(HOST, "ls /etc/cdi/*.yaml /etc/cdi/*.json /var/run/cdi/* 2>/dev/null; true")
    active = ssh(HOST, f"systemctl is-active {UNIT}; true").stdout.strip()
    for fact, args in asked:
        _, out, _ = pyinfra(tmp_path, ["pyinfra", str(inventory), "fact", fact, *args], env)
        assert "Cannot serialize" not in out, out
        data = _fact_data(out, fact)[HOST]
        typed = getattr(facts, fact.rsplit(".", 1)[1]).typed(data)
        if fact.endswith("HostSurvey"):
            assert typed.gpus.state == "ok", typed.gpus
            assert [(g.name, g.uuid) for g in typed.gpus.gpus] == [(name, uuid)], typed.gpus
            assert typed.engines.podman.present, typed.engines
        elif fact.endswith("DeployedUnits"):
            (unit,) = typed
            assert unit.name == UNIT and unit.health == 200, unit
            assert active == "active", active
        elif fact.endswith("ModelBlob"):
            size = int(ssh(HOST, f"stat -L -c %s {p.blob}").stdout)
            assert typed.exists and typed.verified and typed.link == p.link_target, typed
            assert typed.size == size == g["size"], (typed, size)
        elif fact.endswith("NvidiaGpus"):
            assert [(x.name, x.uuid) for x in typed.gpus] == [(name, uuid)], typed
        elif fact.endswith("CdiSpecs"):
            assert sorted(s.path for s in typed) == sorted(specs.stdout.split()), typed
            assert any("nvidia.com/gpu=0" in s.qualified_devices for s in typed), typed
