"""When the world does not cooperate, without hosts: the host's scripts run here with the real
sh, curl, flock and coreutils against a local Hub-style server (its fault API answering short,
with a page, or stalling), and the options that bound a run.

- a partial file keeps only bytes that were the file (issue 25 item 5): a 200 with a 15-byte
  JSON body or an HTML page is cut back off, and the next run needs nothing of it;
- a download stops once the run that started it is gone (item 4: its owner, the lock holder);
- the host's lock (run-lock.sh, item 3): one holder, a refusal that names it, released at EOF
  and after the deadline's silence, and waited for with --wait-lock;
- --host-timeout / tensorless_host_timeout and --wait-lock resolve in the one resolver (item 1).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.decisions.options import (
    DEFAULT_HOST_TIMEOUT_S,
    Flags,
    check_flags,
    resolve,
    resolve_one,
)
from tensorless_deploy.errors import InventoryError, UsageError
from tensorless_deploy.hub import cache_paths, host_state_dir
from tensorless_deploy.operations._run import script
from tensorless_deploy.operations.model import download_params
from tests.hosts.hf_server import HTML_BODY, SHORT_BODY, HFServer

REPO = "tensorless-test/tiny-llama-GGUF"
FILE = "tiny-llama.gguf"
COMMIT = "7c1d0f3a9e2b4d6c8a1f3e5b7d9c0a2e4f6b8d01"
DATA = os.urandom(300_000)
SHA = hashlib.sha256(DATA).hexdigest()
NEEDS = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("curl", "head", "tee", "stat", "flock", "timeout")),
    reason="needs curl, flock and coreutils",
)


@pytest.fixture
def hf() -> Any:
    with HFServer("127.0.0.1", 0) as server:
        server.publish(REPO, {FILE: DATA}, commit=COMMIT)
        yield server


def _paths(tmp: Path) -> Any:
    models = str(tmp / "models")
    p = cache_paths(models, host_state_dir(models), REPO, COMMIT, FILE, SHA)
    Path(p.blob).parent.mkdir(parents=True)
    return p


def _download(p: Any, url: str, *, owner: str = "", wait: bool = True) -> Any:
    cmd = script("model-download", **download_params(p, SHA, len(DATA), url), auth="", owner=owner)
    run = subprocess.Popen(
        ["sh", "-c", cmd.get_raw_value()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if not wait:
        return run
    out, err = run.communicate(timeout=120)
    return subprocess.CompletedProcess(run.args, run.returncode, out, err)


def _size(path: str) -> int:
    return os.stat(path).st_size if os.path.exists(path) else 0


@NEEDS
@pytest.mark.parametrize(
    ("kind", "body", "shown"),
    [("short", SHORT_BODY, "application/json"), ("html", HTML_BODY, "text/html")],
)
def test_a_200_that_is_not_the_file_is_never_kept(
    tmp_path: Path, hf: HFServer, kind: str, body: bytes, shown: str
) -> None:
    """The fault as it was found: the model server answers every GET with 200 and a short body
    (or a page) while the run lasts; the next run, the server mended, must not resume from it
    (before the fix the 15 bytes stayed as the partial, the second run failed the hash)."""
    p = _paths(tmp_path)
    url = hf.resolve_url(REPO, FILE)
    hf.add_fault(kind, repo_id=REPO, filename=FILE)
    first = _download(p, url)
    assert first.returncode == 1
    assert "was not the file (HTTP 200: Content-Type " + shown in first.stderr, first.stderr
    assert f"Content-Length {len(body)}" in first.stderr
    assert "nothing of it was kept, the partial stays at 0 bytes" in first.stderr
    assert _size(p.partial) == 0 and not os.path.exists(p.blob)
    assert hf.stats(REPO, FILE).get == 1  # refused at once: no attempt after a lie
    hf.clear_faults()
    second = _download(p, url)
    assert second.returncode == 0, second.stderr
    assert f"downloaded {len(DATA)} bytes (resumed from 0)" in second.stdout
    assert Path(p.blob).read_bytes() == DATA


@NEEDS
def test_a_page_after_good_bytes_leaves_the_good_bytes(tmp_path: Path, hf: HFServer) -> None:
    """A cut download keeps its 100,000 true bytes; a page answered to the resume is not
    appended to them, and the run after that resumes from 100,000."""
    p = _paths(tmp_path)
    url = hf.resolve_url(REPO, FILE)
    hf.add_fault("drop", repo_id=REPO, filename=FILE, after_bytes=100_000, times=1)
    hf.add_fault("html", repo_id=REPO, filename=FILE)  # every GET after the drop: a page
    first = _download(p, url)
    assert first.returncode == 1
    assert _size(p.partial) == 100_000, first.stderr
    assert Path(p.partial).read_bytes() == DATA[:100_000]
    hf.clear_faults()
    second = _download(p, url)
    assert second.returncode == 0, second.stderr
    assert "resumed from 100000" in second.stdout


@NEEDS
def test_a_download_stops_when_its_owner_is_gone(tmp_path: Path, hf: HFServer) -> None:
    """The owner (the run's lock holder on the host) goes: within about a second the download
    stops, curl with it, and the partial keeps the true bytes that arrived."""
    p = _paths(tmp_path)
    url = hf.resolve_url(REPO, FILE)
    hf.add_fault("stall", repo_id=REPO, filename=FILE, after_bytes=100_000, seconds=60)
    owner = subprocess.Popen(["sleep", "120"])
    run = _download(p, url, owner=str(owner.pid), wait=False)
    try:
        deadline = time.monotonic() + 20
        while _size(p.partial) < 90_000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _size(p.partial) >= 90_000
        owner.kill()
        owner.wait()
        t0 = time.monotonic()
        _out, err = run.communicate(timeout=15)
        took = time.monotonic() - t0
    finally:
        owner.kill()
        run.kill()
    assert run.returncode == 1 and took < 5, (took, err)
    assert "the run that started this download is gone" in err
    kept = Path(p.partial).read_bytes()
    assert 90_000 <= len(kept) <= 100_000 and kept == DATA[: len(kept)]
    # curl's own argv names this test's directory (its -D file)
    left = subprocess.run(["pgrep", "-f", f"curl .*{tmp_path}"], capture_output=True, text=True)
    assert left.stdout == "", "curl outlived its download"


@NEEDS
def test_a_second_writer_waits_for_the_first(tmp_path: Path, hf: HFServer) -> None:
    """Two downloads of one file at once (an orphan of a run that is gone, and a rerun): the
    second waits on the partial's lock, never appends alongside; the file is whole."""
    p = _paths(tmp_path)
    url = hf.resolve_url(REPO, FILE)
    hf.add_fault("stall", repo_id=REPO, filename=FILE, after_bytes=100_000, seconds=3, times=1)
    first = _download(p, url, wait=False)
    deadline = time.monotonic() + 20
    while _size(p.partial) < 90_000 and time.monotonic() < deadline:
        time.sleep(0.1)
    second = _download(p, url)
    _out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert second.returncode == 0, second.stderr
    assert Path(p.blob).read_bytes() == DATA


def _holder(lock: Path, *, wait: int = 0, deadline: int = 30, who: str = "a test") -> Any:
    cmd = script("run-lock", lock=str(lock), wait=wait, deadline=deadline, who=who)
    return subprocess.Popen(
        ["sh", "-c", cmd.get_raw_value()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@NEEDS
def test_the_host_lock_has_one_holder_and_names_it(tmp_path: Path) -> None:
    lock = tmp_path / "run" / "deploy.lock"
    a = _holder(lock, who="deploy tiny by ops@ctl (pid 41)")
    assert a.stdout is not None and a.stdin is not None
    word, pid = a.stdout.readline().split()
    assert word == "locked" and int(pid) > 0
    b = _holder(lock)
    out, _ = b.communicate(timeout=10)
    assert b.returncode == 75
    assert out.startswith("held ") and out.rstrip().endswith("deploy tiny by ops@ctl (pid 41)")
    # a waiter gets it once the holder's stream ends (the run is over, or its controller died)
    c = _holder(lock, wait=20)
    time.sleep(0.5)
    a.stdin.close()
    a.wait(timeout=10)
    assert c.stdout is not None
    assert c.stdout.readline().split()[0] == "locked"
    assert c.stdin is not None
    c.stdin.close()
    c.wait(timeout=10)
    assert not (tmp_path / "run" / "deploy.lock.who").exists()


@NEEDS
def test_the_host_lock_goes_after_the_deadline_of_silence(tmp_path: Path) -> None:
    """A controller cut off (no heartbeat, no EOF): the holder lets go after its deadline."""
    lock = tmp_path / "deploy.lock"
    a = _holder(lock, deadline=2)
    assert a.stdout is not None and a.stdin is not None
    assert a.stdout.readline().startswith("locked")
    for _ in range(3):  # heartbeats keep it
        a.stdin.write("beat\n")
        a.stdin.flush()
        time.sleep(1)
    assert a.poll() is None
    t0 = time.monotonic()
    a.wait(timeout=10)  # silence: gone after about 2 s
    assert time.monotonic() - t0 < 4
    b = _holder(lock)
    assert b.stdout is not None and b.stdout.readline().startswith("locked")
    b.kill()


def test_host_timeout_and_wait_lock_resolve_once() -> None:
    assert resolve().host_timeout == DEFAULT_HOST_TIMEOUT_S == 60
    assert resolve().wait_lock == 0
    data = {"tensorless_host_timeout": 15}
    assert resolve(Flags(), data, "gpu1").host_timeout == 15
    assert resolve(Flags(host_timeout=5), data, "gpu1").host_timeout == 5  # the flag wins
    assert resolve_one("host_timeout", Flags(), data, "gpu1") == 15
    assert resolve_one("wait_lock", Flags(wait_lock=30), data, "gpu1") == 30
    with pytest.raises(UsageError, match=r"--host-timeout 0: must be a number of seconds"):
        check_flags(Flags(host_timeout=0))
    with pytest.raises(UsageError, match=r"--wait-lock -1: must be a number of seconds"):
        check_flags(Flags(wait_lock=-1))
    with pytest.raises(InventoryError, match=r"gpu1: tensorless_host_timeout: must be"):
        resolve(Flags(), {"tensorless_host_timeout": "fast"}, "gpu1")
