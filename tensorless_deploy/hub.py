"""The Hugging Face Hub as this tool uses it: the resolve URL at a pinned commit, the token, and
the cache layout a model file lands in, on hosts and on this machine.

The endpoint, URL template and cache folder names are huggingface_hub's own (its ``constants``
module, cheap to import), so a file this tool fetched is one huggingface_hub reads back:
``models--ORG--NAME/blobs/<sha256>`` holds the bytes and ``snapshots/<revision>/<file>`` is a
relative link to it. The tool's own verification stamps live outside the Hub cache
(``state_dir``), so ``huggingface_hub.scan_cache_dir()`` sees nothing it does not know. A file
fetched by commit has no branch pointing at it, which the Hub tools call a *detached* revision
(``hf cache prune`` deletes those): the tool names the pinned commit in a ref of its own,
``refs/tensorless-deploy/<revision>``, which the Hub tools read as any other ref.
"""

from __future__ import annotations

import functools
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

# Where a host keeps model files unless its inventory data says otherwise (tensorless_models_dir).
DEFAULT_MODELS_DIR = "/var/lib/tensorless/models"
# The folder under a cache repo's refs/ where the tool names each pinned revision it fetched:
# a referenced revision is one `hf cache prune` keeps (huggingface_hub's scan_cache_dir reads
# every file under refs/, nested ones included, as a ref naming the commit the file holds).
REF_FOLDER = "tensorless-deploy"


def endpoint() -> str:
    """HF_ENDPOINT as huggingface_hub honours it, without a trailing slash."""
    from huggingface_hub import constants

    # constants read HF_ENDPOINT when first imported; a later change of the variable wins
    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def resolve_url(repo: str, revision: str, filename: str, base: str | None = None) -> str:
    """The Hub's resolve URL of one file at a pinned commit (never a branch), quoted as
    huggingface_hub's ``hf_hub_url`` quotes it."""
    from huggingface_hub import constants

    template = constants.HUGGINGFACE_CO_URL_TEMPLATE.replace(constants.ENDPOINT, "", 1)
    path = template.format(
        repo_id=quote(repo, safe="/"), revision=quote(revision, safe=""), filename=quote(filename)
    )
    return (base or endpoint()).rstrip("/") + path


def token() -> str | None:
    """The Hub token as huggingface_hub finds it (HF_TOKEN, or the stored login)."""
    from huggingface_hub import get_token

    return get_token()


def cache_dir() -> str:
    """This machine's Hugging Face cache (HF_HUB_CACHE / HF_HOME honoured)."""
    from huggingface_hub import constants

    return str(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)


def controller_state_dir() -> str:
    """This machine's own state, outside the Hub cache: $XDG_CACHE_HOME/tensorless-deploy."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "tensorless-deploy")


def host_state_dir(models_dir: str) -> str:
    """Where a host keeps the tool's stamps for models under models_dir: beside it, never
    inside it (``/var/lib/tensorless/models`` -> ``/var/lib/tensorless/models.state``)."""
    return models_dir.rstrip("/") + ".state"


def repo_folder(repo: str) -> str:
    """``models--ORG--NAME``, as huggingface_hub names a model repository's cache folder."""
    from huggingface_hub import constants

    return constants.REPO_ID_SEPARATOR.join(["models", *repo.split("/")])


@dataclass(frozen=True)
class CachePaths:
    """Where one model file lives under a cache directory, and its stamp outside it."""

    repo_dir: str
    blob: str
    partial: str
    stamp: str  # stamp_text() of the blob when last verified, in the tool's state dir
    snapshot: str
    link_target: str  # what the snapshot link points at, relative to the link
    ref: str  # refs/tensorless-deploy/<revision>: holds the revision, so it is not detached
    revision: str
    # the flock every writer of the partial holds (a download, a push), in the state dir: one
    # writer at a time, and a writer still running (its run gone) is waited for
    lock: str = ""

    @property
    def blob_dir(self) -> str:
        return posixpath.dirname(self.blob)

    @property
    def snapshot_dir(self) -> str:
        return posixpath.dirname(self.snapshot)

    def stamp_text(self, size: int, mtime: int) -> str:
        """What the stamp says of a verified blob: unchanged while size and mtime are."""
        return stamp_text(size, mtime, self.blob)


# A verification stamp: the blob's size, mtime and path, one line. On hosts it is written and
# read back as `stat -c STAMP_STAT BLOB` prints it (scripts/host.sh stamp_of, bound from here).
STAMP_STAT = "%s %Y %n"


def stamp_text(size: int, mtime: int, path: str) -> str:
    """What STAMP_STAT prints for a file of this size and mtime at path."""
    return f"{size} {mtime} {path}"


@functools.lru_cache(maxsize=1024)  # pure, and asked once per host and model by a plan
def cache_paths(
    cache: str, state_dir: str, repo: str, revision: str, filename: str, sha256: str
) -> CachePaths:
    repo_dir = posixpath.join(cache, repo_folder(repo))
    blob = posixpath.join(repo_dir, "blobs", sha256)
    snapshot = posixpath.join(repo_dir, "snapshots", revision, filename)
    return CachePaths(
        repo_dir=repo_dir,
        blob=blob,
        partial=blob + ".incomplete",
        stamp=posixpath.join(state_dir, "verified", sha256),
        snapshot=snapshot,
        link_target=posixpath.relpath(blob, posixpath.dirname(snapshot)),
        lock=posixpath.join(state_dir, "downloads", f"{sha256}.lock"),
        ref=posixpath.join(repo_dir, "refs", REF_FOLDER, revision),
        revision=revision,
    )
