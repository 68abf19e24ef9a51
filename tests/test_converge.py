"""Converging at the limit, without hosts: a deploy judges a host from its survey alone (every
step of serve_plan and whether it would change), and the model's bytes are hashed as they
arrive and never taken past size_bytes, by the host's own scripts (run here with the real sh,
curl, head, tee and openssl against a local Hub-style server) and by this machine's fetch."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.decisions.options import Flags, resolve
from tensorless_deploy.facts.pyinfra import HostSurvey
from tensorless_deploy.facts.values import HostFacts, ModelBlobFile, ToolState, ToolUnit
from tensorless_deploy.fleet.deploy import converged, survey_steps
from tensorless_deploy.hostplan.plan import HostPlan, plan_host
from tensorless_deploy.hub import cache_paths, host_state_dir
from tensorless_deploy.local.fetch import LocalError, fetch_model
from tensorless_deploy.operations._run import script
from tensorless_deploy.recipe.catalog import Entry
from tensorless_deploy.recipe.schema import Recipe
from tests.arrival_watch import Watch
from tests.hosts.fleet import tiny_recipe
from tests.hosts.hf_server import HFServer

TESTS = Path(__file__).parent
COMMIT = "7c1d0f3a9e2b4d6c8a1f3e5b7d9c0a2e4f6b8d01"
IMAGE = "10.253.7.1:5000/tensorless-engine-cpu@sha256:" + "e9" * 32
DATA = os.urandom(300_000)
SHA = hashlib.sha256(DATA).hexdigest()
NEEDS = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("curl", "head", "tee", "stat")), reason="needs curl"
)


def _recipe(size: int = len(DATA), sha: str = SHA) -> Recipe:
    fake = {
        "tiny_gguf": {"hf_file": "tiny-llama.gguf", "sha256": sha, "size": size},
        "image": {"ref": IMAGE},
    }
    return Recipe.model_validate(tiny_recipe(fake, COMMIT))


def _pristine() -> HostFacts:
    case = json.loads((TESTS / "pyinfra_facts" / "HostSurvey" / "pristine.json").read_text())
    facts: HostFacts = HostSurvey().read(case["output"])
    return facts


def _plan(facts: HostFacts) -> HostPlan:
    entry = Entry("tensorless-test/tiny-llama-GGUF/p100.toml", _recipe())
    return plan_host("gpu1", facts, [entry], resolve(Flags(), None, "gpu1"), sizing=None)


def _converged_tool(plan: HostPlan) -> ToolState:
    """What the survey reads on a host this plan was applied to."""
    assert plan.paths is not None
    (inst,) = plan.instances
    assert inst.unit is not None
    p = plan.paths
    return ToolState(
        units=(
            ToolUnit(
                path=inst.unit.path,
                name=inst.name,
                kind="quadlet",
                sha256=hashlib.sha256(inst.unit.content.encode()).hexdigest(),
                labels={},
                health=200,
            ),
        ),
        blobs=(
            ModelBlobFile(
                path=p.blob,
                sha256=SHA,
                size=len(DATA),
                mtime=1700,
                stamp=p.stamp_text(len(DATA), 1700),
            ),
        ),
        images=(IMAGE,),
        images_engine="podman",
        links={p.snapshot: p.link_target},
    )


def _with(facts: HostFacts, tool: ToolState) -> HostFacts:
    return facts.model_copy(update={"tool": tool})


def test_a_converged_host_needs_no_step_and_each_gap_names_its_step() -> None:
    facts = _pristine()
    plan = _plan(facts)
    assert plan.ok
    tool = _converged_tool(plan)
    steps = survey_steps(plan, _with(facts, tool))
    assert steps == {
        "image": False,
        "model": False,
        "unit": False,
        "restart": False,
        "serving": False,
    }
    assert converged(steps)
    unit, blob = tool.units[0], tool.blobs[0]
    assert plan.paths is not None
    gaps: dict[str, tuple[ToolState, set[str]]] = {
        "image gone": (tool.model_copy(update={"images": ()}), {"image"}),
        "blob unstamped": (
            tool.model_copy(update={"blobs": (blob.model_copy(update={"stamp": None}),)}),
            {"model"},
        ),
        "blob touched since": (
            tool.model_copy(update={"blobs": (blob.model_copy(update={"mtime": 1701}),)}),
            {"model"},
        ),
        "link missing": (tool.model_copy(update={"links": {}}), {"model"}),
        "link wrong": (
            tool.model_copy(update={"links": {plan.paths.snapshot: "../../blobs/x"}}),
            {"model"},
        ),
        "unit differs": (
            tool.model_copy(update={"units": (unit.model_copy(update={"sha256": "0" * 64}),)}),
            {"unit", "restart"},
        ),
        "unhealthy": (
            tool.model_copy(update={"units": (unit.model_copy(update={"health": 503}),)}),
            {"serving"},
        ),
        "no unit": (tool.model_copy(update={"units": ()}), {"unit", "restart"}),
    }
    for why, (state, changing) in gaps.items():
        steps = survey_steps(plan, _with(facts, state))
        assert steps is not None, why
        assert {k for k, v in steps.items() if v} == changing, why
        assert not converged(steps), why


def test_what_the_survey_cannot_tell_is_never_taken_as_converged() -> None:
    facts = _pristine()
    plan = _plan(facts)
    tool = _converged_tool(plan)
    assert survey_steps(plan, facts.model_copy(update={"tool": None})) is None
    unknown_images = tool.model_copy(update={"images": None, "images_engine": None})
    assert survey_steps(plan, _with(facts, unknown_images)) is None
    assert not converged(None)


def test_a_plan_with_a_key_is_never_judged_from_the_survey() -> None:
    """The survey reads no secret, so a changed key on the controller could not show there:
    a plan that mounts a key goes through the secrets operation, which compares it."""
    facts = _pristine()
    key = str(TESTS / "fixtures" / "secrets" / "api.key")
    entry = Entry("tensorless-test/tiny-llama-GGUF/p100.toml", _recipe())
    plan = plan_host(
        "gpu1", facts, [entry], resolve(Flags(api_key_file=key), None, "gpu1"), sizing=None
    )
    assert plan.ok and plan.instances[0].spec.secrets
    assert survey_steps(plan, _with(facts, _converged_tool(plan))) is None


def test_a_surplus_instance_is_a_step() -> None:
    facts = _pristine()
    plan = _plan(facts)
    tool = _converged_tool(plan)
    extra = tool.units[0].model_copy(
        update={"name": tool.units[0].name + "-1", "path": tool.units[0].path + "-1"}
    )
    with_extra = _with(facts, tool.model_copy(update={"units": (*tool.units, extra)}))
    plan = _plan(with_extra)
    assert [u.name for u in plan.surplus] == [extra.name]
    steps = survey_steps(plan, with_extra)
    assert steps is not None and steps[f"remove {extra.name}"] is True
    assert not converged(steps)


@pytest.fixture
def hf() -> Iterator[HFServer]:
    with HFServer("127.0.0.1", 0) as server:
        yield server


def _where(tmp: Path, size: int = len(DATA), sha: str = SHA) -> dict[str, Any]:
    models = tmp / "models"
    p = cache_paths(
        str(models),
        host_state_dir(str(models)),
        "tensorless-test/tiny-llama-GGUF",
        COMMIT,
        "tiny-llama.gguf",
        sha,
    )
    Path(p.blob).parent.mkdir(parents=True)
    return {"paths": p, "size": size, "sha": sha}


def _download(w: dict[str, Any], url: str, attempts: int = 5) -> subprocess.CompletedProcess[str]:
    p = w["paths"]
    cmd = script(
        "model-download",
        sha=w["sha"],
        partial=p.partial,
        size=w["size"],
        url=url,
        attempts=attempts,
        auth="",
        blob=p.blob,
        stamp=p.stamp,
        snapshot=p.snapshot,
        target=p.link_target,
        lock=p.lock,
    )
    return subprocess.run(
        ["sh", "-c", cmd.get_raw_value()], capture_output=True, text=True, timeout=120
    )


@NEEDS
def test_host_download_hashes_on_arrival_and_resumes(tmp_path: Path, hf: HFServer) -> None:
    hf.publish("tensorless-test/tiny-llama-GGUF", {"tiny-llama.gguf": DATA}, commit=COMMIT)
    url = hf.resolve_url("tensorless-test/tiny-llama-GGUF", "tiny-llama.gguf", COMMIT)
    w = _where(tmp_path)
    p = w["paths"]
    name = Path(p.partial).name
    # a first run cut after 100,000 bytes, every attempt
    hf.add_fault(
        "drop",
        repo_id="tensorless-test/tiny-llama-GGUF",
        filename="tiny-llama.gguf",
        after_bytes=100_000,
        times=1,
    )
    cut = _download(w, url, attempts=1)
    assert cut.returncode == 1 and "stopped at 100000 of 300000 bytes" in cut.stderr, cut.stderr
    watch = Watch(Path(p.blob).parent)
    try:
        done = _download(w, url)
        assert done.returncode == 0, done.stderr
        assert "downloaded 200000 bytes (resumed from 100000)" in done.stdout
        assert Path(p.blob).read_bytes() == DATA and not Path(p.partial).exists()
        assert watch.writes(name) > 0
        assert watch.reads_after_last_write(name) == 0  # hashed as the bytes arrived
        assert os.readlink(p.snapshot) == p.link_target
        assert Path(p.stamp).read_text().split()[0] == str(len(DATA))
    finally:
        watch.close()


@NEEDS
def test_host_download_refuses_wrong_bytes(tmp_path: Path, hf: HFServer) -> None:
    hf.publish("tensorless-test/tiny-llama-GGUF", {"tiny-llama.gguf": DATA}, commit=COMMIT)
    url = hf.resolve_url("tensorless-test/tiny-llama-GGUF", "tiny-llama.gguf", COMMIT)
    w = _where(tmp_path)
    hf.add_fault("corrupt", repo_id="tensorless-test/tiny-llama-GGUF", filename="tiny-llama.gguf")
    done = _download(w, url)
    assert done.returncode == 1 and "refused and deleted" in done.stderr
    assert not Path(w["paths"].partial).exists() and not Path(w["paths"].blob).exists()


@NEEDS
def test_host_download_stops_at_size_bytes(tmp_path: Path, hf: HFServer) -> None:
    """A server announcing a longer file is refused by its Content-Length; one that sends more
    than it announced (or announces nothing) is cut one byte past the size: both refused."""
    hf.publish("tensorless-test/tiny-llama-GGUF", {"tiny-llama.gguf": DATA}, commit=COMMIT)
    url = hf.resolve_url("tensorless-test/tiny-llama-GGUF", "tiny-llama.gguf", COMMIT)
    short = len(DATA) - 1000
    w = _where(tmp_path / "announced", size=short)
    done = _download(w, url)
    assert done.returncode == 1, done.stderr
    assert "announced more than the recipe's 299000 bytes" in done.stderr
    assert not Path(w["paths"].partial).exists()
    with _endless_server() as endless:
        w = _where(tmp_path / "unannounced", size=short)
        watch = Watch(Path(w["paths"].blob).parent)
        try:
            done = _download(w, endless)
            assert done.returncode == 1, done.stderr
            assert "longer than the recipe's 299000 bytes" in done.stderr
            assert not Path(w["paths"].partial).exists()
            assert watch.writes(Path(w["paths"].partial).name) > 0
        finally:
            watch.close()


class _Endless(BaseHTTPRequestHandler):
    """Sends bytes without a Content-Length until the client goes away (HTTP/1.0)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        try:
            for _ in range(1000):
                self.wfile.write(b"z" * 65536)
        except OSError:
            pass


class _endless_server:
    def __enter__(self) -> str:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/file"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _receive(w: dict[str, Any], data: bytes) -> subprocess.CompletedProcess[bytes]:
    cmd = script("model-receive", partial=w["paths"].partial, size=w["size"], lock=w["paths"].lock)
    return subprocess.run(
        ["sh", "-c", cmd.get_raw_value()], input=data, capture_output=True, timeout=60
    )


def _arrived(w: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    p = w["paths"]
    cmd = script(
        "model-arrived",
        sha=w["sha"],
        partial=p.partial,
        size=w["size"],
        blob=p.blob,
        stamp=p.stamp,
        snapshot=p.snapshot,
        target=p.link_target,
    )
    return subprocess.run(
        ["sh", "-c", cmd.get_raw_value()], capture_output=True, text=True, timeout=60
    )


@NEEDS
def test_pushed_bytes_are_hashed_as_they_arrive_and_admitted_without_a_second_read(
    tmp_path: Path,
) -> None:
    w = _where(tmp_path)
    p = w["paths"]
    name = Path(p.partial).name
    first = _receive(w, DATA[:120_000])  # a push cut short: resumable, no record
    assert first.returncode == 1 and first.stdout.startswith(b"have 0\n")
    assert b"stopped at 120000 of 300000" in first.stderr
    assert not Path(p.partial + ".sha256").exists()
    second = _receive(w, DATA[120_000:])
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith(b"have 120000\n")
    got, size, _mtime = Path(p.partial + ".sha256").read_text().split()
    assert (got, int(size)) == (SHA, len(DATA))
    watch = Watch(Path(p.blob).parent)
    try:
        done = _arrived(w)
        assert done.returncode == 0, done.stderr
        assert watch.reads_after_last_write(name) == 0  # admitted by the hash taken on arrival
        assert Path(p.blob).read_bytes() == DATA
    finally:
        watch.close()


@NEEDS
def test_a_push_past_size_bytes_is_refused_and_wrong_bytes_are_not_admitted(
    tmp_path: Path,
) -> None:
    w = _where(tmp_path / "long")
    done = _receive(w, DATA + b"extra")
    assert done.returncode == 1 and b"longer than the recipe's 300000 bytes" in done.stderr
    assert not Path(w["paths"].partial).exists()
    w = _where(tmp_path / "wrong")
    bad = bytearray(DATA)
    bad[5] ^= 1
    assert _receive(w, bytes(bad)).returncode == 0
    done_arrived = _arrived(w)
    assert done_arrived.returncode == 1 and "refused and deleted" in done_arrived.stderr
    assert not Path(w["paths"].blob).exists() and not Path(w["paths"].partial).exists()
    # a record that no longer names the partial (touched since) is not trusted: hashed again
    w = _where(tmp_path / "touched")
    assert _receive(w, DATA).returncode == 0
    record = Path(w["paths"].partial + ".sha256")
    record.write_text(f"{SHA} {len(DATA)} 1\n")
    Path(w["paths"].partial).write_bytes(bytes(bad))
    done_arrived = _arrived(w)
    assert done_arrived.returncode == 1 and "refused and deleted" in done_arrived.stderr


# --- this machine's fetch ---------------------------------------------------------------------


def test_local_fetch_stops_at_size_bytes_and_asks_the_token_only_to_download(
    tmp_path: Path, hf: HFServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf.publish("tensorless-test/tiny-llama-GGUF", {"tiny-llama.gguf": DATA}, commit=COMMIT)
    monkeypatch.setenv("HF_ENDPOINT", hf.url)
    asked: list[int] = []

    def token() -> str | None:
        asked.append(1)
        return None

    short = _recipe(size=len(DATA) - 1)
    with pytest.raises(LocalError, match="announces more than the recipe's size_bytes"):
        fetch_model(short, str(tmp_path / "a"), token=token)
    assert not list((tmp_path / "a").rglob("*.incomplete"))
    with _endless_server() as endless:
        monkeypatch.setenv("HF_ENDPOINT", endless.rsplit("/", 1)[0])
        with pytest.raises(LocalError, match="sent more than the recipe's size_bytes"):
            fetch_model(short, str(tmp_path / "b"), token=token)
        assert not list((tmp_path / "b").rglob("*.incomplete"))
    monkeypatch.setenv("HF_ENDPOINT", hf.url)
    asked.clear()
    blob, fetched, how = fetch_model(_recipe(), str(tmp_path / "c"), token=token)
    assert fetched == len(DATA) and blob.read_bytes() == DATA and asked == [1]
    assert how == "downloaded"
    asked.clear()
    assert fetch_model(_recipe(), str(tmp_path / "c"), token=token) == (blob, 0, "verified earlier")
    assert asked == []  # verified earlier: nothing downloaded, no token looked up


def test_local_fetch_says_hashed_when_it_hashed_a_file_found_there(
    tmp_path: Path, hf: HFServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pull found the blob in the cache without the tool's stamp (another tool put it there, or
    the state dir was cleared): it hashes it, and says so, never "verified earlier"."""
    hf.publish("tensorless-test/tiny-llama-GGUF", {"tiny-llama.gguf": DATA}, commit=COMMIT)
    monkeypatch.setenv("HF_ENDPOINT", hf.url)
    cache = str(tmp_path / "hub")
    blob, _, _ = fetch_model(_recipe(), cache)
    shutil.rmtree(host_state_dir(cache))  # the stamps: gone
    assert fetch_model(_recipe(), cache) == (blob, 0, "hashed")
    assert fetch_model(_recipe(), cache) == (blob, 0, "verified earlier")


HF_CLI = Path(sys.executable).parent / "hf"


@pytest.mark.skipif(not HF_CLI.exists(), reason="huggingface_hub's hf command line not installed")
def test_hf_cache_prune_keeps_what_pull_fetched(
    tmp_path: Path, hf: HFServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """huggingface_hub's own `hf cache prune` removes revisions no ref names; a model fetched
    by commit has no branch, so the tool names the pinned commit in a ref of its own. Asked
    with the real command line, the prune finds nothing to delete (and the cache scans clean)."""
    hf.publish("tensorless-test/tiny-llama-GGUF", {"tiny-llama.gguf": DATA}, commit=COMMIT)
    monkeypatch.setenv("HF_ENDPOINT", hf.url)
    cache = tmp_path / "hub"
    fetch_model(_recipe(), str(cache))
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HOME", None)
    proc = subprocess.run(
        [str(HF_CLI), "cache", "prune", "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Nothing to prune" in proc.stdout, proc.stdout
    listed = subprocess.run(
        [str(HF_CLI), "cache", "ls", "--revisions", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["revision"] == COMMIT and row["refs"] == [f"tensorless-deploy/{COMMIT}"], row


def test_watch_sees_a_second_read() -> None:
    """The watch itself: a read after the last write is counted (the old verify-after-download
    would be caught)."""
    d = Path(os.environ.get("TMPDIR", "/tmp")) / f"watch-{os.getpid()}"
    d.mkdir(exist_ok=True)
    try:
        watch = Watch(d)
        f = d / "x.incomplete"
        f.write_bytes(b"abc")
        assert watch.reads_after_last_write(f.name) == 0
        hashlib.sha256(f.read_bytes())
        assert watch.reads_after_last_write(f.name) >= 1
        watch.close()
    finally:
        shutil.rmtree(d)


def test_a_dry_run_restarts_for_a_new_key_even_with_the_same_unit() -> None:
    """pyinfra cannot say at prepare time whether the restart's _if holds: the dry run judges it
    from the unit and the secrets, as the real run's any_changed does."""
    from types import SimpleNamespace

    from tensorless_deploy.fleet.deploy import _dry_steps

    def meta(change: bool) -> Any:
        return SimpleNamespace(will_change=change)

    def outcomes(key: bool, unit: bool) -> dict[str, str]:
        metas = {
            "secrets": meta(key),
            "unit": meta(unit),
            "restart": meta(True),  # a guarded follow-up always says it would
            "serving": meta(True),
        }
        return {r.name: r.outcome for r in _dry_steps(metas)}

    assert outcomes(key=True, unit=False) == {
        "secrets": "would change",
        "unit": "no change",
        "restart": "would change",
        "serving": "no change",
    }
    assert outcomes(key=False, unit=False)["restart"] == "no change"
    assert outcomes(key=False, unit=False)["serving"] == "would change"
    assert outcomes(key=False, unit=True)["restart"] == "would change"
