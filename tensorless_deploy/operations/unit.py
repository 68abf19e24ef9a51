"""operations.unit: a systemd unit file (quadlet .container or plain .service), and its service
started and healthy, or stopped and removed."""

from __future__ import annotations

import hashlib
import posixpath
from io import StringIO

from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from tensorless_deploy.facts.pyinfra import FileSha256, HttpStatus, ModelBlob
from tensorless_deploy.hub import cache_paths, host_state_dir
from tensorless_deploy.operations._run import Commands, script


def _kind(path: str) -> str:
    return "quadlet" if path.endswith(".container") else "service"


def service_name(path: str) -> str:
    """The systemd service a unit file defines (quadlet: NAME.container -> NAME.service)."""
    return posixpath.basename(path).rsplit(".", 1)[0] + ".service"


@operation(is_idempotent=True)
def unit(path: str, content: str, quadlet_bin: str | None = None) -> Commands:
    """
    Write a unit file only when its content changed: to a temporary name, read by
    ``quadlet -dryrun`` first where it is a quadlet, the old file kept for a restore, then
    renamed into place.

    + path: ``/etc/containers/systemd/NAME.container`` or ``/etc/systemd/system/NAME.service``
    + content: the whole file
    + quadlet_bin: the quadlet generator on the host; a quadlet it refuses is never installed

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import unit

        written = unit.unit(name="unit", path="/etc/systemd/system/x.service", content=text)
    """
    want = hashlib.sha256(content.encode()).hexdigest()
    if host.get_fact(FileSha256, path=path) == want:
        host.noop(f"{path} unchanged")
        return
    directory, name = posixpath.split(path)
    new = posixpath.join(directory, f".{name}.tensorless-new")
    yield StringCommand("mkdir", "-p", directory)
    yield FileUploadCommand(StringIO(content), new)
    if _kind(path) == "quadlet" and quadlet_bin:
        yield script("unit-check-quadlet", new=new, name=name, quadlet=quadlet_bin)
    yield script("unit-install", path=path, new=new)


@operation()
def serving(path: str, health_url: str, timeout_s: int, restart: bool = False) -> Commands:
    """
    The unit's service running and answering ``/health`` with 200 (503 "Loading model" and a
    refused connection mean "still loading"). With restart, it is restarted first; a new unit
    that does not become healthy gives way to the previous one (or is removed when there was
    none), and the operation fails with the journal's last lines. Not idempotent: a restart is
    asked for exactly when the unit changed (``_if=unit.did_change``).

    + path: the unit file (its service is NAME.service)
    + health_url: the server's ``/health`` as seen on the host
    + timeout_s: how long the start and the load may take
    + restart: restart even when it is healthy now

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import unit

        written = unit.unit(name="unit", path=path, content=text)
        unit.serving(name="restart", path=path, health_url=url, timeout_s=300, restart=True,
                     _if=written.did_change)
    """
    svc = service_name(path)
    if not restart:
        code = host.get_fact(HttpStatus, url=health_url)
        if code == 200:
            host.noop(f"{svc} healthy at {health_url}")
            return
    yield script(
        "unit-activate",
        svc=svc,
        url=health_url,
        timeout=timeout_s,
        path=path,
        kind=_kind(path),
        verb="restart" if restart else "start",
    )


@operation(is_idempotent=True)
def removed(
    service: str,
    paths: tuple[str, ...],
    models_dir: str | None = None,
    repo: str | None = None,
    revision: str | None = None,
    filename: str | None = None,
    sha256: str | None = None,
) -> Commands:
    """
    A unit stopped and its file removed (whichever of ``paths`` exists); with the model's
    ``models_dir``, ``repo``, ``revision``, ``filename`` and ``sha256``, its model file too.

    + service: the unit's name without ``.service``
    + paths: the unit files it may have been written as (quadlet and plain)
    + models_dir, repo, revision, filename, sha256: the model file to purge (all or none)
    """
    present = [p for p in paths if host.get_fact(FileSha256, path=p) is not None]
    model = None
    if models_dir and repo and revision and filename and sha256:
        model = cache_paths(
            models_dir, host_state_dir(models_dir), repo, revision, filename, sha256
        )
    blob = (
        host.get_fact(ModelBlob, blob=model.blob, stamp=model.stamp, snapshot=model.snapshot)
        if model
        else None
    )
    if not present and (blob is None or (not blob.exists and blob.link is None)):
        host.noop(f"{service} is not deployed here")
        return
    purge = (
        dict(
            blob=model.blob,
            partial=model.partial,
            stamp=model.stamp,
            snapshot=model.snapshot,
            repo_dir=model.repo_dir,
        )
        if model
        else {}
    )
    for path in present or [paths[0]]:
        yield script(
            "unit-remove",
            path=path if present else "/nonexistent",
            svc=f"{service}.service",
            kind=_kind(path),
            purge="yes" if model else "no",
            **purge,
        )
