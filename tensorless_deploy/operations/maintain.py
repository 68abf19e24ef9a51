"""operations.maintain: a maintenance window on a host (``tensorless-deploy maintain``): its
record, and the units kept from starting while it is open."""

from __future__ import annotations

import hashlib

from pyinfra.api.command import StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from tensorless_deploy.facts.maintain import HOLD_TEXT, MAINTENANCE_RECORD, hold_dropin
from tensorless_deploy.facts.pyinfra import FileSha256
from tensorless_deploy.operations._run import Commands, script

RUNNING = ("active", "activating", "reloading", "deactivating")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@operation()
def record(text: str, path: str = MAINTENANCE_RECORD) -> Commands:
    """
    Open a maintenance window on the host: its record, written whole or not at all.

    Nothing to do when the record already says this. While it exists, every unit held by
    ``maintain.held`` stays stopped, and doctor and deploy fail ``host.maintenance``.

    + text: the record's JSON (``hostplan.maintain.record_text``)
    + path: where it is (``/var/lib/tensorless-deploy/maintenance.json``)

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import maintain

        maintain.record(name="open the window", text=record_text(rec))
    """
    if host.get_fact(FileSha256, path=path) == _sha256(text):
        host.noop(f"{path} unchanged")
        return
    yield script("maintain-record", record=path, text=text)


@operation()
def record_removed(path: str = MAINTENANCE_RECORD) -> Commands:
    """
    Close the maintenance window on the host: its record goes.

    The last step of ``maintain end``, run only after every unit it stopped serves again.
    Nothing to do without a record.

    + path: where it is (``/var/lib/tensorless-deploy/maintenance.json``)

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import maintain

        maintain.record_removed(name="close the window")
    """
    if host.get_fact(FileSha256, path=path) is None:
        host.noop(f"no {path}")
        return
    yield StringCommand("rm", "-f", path)


@operation()
def held(
    service: str,
    active: str,
    path: str | None = None,
    idle_s: int | None = None,
    key: str | None = None,
) -> Commands:
    """
    Keep a unit from starting while the maintenance window is open, and stop it.

    The drop-in ``/etc/systemd/system/NAME.service.d/50-tensorless-maintenance.conf`` makes the
    service's start conditional on the window's record being absent: at boot, by a restart
    policy, by hand. Nothing to do when the drop-in is there and the service is stopped.

    + service: ``NAME.service``
    + active: the service's ActiveState as read (``active``: it is stopped)
    + path: the unit file (where its ``/health`` label says it serves)
    + idle_s: before the stop, wait up to this many seconds for its requests in flight
    + key: the unit's API key file on the host, sent with the read of ``/slots``

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import maintain

        maintain.held(name="hold", service="tensorless-tiny-p100.service", active="active")
    """
    dropin = hold_dropin(service)
    if host.get_fact(FileSha256, path=dropin) == _sha256(HOLD_TEXT) and active not in RUNNING:
        host.noop(f"{service} stopped and held")
        return
    drain: dict[str, str | int] = {}
    if path and idle_s:
        drain = {"path": path, "idle": idle_s, **({"key": key} if key else {})}
    yield script("maintain-hold", svc=service, dropin=dropin, text=HOLD_TEXT, **drain)


@operation()
def released(service: str) -> Commands:
    """
    Let a unit start again at the end of a maintenance window.

    Its maintenance drop-in goes (``maintain.held``); it is not started here. Nothing to do
    without one.

    + service: ``NAME.service``

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import maintain

        maintain.released(name="release", service="tensorless-tiny-p100.service")
    """
    dropin = hold_dropin(service)
    if host.get_fact(FileSha256, path=dropin) is None:
        host.noop(f"{service} is not held")
        return
    yield script("maintain-release", svc=service, dropin=dropin)
