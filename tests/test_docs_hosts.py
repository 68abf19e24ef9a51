"""Docs that cannot lie, the hosts half: every block marked ``doc-test: hosts`` runs against the
playground, as an operator following docs/install.md types it, and the JSON every page documents
is checked against real runs; then the deploy summary's "serving" count in the three cases that
used to be wrong, and ``--transfer push`` through the registries configuration the operator's
skopeo already reads.

The playground is made by docs/install.md's own block (``eval "$(bash tests/hosts/playground.sh)"``)
once per module; every test then starts from hosts reset by the plugin, and gets the playground's
GPU profiles back. Outputs are compared with the set's addresses written as set 0's (the pages
show set 0; TL_SET picks another).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.doc_tests import (
    ROOT,
    blocks,
    doc_env,
    json_blocks,
    json_problems,
    run_page,
    session_env,
)
from tests.hosts.harness import Host, load_hosts, reset_host
from tests.hosts.playground import apply_profiles
from tests.test_docs import COVERED, HOST_PRODUCERS, doctor_check_ids

pytestmark = pytest.mark.hosts

INSTALL = "docs/install.md"
HOST_PAGES = [
    p
    for p in COVERED
    if p != INSTALL and any(b.mark is not None and b.mark.kind == "hosts" for b in blocks(ROOT / p))
]
TIMES: dict[str, float] = {}


def subs(hosts_json: Mapping[str, Any]) -> dict[str, str]:
    """The set's own names written as set 0's, as the pages show them."""
    s = int(hosts_json.get("set", 0))
    if s == 0:
        return {}
    return {
        str(hosts_json["base"]): "/var/tmp/tensorless-hosts",
        f"10.253.{s}.": "10.253.0.",
    }


@pytest.fixture(scope="module")
def playground(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """docs/install.md's playground block, run as written from a directory that holds the
    checkout as ./tensorless-deploy; the environment it leaves is every other page's."""
    work = tmp_path_factory.mktemp("install")
    (work / "tensorless-deploy").symlink_to(ROOT)
    env = doc_env({"HOME": str(work)})
    t0 = time.monotonic()
    result = run_page(ROOT / INSTALL, "hosts", work, env)
    TIMES["playground (install.md)"] = time.monotonic() - t0
    assert result.runs and result.problems == [], "\n\n".join(result.problems)
    out = session_env(work / ".doc-shell", env)
    for key in ("INV", "RECIPES", "HF_ENDPOINT", "REGISTRY"):
        assert out.get(key), f"the playground exported no {key}: {result.runs[-1].out}"
    assert Path(out["INV"]).is_file() and Path(out["RECIPES"]).is_dir()
    yield out
    print("\ndocs on hosts, seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in TIMES.items()))


@pytest.fixture
def hosts(hosts_json: dict[str, Any]) -> dict[str, Host]:
    """The set's hosts, with the playground's profiles back after the plugin's reset."""
    found = load_hosts()
    apply_profiles(found)
    return found


def page_env(playground: Mapping[str, str], home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {**playground, "HOME": str(home)}


def test_playground_leaves_what_install_md_says(
    playground: dict[str, str], hosts_json: dict[str, Any]
) -> None:
    inventory = Path(playground["INV"]).read_text(encoding="utf-8")
    for name in ("gpu1", "gpu2", "legacy1", "ghost"):
        assert f"'{name}'" in inventory, inventory
    assert (Path(playground["RECIPES"]) / "tensorless-test/tiny-llama-GGUF/p100.toml").is_file()
    pid = int((Path(hosts_json["base"]) / "run" / "hf-server.pid").read_text())
    os.kill(pid, 0)  # running, and teardown.sh stops every BASE/run/*.pid
    import urllib.request

    url = f"{playground['HF_ENDPOINT']}/api/models/tensorless-test/tiny-llama-GGUF"
    with urllib.request.urlopen(url, timeout=5) as r:
        assert json.load(r)["sha"] == "7c1d0f3a9e2b4d6c8a1f3e5b7d9c0a2e4f6b8d01"
    assert playground["PATH"].split(":")[0] == str(ROOT / ".venv" / "bin")


@pytest.mark.parametrize("page", HOST_PAGES)
def test_page_runs_on_the_playground(
    page: str,
    playground: dict[str, str],
    hosts: dict[str, Host],
    hosts_json: dict[str, Any],
    tmp_path: Path,
) -> None:
    t0 = time.monotonic()
    result = run_page(
        ROOT / page, "hosts", tmp_path, page_env(playground, tmp_path / "home"), subs(hosts_json)
    )
    TIMES[page] = time.monotonic() - t0
    print(f"\n{page}: {len(result.runs)} command(s) in {TIMES[page]:.1f} s")
    for r in result.runs:
        print(f"  exit {r.rc} {r.seconds:5.1f} s  {r.command.text}")
        if os.environ.get("TL_DOCS_SHOW"):
            print("\n".join("    | " + ln for ln in r.out))
    assert result.problems == [], "\n\n".join(result.problems)


# --------------------------------------------------------------------------- JSON keys


def cli_json(env: Mapping[str, str], *argv: str, codes: tuple[int, ...] = (0, 1)) -> Any:
    proc = subprocess.run(
        ["tensorless-deploy", *argv, "--json"],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode in codes, f"{argv}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    return json.loads(proc.stdout)


def test_documented_json_keys_exist_in_real_runs(
    playground: dict[str, str], hosts: dict[str, Host], hosts_json: dict[str, Any], tmp_path: Path
) -> None:
    env = page_env(playground, tmp_path / "home")
    inv, rec = ["-i", env["INV"]], ["--recipes", env["RECIPES"]]
    t0 = time.monotonic()
    # prepare first, on pristine hosts: the dry run, then a real one, which makes the models
    # directory on gpu1 and legacy1 (and writes their logs); gpu2 is skipped, ghost fails
    prepare = [
        cli_json(env, "prepare", *inv, "tiny", *rec, "--dry-run"),
        cli_json(env, "prepare", *inv, "tiny", *rec),
    ]
    samples: dict[str, list[Any]] = {
        # changed (gpu1, legacy1 with two instances), skipped (gpu2), failed (ghost)
        "deploy": [cli_json(env, "deploy", *inv, "tiny", *rec)],
        "doctor": [
            cli_json(env, "doctor", *inv, "tiny", *rec),
            cli_json(env, "doctor", *inv, *rec),
        ],
        "prepare": prepare,
        "hosts.json": [hosts_json],
    }
    # drift: gpu1 at another context than the catalog's
    samples["deploy"].append(
        cli_json(env, "deploy", *inv, "tiny", *rec, "--limit", "gpu1", "--context", "2048")
    )
    samples["status"] = [
        cli_json(env, "status", *inv, *rec, "--limit", "gpu1", "--limit", "legacy1", codes=(3,)),
        cli_json(env, "status", *inv, *rec),
    ]
    TIMES["json runs"] = time.monotonic() - t0
    assert set(samples) == HOST_PRODUCERS
    checked = 0
    for page in COVERED:
        for b, doc in json_blocks(ROOT / page):
            assert b.mark is not None
            if b.mark.arg in samples:
                assert json_problems(doc, samples[b.mark.arg]) == [], b.where
                checked += 1
    assert checked >= len(HOST_PRODUCERS)
    # every check ID a real doctor run writes is in docs/doctor.md's table
    ids = {
        c["id"]
        for d in samples["doctor"]
        for h in d["hosts"]
        for r in h["results"]
        for c in r["checks"]
    }
    documented = doctor_check_ids()
    undocumented = sorted(
        i
        for i in ids
        if i not in documented and not (i.endswith(".read") and "<section>.read" in documented)
    )
    assert undocumented == [], "check IDs missing from docs/doctor.md's table"
    # what a deploy left serving, per host
    rows = {h["host"]: h for h in samples["deploy"][0]["hosts"]}
    assert {h: r["serving"] for h, r in rows.items()} == {
        "gpu1": "new",
        "gpu2": None,
        "legacy1": "new",
        "ghost": None,
    }


# --------------------------------------------------------------------------- deploy summary


def deploy(env: Mapping[str, str], *argv: str) -> tuple[int, list[str]]:
    """``tensorless-deploy deploy -i $INV tiny --recipes $RECIPES ARGV``: its exit status and
    what it printed (stdout, then stderr: the summary is the last line)."""
    argv = ("-i", env["INV"], "tiny", "--recipes", env["RECIPES"], *argv)
    proc = subprocess.run(
        ["tensorless-deploy", "deploy", *argv],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, (proc.stdout + proc.stderr).strip().splitlines()


def health(env: Mapping[str, str], host: Host, port: int = 8080) -> int:
    from tests.hosts.harness import ssh_run

    out = ssh_run(
        host,
        f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health || true",
        check=False,
    )
    return int(str(out.stdout).strip() or 0)


def test_dry_run_says_would_serve_and_serves_nothing(
    playground: dict[str, str], hosts: dict[str, Host], tmp_path: Path
) -> None:
    env = page_env(playground, tmp_path / "home")
    rc, lines = deploy(env, "--limit", "gpu1", "--limit", "gpu2", "--dry-run")
    assert rc == 1
    assert lines[-1] == "1 of 2 host(s) would serve; failed or skipped: gpu2", lines
    assert health(env, hosts["gpu1"]) == 0  # nothing was deployed


def test_a_restored_unit_is_counted_as_serving(
    playground: dict[str, str], hosts: dict[str, Host], tmp_path: Path
) -> None:
    env = page_env(playground, tmp_path / "home")
    rc, lines = deploy(env, "--limit", "gpu1")
    assert rc == 0 and lines[-1] == "1 of 1 host(s) serving", lines
    # a new unit llama-server refuses to start: deploy puts the previous one back
    rc, lines = deploy(env, "--limit", "gpu1", "--", "--no-such-flag")
    assert rc == 1
    assert "    restored the previous unit; it is healthy again" in lines, lines
    assert lines[-1] == (
        "1 of 1 host(s) serving (gpu1 on the unit it had before); failed or skipped: gpu1"
    ), lines
    assert health(env, hosts["gpu1"]) == 200


def test_a_stopped_roll_counts_the_hosts_still_serving_the_old_recipe(
    playground: dict[str, str], hosts: dict[str, Host], tmp_path: Path
) -> None:
    env = page_env(playground, tmp_path / "home")
    rc, lines = deploy(env, "--limit", "gpu1", "--limit", "legacy1")
    assert rc == 0 and lines[-1] == "2 of 2 host(s) serving", lines
    rc, lines = deploy(
        env, "--limit", "gpu1", "--limit", "legacy1", "--serial", "1", "--", "--no-such-flag"
    )
    assert rc == 1
    assert lines[-1] == (
        "2 of 2 host(s) serving (gpu1, legacy1 on the units they had before); "
        "failed or skipped: gpu1, legacy1"
    ), lines
    assert health(env, hosts["gpu1"]) == 200 and health(env, hosts["legacy1"]) == 200


# --------------------------------------------------------------------------- push


def push_env(playground: Mapping[str, str], home: Path) -> dict[str, str]:
    env = page_env(playground, home)
    env.pop("CONTAINERS_REGISTRIES_CONF", None)
    return env


INSECURE = '[[registry]]\nlocation = "{}"\ninsecure = true\n'


@pytest.mark.skipif(shutil.which("skopeo") is None, reason="needs skopeo on this machine")
def test_push_reads_the_registries_conf_skopeo_and_podman_read(
    playground: dict[str, str], hosts: dict[str, Host], tmp_path: Path
) -> None:
    """The controller's own configuration, no variable set: the user's
    ~/.config/containers/registries.conf, and a drop-in under /etc/containers/registries.conf.d
    (shown to this run alone through a private mount namespace); without either, skopeo refuses
    the plain-HTTP registry and deploy says so."""
    registry = playground["REGISTRY"]

    # 1. the operator's own file
    home = tmp_path / "user"
    conf = home / ".config" / "containers" / "registries.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(INSECURE.format(registry), encoding="utf-8")
    reset_host(hosts["gpu1"], images=True)
    rc, lines = deploy(push_env(playground, home), "--limit", "gpu1", "--transfer", "push")
    assert rc == 0 and lines[-1] == "1 of 1 host(s) serving", lines

    # 2. nothing configured: refused, with skopeo's reason
    reset_host(hosts["gpu1"], images=True)
    rc, lines = deploy(
        push_env(playground, tmp_path / "none"), "--limit", "gpu1", "--transfer", "push"
    )
    out = "\n".join(lines)
    assert rc == 1 and "HTTP response to HTTPS client" in out, out
    import inspect

    from tensorless_deploy.fleet import push as push_module

    if "registries.conf" in inspect.getsource(push_module.image_archive):
        # once fleet/push.py's refusal names the fix (issue 21): the file to mark it insecure in
        assert "registries.conf" in out and registry in out, out

    # 3. the system's drop-in directory, as podman reads it
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root for a private /etc/containers/registries.conf.d")
    dropin = tmp_path / "registries.conf.d"
    dropin.mkdir()
    system = Path("/etc/containers/registries.conf.d")
    for f in system.glob("*.conf") if system.is_dir() else []:
        shutil.copy2(f, dropin / f.name)
    (dropin / "50-playground.conf").write_text(INSECURE.format(registry), encoding="utf-8")
    reset_host(hosts["gpu1"], images=True)
    env = push_env(playground, tmp_path / "system")
    cmd = (
        f'mount --bind {dropin} {system} && exec tensorless-deploy deploy -i "$INV" tiny '
        '--recipes "$RECIPES" --limit gpu1 --transfer push'
    )
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "1 of 1 host(s) serving", proc.stderr
