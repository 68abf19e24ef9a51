"""operations.image: the engine image, by digest."""

from __future__ import annotations

import shlex

from pyinfra.api.command import StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from tensorless_deploy.facts.pyinfra import ImagePresent
from tensorless_deploy.operations._run import Commands, script


@operation(is_idempotent=True)
def image(engine_bin: str, image: str, archive: str | None = None) -> Commands:
    """
    Make the container engine hold an image, by digest.

    Pulled once by its digest (a tag is never pulled); nothing to do when the engine already
    holds it (the ``ImagePresent`` fact).

    + engine_bin: the engine binary on the host (``/usr/bin/podman`` or ``/usr/bin/docker``)
    + image: ``name@sha256:<64 hex>``
    + archive: an OCI archive on the host (pushed there by the controller) to load instead of
      pulling; refused and removed unless its digest is the image's

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import image

        image.image(
            name="engine image",
            engine_bin="/usr/bin/podman",
            image="ghcr.io/iammrduncan/tensorless-engine@sha256:35409ff9...",
        )
    """
    if host.get_fact(ImagePresent, engine_bin=engine_bin, image=image):
        host.noop(f"image {image.rpartition('@')[2][:19]} already present")
        return
    if archive:
        repo, _, digest = image.partition("@")
        yield script(
            "image-load", engine=engine_bin, archive=archive, digest=digest, repo=repo, image=image
        )
        return
    yield StringCommand(shlex.quote(engine_bin), "pull", "-q", shlex.quote(image))
