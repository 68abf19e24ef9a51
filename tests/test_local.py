"""run --dry-run, pull and the local model cache, driven as a user runs them. The model server
is the project's Hub-compatible test server on loopback; the only stand-in is nvidia-smi."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gguf_tools import write_tiny_llama
from tests.hosts.fleet import cli, write_catalog
from tests.hosts.hf_server import HFServer
from tests.recipe_tools import example

PROFILES = Path(__file__).parent / "hosts" / "profiles"
COMMIT = "7c1d0f3a9e2b4d6c8a1f3e5b7d9c0a2e4f6b8d01"
REPO = "tensorless-test/tiny-llama-GGUF"
FILE = "tiny-llama.gguf"
P100_UUID = "GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90"


@pytest.fixture
def standin_smi(tmp_path: Path) -> dict[str, str]:
    """PATH and data dir for the recorded P100 nvidia-smi (a stand-in: no GPU here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    shutil.copy(PROFILES / "_standin" / "nvidia-smi", smi)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "NVIDIA_STANDIN_DIR": str(PROFILES / "p100" / "root" / "usr" / "share" / "nvidia-standin"),
    }


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[tuple[HFServer, Path, dict[str, Any], bytes]]:
    """The tiny GGUF published Hub-style on loopback, and a catalog pinning it."""
    gguf = tmp_path / FILE
    write_tiny_llama(gguf)
    data = gguf.read_bytes()
    import hashlib

    recipe = example()
    sha = hashlib.sha256(data).hexdigest()
    recipe["model"].update(
        name="tiny", hf_repo=REPO, revision=COMMIT, file=FILE, sha256=sha, size_bytes=len(data)
    )
    recipe["run"]["alias"] = REPO
    with HFServer("127.0.0.1") as hf:
        hf.publish(REPO, {FILE: data}, commit=COMMIT)
        yield hf, write_catalog(tmp_path / "recipes", recipe), recipe, data


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_dry_run_refuses_without_a_driver_and_says_the_fix() -> None:
    proc = cli("run", "pn3", "--dry-run")
    assert proc.returncode == 1
    assert "refused on this machine" in proc.stderr
    assert "driver.present: nvidia-smi not found" in proc.stderr
    assert "fix: install the NVIDIA driver" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_dry_run_with_standin_prints_the_exact_command(standin_smi: dict[str, str]) -> None:
    proc = cli(
        "run",
        "pn3",
        "--dry-run",
        "--json",
        "--port",
        "8099",
        "--engine",
        "podman",
        env=standin_smi,
    )
    out = json.loads(proc.stdout)
    # a dry run exits as the real run would: refused (1) exactly where it would refuse
    assert proc.returncode == (1 if out["would_refuse"] else 0), proc.stderr
    assert out["exit_code"] == proc.returncode
    cmd = out["command"]
    image = (
        "ghcr.io/iammrduncan/tensorless-engine@sha256:"
        "35409ff97c2f518e468790c28bd19206ae777a945fcffe5775585e28fd9939a7"
    )
    # podman run, the launcher's own options (no engine health check: run polls /health), the
    # pinned image, then exactly llama-server's argv
    assert cmd[:4] == ["podman", "run", "--rm", "--pull=never"]
    assert cmd[cmd.index(image) + 1 :] == out["server_args"]
    opts = cmd[4 : cmd.index(image)]
    assert "--read-only=true" in opts  # the one boolean flag, one word
    opts.remove("--read-only=true")
    pairs = list(zip(opts[::2], opts[1::2], strict=True))
    assert ("--user", "10001:10001") in pairs and ("--tmpfs", "/tmp") in pairs
    assert ("--pids-limit", "4096") in pairs
    assert ("--device", f"nvidia.com/gpu={P100_UUID}") in pairs
    assert [f for f, _ in pairs if f == "--device"] == ["--device"]  # exactly one card
    assert not [f for f, _ in pairs if f.startswith("--health")]
    assert ("--network", "host") in pairs and ("--cap-drop", "all") in pairs
    assert ("--label", "io.tensorless.health=http://127.0.0.1:8099/health") in pairs
    assert out["server_args"][:6] == [
        "-m",
        "/models/Qwen3.8-27B-PN3-P0k19.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "8099",
    ]
    assert out["address"] == "127.0.0.1:8099" and out["url"] == "http://127.0.0.1:8099"
    assert out["tuned"] is True and out["gpu_uuids"] == [P100_UUID]
    # what a real run would still stop at on this machine (no toolkit here), each with its fix
    assert all(c["fix"] for c in out["would_refuse"])
    human = cli(
        "run", "pn3", "--dry-run", "--context", "4096", "--engine", "podman", env=standin_smi
    )
    assert human.returncode == proc.returncode
    if out["would_refuse"]:  # the real run refuses before it fetches anything: compare
        real = cli("run", "pn3", "--context", "4096", "--engine", "podman", env=standin_smi)
        assert real.returncode == human.returncode == 1, real.stderr
        first = out["would_refuse"][0]["id"]
        assert f"a real run would refuse: {first}:" in human.stderr
        assert f"  {first}: " in real.stderr
    assert "command   podman run" in human.stdout
    assert "address   http://127.0.0.1:8080" in human.stdout
    assert "untuned: context 4096 instead of the measured 65536" in human.stderr


def test_run_serves_one_card_and_gpu_picks_it(standin_smi: dict[str, str]) -> None:
    """Two matching P100s here: a foreground run is one instance, on the first card unless
    --gpu names another (by index or UUID); a card that is not there is refused."""
    two = {
        **standin_smi,
        "NVIDIA_STANDIN_DIR": str(
            PROFILES / "p100x2" / "root" / "usr" / "share" / "nvidia-standin"
        ),
    }
    second = "GPU-a7d41c9e-2b35-4f86-8e1a-5c9b0d3e6f21"
    for extra, uuid in (([], P100_UUID), (["--gpu", "1"], second), (["--gpu", second], second)):
        proc = cli("run", "pn3", "--dry-run", "--json", *extra, env=two)
        out = json.loads(proc.stdout)
        assert proc.returncode == (1 if out["would_refuse"] else 0), proc.stderr
        assert out["gpu_uuids"] == [uuid] and out["address"] == "127.0.0.1:8080", extra
    proc = cli("run", "pn3", "--dry-run", "--gpu", "7", env=two)
    assert proc.returncode == 1 and "instances.cards: GPU 7 is not a usable card here" in (
        proc.stderr
    ), proc.stderr
    bad = cli("run", "pn3", "--dry-run", "--gpu", "seven", env=two)
    assert bad.returncode == 2 and bad.stderr.startswith("--gpu seven: must be"), bad.stderr


def test_dry_run_previews_a_card_this_machine_lacks() -> None:
    """No GPU here at all: `run --dry-run --card p100` still shows the p100 recipe's command,
    the device a stand-in named GPU-PREVIEW; without --dry-run the same is refused."""
    proc = cli("run", "pn3", "--dry-run", "--card", "p100", "--json", "--engine", "podman")
    out = json.loads(proc.stdout)
    # shown, and exits as a real run here would: refused, for the driver this machine lacks
    assert proc.returncode == 1, proc.stderr
    assert "driver.present" in [c["id"] for c in out["would_refuse"]]
    assert out["preview"] is True and out["gpu_uuids"] == ["GPU-PREVIEW"]
    assert "nvidia.com/gpu=GPU-PREVIEW" in out["command"]
    assert out["recipe"].endswith("/p100.toml") and out["server_args"][-1] == "--jinja"
    human = cli("run", "pn3", "--dry-run", "--card", "p100")
    assert "preview   no p100 card here" in human.stderr
    assert "a real run would refuse: driver.present" in human.stderr
    real = cli("run", "pn3", "--card", "p100")
    assert real.returncode == human.returncode == 1 and "driver.present" in real.stderr
    unknown = cli("run", "pn3", "--dry-run", "--card", "h100")
    assert unknown.returncode == 2 and "no recipe for card 'h100'" in unknown.stderr


def test_dry_run_state_table(tmp_path: Path, standin_smi: dict[str, str]) -> None:
    draft = example()
    draft["status"] = "draft"
    unpublished = example()
    unpublished["model"].update(hf_repo="org/unpub-GGUF", name="unpub", sha256="0" * 64)
    unpublished["run"]["alias"] = "org/unpub-GGUF"
    cat = write_catalog(tmp_path / "recipes", draft, unpublished)
    refused = cli("run", "pn3", "--dry-run", "--recipes", str(cat), env=standin_smi)
    assert refused.returncode == 2 and "--allow-draft" in refused.stderr
    shown = cli("run", "pn3", "--dry-run", "--allow-draft", "--recipes", str(cat), env=standin_smi)
    assert "command   podman run" in shown.stdout or "command   docker run" in shown.stdout
    # unpublished: shown by --dry-run, refused by run and pull even with --allow-draft; the dry
    # run exits as the run would (2, the state table's refusal), after showing the command
    dry = cli("run", "unpub", "--dry-run", "--recipes", str(cat), env=standin_smi)
    assert "command   " in dry.stdout and "recipe.state" in dry.stderr
    assert dry.returncode == 2, dry.stderr
    for args in (["run", "unpub", "--allow-draft"], ["pull", "unpub", "--allow-draft"]):
        proc = cli(*args, "--recipes", str(cat), env=standin_smi)
        assert proc.returncode == 2 and "not published" in proc.stderr, proc.stderr


def _fetch(recipe_dir: Path, cache: Path, hf: HFServer) -> Any:
    """fetch_model as pull uses it, in a subprocess with HF_ENDPOINT/HF_HUB_CACHE set."""
    code = (
        "import json,sys; from pathlib import Path;"
        "from tensorless_deploy.recipe import load_catalog;"
        "from tensorless_deploy.local.fetch import fetch_model;"
        "from tensorless_deploy.hub import cache_dir;"
        f"r = load_catalog(Path({str(recipe_dir)!r})).find('tiny')[0].recipe;"
        "seen=[];"
        "blob, n, _ = fetch_model(r, cache_dir(), progress=lambda d, t: seen.append(d));"
        "print(json.dumps({'blob': str(blob), 'fetched': n, 'progress': len(seen)}))"
    )
    import subprocess
    import sys

    env = {**os.environ, "HF_ENDPOINT": hf.url, "HF_HUB_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def test_model_fetch_resumes_refuses_wrong_bytes_and_is_idempotent(
    tmp_path: Path, tiny: tuple[HFServer, Path, dict[str, Any], bytes]
) -> None:
    hf, cat, recipe, data = tiny
    cache = tmp_path / "hub"
    # every attempt cut after 100,000 bytes: five attempts, then a clear error and a partial
    hf.add_fault("drop", repo_id=REPO, filename=FILE, after_bytes=100_000, times=5)
    proc = _fetch(cat, cache, hf)
    assert proc.returncode != 0 and "stopped at 500000 of" in proc.stderr, proc.stderr
    blob_dir = cache / "models--tensorless-test--tiny-llama-GGUF" / "blobs"
    partial = blob_dir / f"{recipe['model']['sha256']}.incomplete"
    assert partial.stat().st_size == 500_000
    hf.reset_stats()
    proc = _fetch(cat, cache, hf)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["fetched"] == len(data) - 500_000  # resumed, not started over
    assert got["progress"] >= 1
    assert hf.stats(REPO, FILE).ranges == ["bytes=500000-"]
    assert Path(got["blob"]).read_bytes() == data
    # a second pull transfers and hashes nothing
    hf.reset_stats()
    again = json.loads(_fetch(cat, cache, hf).stdout)
    assert again["fetched"] == 0 and hf.stats(REPO, FILE).requests == 0
    # other Hugging Face tools read the same file from the same cache, offline
    import subprocess
    import sys

    code = (
        "from huggingface_hub import hf_hub_download;"
        f"print(hf_hub_download({REPO!r}, {FILE!r}, revision={COMMIT!r}, "
        f"cache_dir={str(cache)!r}, local_files_only=True))"
    )
    hub = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=60,
    )
    assert hub.returncode == 0, hub.stderr
    assert Path(hub.stdout.strip()).resolve() == Path(got["blob"])
    # the cache is the Hub's own: its scan sees one clean repo and nothing it does not know
    # (the tool's stamps live beside the cache, in <cache>.state)
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(cache)
    assert info.warnings == [], info.warnings
    assert [r.repo_id for r in info.repos] == [REPO]
    (rev,) = next(iter(info.repos)).revisions
    assert rev.commit_hash == COMMIT and [f.file_name for f in rev.files] == [FILE]
    assert sorted(p.name for p in cache.iterdir()) == ["models--tensorless-test--tiny-llama-GGUF"]
    assert (
        cache.parent / (cache.name + ".state") / "verified" / got["blob"].rsplit("/", 1)[-1]
    ).is_file()


def test_wrong_bytes_are_refused_and_deleted(
    tmp_path: Path, tiny: tuple[HFServer, Path, dict[str, Any], bytes]
) -> None:
    hf, cat, _recipe, _ = tiny
    cache = tmp_path / "hub"
    hf.add_fault("corrupt", repo_id=REPO, filename=FILE)
    proc = _fetch(cat, cache, hf)
    assert proc.returncode != 0
    assert "refused and deleted" in proc.stderr, proc.stderr
    blob_dir = cache / "models--tensorless-test--tiny-llama-GGUF" / "blobs"
    assert not any(blob_dir.iterdir())  # neither the blob nor the partial is left


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_serve_refuses_here_with_the_reason() -> None:
    """serve goes through deploy with this machine as the inventory; this CI machine has no
    GPU and no systemd as PID 1, and says so per check."""
    proc = cli("serve", "pn3", "--json")
    assert proc.returncode == 1
    (host,) = json.loads(proc.stdout)["hosts"]
    assert host["host"] == "@local" and host["outcome"] == "skipped"
    assert "driver.present" in host["reason"]


def test_a_dry_run_exits_as_the_real_run_would(tmp_path: Path, standin_smi: dict[str, str]) -> None:
    """Issue 24 item 8, as it was seen: `run --dry-run --host 0.0.0.0` without a key printed the
    command and `a real run would refuse: api.key ...`, and exited 0. It still prints both, and
    exits 1, as the real run does (refused before anything is pulled); so do serve's and
    export's dry runs, each with its real run's status (docs/commands.md, "Dry runs")."""
    wide = ["run", "pn3", "--host", "0.0.0.0", "--engine", "podman"]
    dry = cli(*wide, "--dry-run", env=standin_smi)
    assert "command   podman run" in dry.stdout
    assert "a real run would refuse: api.key: " in dry.stderr, dry.stderr
    real = cli(*wide, env=standin_smi)
    assert dry.returncode == real.returncode == 1, (dry.stderr, real.stderr)
    assert "api.key: " in real.stderr and "refused on this machine" in real.stderr
    doc = json.loads(cli(*wide, "--dry-run", "--json", env=standin_smi).stdout)
    assert doc["exit_code"] == 1 and "api.key" in [c["id"] for c in doc["would_refuse"]]
    # serve: the deploy path's preflight on this machine (no driver here: skipped either way)
    serve_dry = cli("serve", "pn3", "--dry-run")
    if serve_dry.returncode != 0:  # a machine that would really serve it is left alone
        serve_real = cli("serve", "pn3")
        assert serve_real.returncode == serve_dry.returncode == 1
        assert serve_dry.stdout.splitlines()[0] == serve_real.stdout.splitlines()[0]
    # export: refused as the real export (2), and with -o the file is not written
    out = tmp_path / "pod.yaml"
    kube = ["export", "pn3", "--format", "kube", "-o", str(out)]
    assert cli(*kube, "--dry-run").returncode == cli(*kube).returncode == 2
    ok = cli("export", "pn3", "--format", "podman-kube", "-o", str(out), "--dry-run")
    assert ok.returncode == 0 and f"would write {out} (" in ok.stderr and not out.exists()
    assert cli("export", "pn3", "--format", "podman-kube", "-o", str(out)).returncode == 0
    assert out.exists()
