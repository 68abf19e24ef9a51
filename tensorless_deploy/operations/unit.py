"""operations.unit: a systemd unit file (quadlet .container or plain .service), and its service
started and healthy, or stopped and removed."""

from __future__ import annotations

import hashlib
import posixpath
from io import StringIO

from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from tensorless_deploy.facts.device import DEVICE_LINE
from tensorless_deploy.facts.pyinfra import FileSha256, HttpStatus, ModelBlob
from tensorless_deploy.hub import cache_paths, host_state_dir
from tensorless_deploy.operations._run import Commands, script
from tensorless_deploy.operations.secrets import SecretFiles


def _kind(path: str) -> str:
    return "quadlet" if path.endswith(".container") else "service"


def service_name(path: str) -> str:
    """The systemd service a unit file defines (quadlet: NAME.container -> NAME.service)."""
    return posixpath.basename(path).rsplit(".", 1)[0] + ".service"


@operation(is_idempotent=True)
def unit(
    path: str, content: str, quadlet_bin: str | None = None, model: str | None = None
) -> Commands:
    """
    Write a systemd unit file (a quadlet ``.container`` or a plain ``.service``) when it changed.

    Nothing is written while the file's sha256 is the content's. Otherwise the content goes to
    a temporary name, is read by ``quadlet -dryrun`` first where it is a quadlet, and is renamed
    into place with the old file kept for a restore (see ``unit.serving``).

    + path: ``/etc/containers/systemd/NAME.container`` or ``/etc/systemd/system/NAME.service``
    + content: the whole file
    + quadlet_bin: the quadlet generator on the host; a quadlet it refuses is never installed
    + model: the model the unit serves (its ``io.tensorless.model`` label); a file there that
      serves another model is never replaced

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import unit

        written = unit.unit(
            name="llama-server unit",
            path="/etc/containers/systemd/tensorless-pn3-p100.container",
            content=text,
            quadlet_bin="/usr/libexec/podman/quadlet",
        )
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
    owner = {"model": model} if model else {}
    yield script("unit-install", path=path, new=new, sha=want, **owner)


def _drain(idle_s: int | None, key: str | None) -> dict[str, str | int]:
    """The unit scripts' drain parameters: wait up to idle_s for the requests in flight (their
    /slots read with the key file at key, where the unit has one); none: no wait."""
    if not idle_s:
        return {}
    return {"idle": idle_s, **({"key": key} if key else {})}


@operation()
def serving(
    path: str,
    health_url: str,
    timeout_s: int,
    restart: bool = False,
    idle_s: int | None = None,
    key: str | None = None,
) -> Commands:
    """
    Make a unit's service run, answer ``/health`` and serve on its device, restarting on ask.

    Nothing is done while ``/health`` answers 200 (the ``HttpStatus`` fact) and no restart is
    asked for; otherwise the service is started (or restarted) and waited for, 503 "Loading
    model" and a refused connection meaning "still loading". Once healthy, the instance's own
    start log must show it on the device its unit's ``io.tensorless.device`` label names (its
    one GPU, by PCI bus id; ``cpu`` for a CPU engine). A restarted unit that does not become
    healthy, or is not on its card, gives way to the previous file (or is removed when there
    was none), and the operation fails with how long it took and this start's journal (or its
    device lines). Not idempotent with ``restart=True``: ask for a restart exactly when the unit
    changed (``_if=written.did_change``).

    + path: the unit file (its service is ``NAME.service``)
    + health_url: the server's ``/health`` as seen on the host
    + timeout_s: how long the start and the model's load may take, in seconds
    + restart: restart even when it is healthy now
    + idle_s: before a restart, wait up to this many seconds for the serving instance's
      requests in flight to finish (its ``/slots`` idle), then restart regardless and say so
      ("restarted with N requests in flight after Ts"); None or 0: no wait
    + key: the unit's API key file on the host, sent with the read of ``/slots``

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import unit

        written = unit.unit(name="llama-server unit", path=path, content=text)
        unit.serving(
            name="restart when changed",
            path=path,
            health_url="http://127.0.0.1:8080/health",
            timeout_s=300,
            restart=True,
            _if=written.did_change,
        )
        unit.serving(
            name="running and healthy",
            path=path,
            health_url="http://127.0.0.1:8080/health",
            timeout_s=300,
            _if=written.did_not_change,
        )
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
        device_re=DEVICE_LINE,
        **(_drain(idle_s, key) if restart else {}),
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
    secrets: str | None = None,
    idle_s: int | None = None,
    key: str | None = None,
) -> Commands:
    """
    Stop a unit and remove its file, and with the model's coordinates its model file too.

    Whichever of ``paths`` exists is stopped, disabled and removed; nothing there is no change.
    Then the host is read back: the service not active, its container gone, its port (the
    unit's ``io.tensorless.port`` label) closed, the files removed; anything left fails the
    operation with a ``left:`` line and the fix, and a unit whose stop fails keeps its file.
    Given all of ``models_dir``, ``repo``, ``revision``, ``filename`` and ``sha256``, the blob,
    its partial file, stamp and snapshot link go as well (all five or none), read back the same
    way.

    + service: the unit's name without ``.service``
    + paths: the unit files it may have been written as (quadlet and plain)
    + models_dir: the cache directory of the model to purge
    + repo: the model's Hub repository, ``org/name``
    + revision: the model's pinned commit
    + filename: the model file's path in the repository
    + sha256: the model file's sha256 (its blob's name)
    + secrets: the unit's secrets directory (its API key, TLS files), removed with it
    + idle_s: before the stop, wait up to this many seconds for its requests in flight
    + key: the unit's API key file on the host, sent with the read of ``/slots``

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import unit

        unit.removed(
            name="pn3 gone, model kept",
            service="tensorless-pn3-p100",
            paths=(
                "/etc/containers/systemd/tensorless-pn3-p100.container",
                "/etc/systemd/system/tensorless-pn3-p100.service",
            ),
        )
    """
    present = [p for p in paths if host.get_fact(FileSha256, path=p) is not None]
    model = None
    if models_dir and repo and revision and filename and sha256:
        model = cache_paths(
            models_dir, host_state_dir(models_dir), repo, revision, filename, sha256
        )
    blob = (
        ModelBlob.typed(
            host.get_fact(ModelBlob, blob=model.blob, stamp=model.stamp, snapshot=model.snapshot)
        )
        if model
        else None
    )
    kept = secrets if secrets and host.get_fact(SecretFiles, directory=secrets) else ""
    if not present and (
        blob is None or (not blob.exists and blob.link is None and blob.stamp is None)
    ):
        if kept:
            yield script("secret-remove", dir=kept)
            return
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
            **_drain(idle_s, key),
        )
    if kept:
        yield script("secret-remove", dir=kept)


@operation()
def rolled_back(
    path: str, timeout_s: int, idle_s: int | None = None, key: str | None = None
) -> Commands:
    """
    Bring back the previous unit kept beside the current one, gated like a deploy.

    Each deploy that changes a unit keeps the one it replaced; the current unit is kept in its
    place, so a second rollback returns to it; a previous unit that does not become healthy, or
    is not on the device its label names, gives way to the current one again and the operation
    fails. Not idempotent: every call
    swaps.

    + path: the unit file (its service is NAME.service)
    + timeout_s: how long the start and the load may take
    + idle_s: before the swap, wait up to this many seconds for its requests in flight
    + key: the unit's API key file on the host, sent with the read of ``/slots``

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import unit

        unit.rolled_back(
            name="rollback",
            path="/etc/containers/systemd/tensorless-pn3-p100.container",
            timeout_s=379,
        )
    """
    yield script(
        "unit-rollback",
        path=path,
        svc=service_name(path),
        kind=_kind(path),
        timeout=timeout_s,
        device_re=DEVICE_LINE,
        **_drain(idle_s, key),
    )
