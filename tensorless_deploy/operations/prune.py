"""operations.prune: model files and engine images that no unit of this tool references any
more, removed; what a unit (current or kept for rollback) names is never touched."""

from __future__ import annotations

import shlex

from pyinfra.api.command import StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.files import File

from tensorless_deploy.facts.pyinfra import ImagePresent
from tensorless_deploy.operations._run import Commands, script


@operation(is_idempotent=True)
def model_removed(blob: str, stamp: str) -> Commands:
    """
    Remove one model blob, with the snapshot links to it, its stamp and emptied folders.

    + blob: ``<models_dir>/models--ORG--NAME/blobs/<sha256>``
    + stamp: its stamp in the tool's state directory (``<models_dir>.state/verified/<sha256>``)

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import prune

        prune.model_removed(
            name="unused model",
            blob="/var/lib/tensorless/models/models--org--m-GGUF/blobs/15ce2d44...",
            stamp="/var/lib/tensorless/models.state/verified/15ce2d44...",
        )
    """
    if not host.get_fact(File, path=blob) and not host.get_fact(File, path=stamp):
        host.noop(f"{blob} is gone already")
        return
    yield script("model-remove", blob=blob, stamp=stamp)


@operation(is_idempotent=True)
def image_removed(engine_bin: str, image: str) -> Commands:
    """
    Remove an engine image by digest, never forced: one a container uses is refused.

    + engine_bin: the engine binary on the host
    + image: ``name@sha256:<64 hex>``

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import prune

        prune.image_removed(
            name="unused image", engine_bin="/usr/bin/podman", image="ghcr.io/x/engine@sha256:..."
        )
    """
    if not host.get_fact(ImagePresent, engine_bin=engine_bin, image=image):
        host.noop(f"image {image.rpartition('@')[2][:19]} is gone already")
        return
    yield StringCommand(shlex.quote(engine_bin), "rmi", shlex.quote(image))
