"""Layer 5 (effects) for this machine: its facts, the model in its Hugging Face cache, the image,
and a foreground container built from the same launch spec a fleet deploy renders."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.facts.survey import all_sections, host_facts_from_survey, survey_script
from tensorless_deploy.facts.values import HostFacts
from tensorless_deploy.hub import CachePaths, cache_paths, resolve_url
from tensorless_deploy.launch.spec import LaunchSpec
from tensorless_deploy.recipe.schema import Recipe

CHUNK = 1 << 20
RETRIES = 5


class LocalError(TensorlessError):
    """Something on this machine stopped the command."""


def local_facts(models_dir: str) -> HostFacts:
    """The same survey a remote host answers, run by this machine's sh."""
    script = survey_script(all_sections(models_dir))
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
    return host_facts_from_survey(proc.stdout)


def hub_cache_dir() -> str:
    """This machine's Hugging Face cache (HF_HUB_CACHE / HF_HOME honoured), as the Hub's own
    tools find it."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def hub_token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def _hash_file(path: Path, h: Any) -> None:
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)


def _stamp_of(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {int(st.st_mtime)}"


def model_is_verified(paths: CachePaths) -> bool:
    blob, stamp = Path(paths.blob), Path(paths.stamp)
    return blob.is_file() and stamp.is_file() and stamp.read_text().strip() == _stamp_of(blob)


def _link(paths: CachePaths) -> None:
    snap = Path(paths.snapshot)
    snap.parent.mkdir(parents=True, exist_ok=True)
    tmp = snap.with_name(f".{snap.name}.tensorless-link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(paths.link_target)
    os.replace(tmp, snap)


def _write_stamp(paths: CachePaths) -> None:
    stamp = Path(paths.stamp)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp = stamp.with_name(stamp.name + ".tmp")
    tmp.write_text(_stamp_of(Path(paths.blob)) + "\n")
    os.replace(tmp, stamp)


Progress = Callable[[int, int], None]  # (bytes so far, total)


def fetch_model(
    recipe: Recipe,
    cache_dir: str,
    *,
    token: str | None = None,
    progress: Progress | None = None,
) -> tuple[Path, int]:
    """The recipe's GGUF in cache_dir (Hub layout), resumable, hashed while the bytes arrive and
    verified before it is renamed into place. Returns the blob and the bytes downloaded now;
    a file verified earlier (same size and mtime) is neither downloaded nor hashed again."""
    m = recipe.model
    paths = cache_paths(cache_dir, recipe)
    blob, partial = Path(paths.blob), Path(paths.partial)
    if model_is_verified(paths):
        _link(paths)
        return blob, 0
    blob.parent.mkdir(parents=True, exist_ok=True)
    if blob.is_file():  # present but not verified by us: verify it, never trust it
        h = hashlib.sha256()
        _hash_file(blob, h)
        if h.hexdigest() != m.sha256:
            blob.unlink()
        else:
            _write_stamp(paths)
            _link(paths)
            return blob, 0
    h = hashlib.sha256()
    have = partial.stat().st_size if partial.is_file() else 0
    if have > m.size_bytes:
        partial.unlink()
        have = 0
    if have:
        _hash_file(partial, h)  # resume: the bytes already here count toward the hash
    fetched = 0
    url = resolve_url(recipe)
    attempt = 0
    while have < m.size_bytes:
        if attempt >= RETRIES:
            raise LocalError(
                f"download of {url} stopped at {have} of {m.size_bytes} bytes after "
                f"{attempt} attempts",
                fix="run the command again: it resumes where it stopped",
            )
        attempt += 1
        req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"})
        if token:
            req.add_unredirected_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp, partial.open("ab") as out:
                if have and resp.status != 206:
                    raise LocalError(f"{url}: the server ignored the Range request; cannot resume")
                while True:
                    block = resp.read(CHUNK)
                    if not block:
                        break
                    out.write(block)
                    h.update(block)
                    have += len(block)
                    fetched += len(block)
                    if progress:
                        progress(have, m.size_bytes)
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            if isinstance(exc, urllib.error.HTTPError) and exc.code in (401, 403, 404):
                raise LocalError(
                    f"{m.hf_repo}@{m.revision[:12]}/{m.file}: HTTP {exc.code} from {url}",
                    fix="check the recipe's repo and revision, and HF_TOKEN for a gated repo",
                ) from exc
            if attempt >= RETRIES:
                raise LocalError(
                    f"download of {url} stopped at {have} of {m.size_bytes} bytes: {exc}",
                    fix="run the command again: it resumes where it stopped",
                ) from exc
            time.sleep(min(2**attempt, 10) / 4)
    if have != m.size_bytes or h.hexdigest() != m.sha256:
        partial.unlink(missing_ok=True)
        raise LocalError(
            f"{m.file}: downloaded {have} bytes with sha256 {h.hexdigest()}, not {m.sha256}: "
            "refused and deleted",
            fix="check HF_ENDPOINT and the recipe's sha256; run again to download afresh",
        )
    os.replace(partial, blob)
    _write_stamp(paths)
    _link(paths)
    return blob, fetched


def engine_bin(engine: str) -> str:
    found = shutil.which(engine)
    if found is None:
        raise LocalError(f"{engine} not found on this machine", fix=f"install {engine}")
    return found


def image_present(engine: str, image: str) -> bool:
    check = ["image", "exists", image] if engine.endswith("podman") else ["image", "inspect", image]
    return subprocess.run([engine, *check], capture_output=True, timeout=60).returncode == 0


def pull_image(engine: str, image: str) -> bool:
    """Pull by digest (the engine prints its own progress); False when it was already here."""
    if image_present(engine, image):
        return False
    proc = subprocess.run([engine, "pull", image], timeout=3600)
    if proc.returncode != 0:
        raise LocalError(
            f"{engine} pull {image} failed (exit {proc.returncode})",
            fix="check the registry is reachable and the digest exists",
        )
    return True


def container_argv(spec: LaunchSpec, engine: str) -> list[str]:
    """The exact foreground command: the same run options the plain unit's ExecStart uses."""
    return [engine, "run", "--rm", "--pull=never", *spec.engine_run_args()]


def health_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


def run_foreground(spec: LaunchSpec, engine: str, *, on_healthy: Callable[[float], None]) -> int:
    """Start the container in the foreground, wait for /health (503 and a refused connection
    mean loading), report, and on Ctrl-C or SIGTERM stop and remove it; one signal is enough."""
    proc = subprocess.Popen(container_argv(spec, engine), start_new_session=True)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        subprocess.run([engine, "stop", "-t", "10", spec.name], capture_output=True, timeout=60)

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        t0 = time.monotonic()
        deadline = t0 + spec.start_timeout_s
        while proc.poll() is None and not stopping:
            if health_status(spec.health_url) == 200:
                on_healthy(time.monotonic() - t0)
                break
            if time.monotonic() > deadline:
                stop(signal.SIGTERM, None)
                raise LocalError(
                    f"{spec.name} not healthy within {spec.start_timeout_s} s",
                    fix="see the server's output above",
                )
            time.sleep(0.1)
        rc = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if proc.poll() is None:
            proc.kill()
        subprocess.run([engine, "rm", "-f", spec.name], capture_output=True, timeout=60)
    return 0 if stopping else rc
