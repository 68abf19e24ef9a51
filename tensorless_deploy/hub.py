"""The Hugging Face cache layout a model file lands in, on hosts and on this machine (pure).

`models--ORG--NAME/blobs/<sha256>` holds the bytes; `snapshots/<revision>/<file>` is a relative
link to it, so huggingface_hub and other Hub tools read the same file from the same cache.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

from tensorless_deploy.recipe.schema import Recipe

DEFAULT_ENDPOINT = "https://huggingface.co"


def endpoint() -> str:
    """HF_ENDPOINT, as huggingface_hub honours it, without a trailing slash."""
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def resolve_url(recipe: Recipe, base: str | None = None) -> str:
    """The Hub's resolve URL at the pinned commit (never a branch)."""
    from urllib.parse import quote

    m = recipe.model
    return f"{base or endpoint()}/{m.hf_repo}/resolve/{m.revision}/{quote(m.file)}"


@dataclass(frozen=True)
class CachePaths:
    """Where one recipe's model file lives under a cache directory."""

    repo_dir: str
    blob: str
    partial: str
    stamp: str  # "size mtime" of the blob when last verified; outside the Hub's own layout
    snapshot: str
    link_target: str  # what the snapshot link points at, relative to the link

    @property
    def blob_dir(self) -> str:
        return posixpath.dirname(self.blob)

    @property
    def snapshot_dir(self) -> str:
        return posixpath.dirname(self.snapshot)


def cache_paths(cache_dir: str, recipe: Recipe) -> CachePaths:
    m = recipe.model
    repo_dir = posixpath.join(cache_dir, "models--" + m.hf_repo.replace("/", "--"))
    blob = posixpath.join(repo_dir, "blobs", m.sha256)
    snapshot = posixpath.join(repo_dir, "snapshots", m.revision, m.file)
    target = posixpath.relpath(blob, posixpath.dirname(snapshot))
    return CachePaths(
        repo_dir=repo_dir,
        blob=blob,
        partial=blob + ".incomplete",
        stamp=posixpath.join(cache_dir, ".tensorless", m.sha256 + ".verified"),
        snapshot=snapshot,
        link_target=target,
    )
