"""The recipe's model in this machine's Hugging Face cache: resumable, hashed while the bytes
arrive, verified before it is renamed into place, readable by huggingface_hub afterwards.

Not ``huggingface_hub.hf_hub_download``: it does not resume across processes (each call starts a
fresh ``.incomplete`` from zero) and checks only the size, so the file would have to be read a
second time to verify it; here the one read that downloads it also hashes it.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.hub import CachePaths, resolve_url
from tensorless_deploy.recipe.catalog import model_paths
from tensorless_deploy.recipe.schema import Recipe

CHUNK = 1 << 20
RETRIES = 5


class LocalError(TensorlessError):
    """Something on this machine stopped the command."""


def _hash_file(path: Path, h: Any) -> None:
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)


def _stamp_of(paths: CachePaths) -> str:
    st = Path(paths.blob).stat()
    return paths.stamp_text(st.st_size, int(st.st_mtime))


def model_is_verified(paths: CachePaths) -> bool:
    blob, stamp = Path(paths.blob), Path(paths.stamp)
    return blob.is_file() and stamp.is_file() and stamp.read_text().strip() == _stamp_of(paths)


def _link(paths: CachePaths) -> None:
    """The snapshot link to the blob, and the ref that keeps the pinned revision referenced
    (huggingface_hub's ``hf cache prune`` removes a revision no ref names)."""
    snap = Path(paths.snapshot)
    snap.parent.mkdir(parents=True, exist_ok=True)
    tmp = snap.with_name(f".{snap.name}.tensorless-link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(paths.link_target)
    os.replace(tmp, snap)
    ref = Path(paths.ref)
    if not ref.is_file() or ref.read_text().strip() != paths.revision:
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(f".{ref.name}.tmp")
        tmp.write_text(paths.revision)  # as huggingface_hub writes a ref: the commit, no newline
        os.replace(tmp, ref)


def _write_stamp(paths: CachePaths) -> None:
    stamp = Path(paths.stamp)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp = stamp.with_name(stamp.name + ".tmp")
    tmp.write_text(_stamp_of(paths) + "\n")
    os.replace(tmp, stamp)


Progress = Callable[[int, int], None]  # (bytes so far, total)
How = Literal["downloaded", "hashed", "verified earlier"]


class Fetched(NamedTuple):
    """The model in the cache: where, the bytes downloaded now, and how its sha256 was known:
    hashed as they arrived, hashed now (a file found there unstamped), or verified earlier."""

    blob: Path
    downloaded: int
    how: How


Token = Callable[[], "str | None"]


def _too_long(partial: Path, url: str, size: int, what: str) -> LocalError:
    partial.unlink(missing_ok=True)
    return LocalError(
        f"{url}: {what} than the recipe's size_bytes ({size}): stopped there, refused and deleted",
        fix="check HF_ENDPOINT and the recipe's size_bytes and sha256",
    )


def fetch_model(
    recipe: Recipe,
    cache_dir: str,
    *,
    token: str | Token | None = None,
    progress: Progress | None = None,
) -> Fetched:
    """The recipe's GGUF in cache_dir (Hub layout), resumable, hashed while the bytes arrive and
    verified before it is renamed into place; never a byte written past size_bytes (a server
    that announces or sends more is refused). Returns the blob, the bytes downloaded now and
    how it was verified; a file verified earlier (same size and mtime) is neither downloaded
    nor hashed again.
    token: the Hub token, or a function that finds it, called only when a download starts."""
    m = recipe.model
    paths = model_paths(cache_dir, recipe)
    blob, partial = Path(paths.blob), Path(paths.partial)
    if model_is_verified(paths):
        _link(paths)
        return Fetched(blob, 0, "verified earlier")
    blob.parent.mkdir(parents=True, exist_ok=True)
    if blob.is_file():  # present but not verified by us: verify it, never trust it
        h = hashlib.sha256()
        _hash_file(blob, h)
        if h.hexdigest() != m.sha256:
            blob.unlink()
        else:
            _write_stamp(paths)
            _link(paths)
            return Fetched(blob, 0, "hashed")
    h = hashlib.sha256()
    have = partial.stat().st_size if partial.is_file() else 0
    if have > m.size_bytes:
        partial.unlink()
        have = 0
    if have:
        _hash_file(partial, h)  # resume: the bytes already here count toward the hash
    fetched = 0
    url = resolve_url(m.hf_repo, m.revision, m.file)
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
        if callable(token):
            token = token()  # asked once, and only now that a download starts
        if token:
            req.add_unredirected_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp, partial.open("ab") as out:
                if have and resp.status != 206:
                    raise LocalError(f"{url}: the server ignored the Range request; cannot resume")
                length = resp.headers.get("Content-Length", "")
                if length.isdigit() and have + int(length) > m.size_bytes:
                    raise _too_long(partial, url, m.size_bytes, "the server announces more")
                while True:
                    block = resp.read(CHUNK)
                    if not block:
                        break
                    if have + len(block) > m.size_bytes:
                        raise _too_long(partial, url, m.size_bytes, "the server sent more")
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
    return Fetched(blob, fetched, "downloaded")
