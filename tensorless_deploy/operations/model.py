"""operations.model: a model file in the Hugging Face cache layout, verified by sha256."""

from __future__ import annotations

import posixpath

from pyinfra.api.operation import operation
from pyinfra.context import host

from tensorless_deploy.facts.pyinfra import ModelBlob
from tensorless_deploy.hub import CachePaths, cache_paths, host_state_dir, resolve_url
from tensorless_deploy.operations._run import Commands, script
from tensorless_deploy.operations.secrets import secret_command

SECRETS_DIR = "/run/tensorless"
DOWNLOAD_ATTEMPTS = 5


@operation(is_idempotent=True)
def model(
    models_dir: str,
    repo: str,
    revision: str,
    filename: str,
    sha256: str,
    size: int,
    url: str | None = None,
    token: str | None = None,
    pushed: bool = False,
    owner: int | None = None,
) -> Commands:
    """
    Make one model file present and sha256-verified in the Hugging Face cache layout.

    The blob is ``models_dir/models--ORG--NAME/blobs/<sha256>``, linked from
    ``snapshots/<revision>/<file>``. It is downloaded with resume through a partial file and
    verified by sha256 before it is renamed into place; a blob already there but not verified
    by this tool is hashed, never trusted. It is not hashed again while its size and mtime
    match the stamp the last verification left (in ``<models_dir>.state``).

    + models_dir: the cache directory on the host, e.g. ``/var/lib/tensorless/models``
    + repo: the Hub repository, ``org/name``
    + revision: the pinned commit (40 hex characters)
    + filename: the file's path in the repository
    + sha256: the file's sha256; any other bytes are deleted, never used
    + size: the file's exact size in bytes
    + url: where the host downloads it (default: the Hub's resolve URL at the revision,
      ``HF_ENDPOINT`` honoured)
    + token: a Hub token for gated repositories; it reaches the host as a 0600 file read by
      ``curl -H @file``, never in argv, a unit or a log
    + pushed: the controller has sent the bytes into the partial file: verify them, download
      nothing
    + owner: the pid, on the host, of what holds the host's lock for this run (the fleet's
      ``run-lock.sh``): the download stops once it is gone, so an interrupted run leaves
      nothing appending to the partial file (default: none, the download runs to its end)

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import model

        model.model(
            name="model file",
            models_dir="/var/lib/tensorless/models",
            repo="iamMrDuncan/Qwen3.8-27B-PN3-GGUF",
            revision="c701b6690ec360b16d40f85df1cb76062e30cd38",
            filename="Qwen3.8-27B-PN3-P0k19.gguf",
            sha256="15ce2d4469673f1f1753c55de3780cfe04311dd6f05cb41633d73df128e91476",
            size=12954114496,
        )
    """
    paths = cache_paths(models_dir, host_state_dir(models_dir), repo, revision, filename, sha256)
    state = ModelBlob.typed(
        host.get_fact(ModelBlob, blob=paths.blob, stamp=paths.stamp, snapshot=paths.snapshot)
    )
    where = dict(
        blob=paths.blob, stamp=paths.stamp, snapshot=paths.snapshot, target=paths.link_target
    )
    if state.verified:
        if state.link == paths.link_target:
            host.noop(f"model {sha256[:12]} verified earlier; size and mtime unchanged")
            return
        yield script("model-link", **where)
        return
    if state.exists:
        yield script("model-verify", sha=sha256, **where)
        return
    if pushed:
        yield script("model-arrived", sha=sha256, partial=paths.partial, size=size, **where)
        return
    auth = ""
    if token:
        # The token travels as a 0600 file read by curl -H @file, written through a command's
        # stdin: never in argv, units or logs, and never pyinfra's upload (whose _sudo stage is
        # a predictable, world-readable /tmp/pyinfra-<sha1> file).
        auth = posixpath.join(SECRETS_DIR, f"hf-auth-{sha256[:16]}")
        yield secret_command(auth, f"Authorization: Bearer {token}\n")
    yield script(
        "model-download",
        **download_params(paths, sha256, size, url or resolve_url(repo, revision, filename)),
        auth=auth,
        owner=owner or "",
    )


def download_params(paths: CachePaths, sha256: str, size: int, url: str) -> dict[str, str | int]:
    """model-download.sh's parameters but its auth file: one download, whoever runs it (this
    operation; the pod's init step of an export, whose program supplies auth)."""
    return dict(
        blob=paths.blob,
        stamp=paths.stamp,
        snapshot=paths.snapshot,
        target=paths.link_target,
        sha=sha256,
        partial=paths.partial,
        lock=paths.lock,
        size=size,
        url=url,
        attempts=DOWNLOAD_ATTEMPTS,
    )
