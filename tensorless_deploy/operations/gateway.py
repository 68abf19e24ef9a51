"""operations.gateway: the front door on its host (hostplan.gateway renders it) and the marker
on each host whose instances it fronts.

HAProxy comes from the host's own packages (apt or dnf) and is checked to be new enough; the
door's configuration (it holds keys) and certificate are written root-only through the stdin of
the command that writes them (operations.secrets.secret_command), the configuration to a
temporary name that ``haproxy -c`` must accept before it replaces the live one; the door's own
unit (never the distribution's haproxy.service) is started, or reloaded hitlessly when only the
configuration changed. Each operation is a noop where the host is already right.
"""

from __future__ import annotations

import hashlib
import posixpath
from io import StringIO

from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.server import Which
from pyinfra.facts.systemd import SystemdStatus
from pyinfra.operations import apt, dnf

from tensorless_deploy.facts.pyinfra import FileSha256, HaproxyVersion
from tensorless_deploy.hostplan.gateway import (
    CONFIG_PATH,
    DOOR_PEM,
    HAPROXY_BIN,
    HAPROXY_PACKAGE,
    MIN_HAPROXY,
    SERVICE,
    UNIT_PATH,
    version_problem,
)
from tensorless_deploy.operations._run import Commands, script
from tensorless_deploy.operations.secrets import secret_command


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@operation()
def haproxy(package: str = HAPROXY_PACKAGE) -> Commands:
    """
    Install HAProxy from the host's own packages, at least ``hostplan.gateway.MIN_HAPROXY``.

    Nothing to do where a new enough haproxy is installed; an older one fails (upgrading it is
    the distribution's). apt hosts install from the package lists they have, dnf hosts directly.

    + package: the distribution's package name for HAProxy

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import gateway

        gateway.haproxy(name="gateway.haproxy")
    """
    found = host.get_fact(HaproxyVersion, haproxy=HAPROXY_BIN)
    if found is not None:
        problem = version_problem(found)
        if problem is not None:
            raise OperationError(f"{host.name}: {problem}")
        host.noop(f"{found.split(' - ')[0]} is installed")
        return
    if host.get_fact(Which, command="apt-get"):
        yield from apt.packages._inner(packages=[package])
    elif host.get_fact(Which, command="dnf"):
        yield from dnf.packages._inner(packages=[package])
    else:
        raise OperationError("no apt-get or dnf here: install haproxy with this host's packages")
    major, minor = MIN_HAPROXY
    yield script("gateway-check", haproxy=HAPROXY_BIN, major=major, minor=minor)


@operation()
def door(
    config: str, unit: str, pem: str | None = None, cas: dict[str, str] | None = None
) -> Commands:
    """
    The door on this host: its configuration, certificates and unit, running.

    The configuration and the certificates (the door's with its key, each TLS instance's, which
    the door verifies it by) are written root-only, mode 0600, only when their sha256 differs;
    a new configuration replaces the live one only once ``haproxy -c`` accepts it. The unit is
    started when it is not running, restarted when the unit itself changed, else reloaded when
    the configuration changed (a new worker; the old one finishes its connections).

    + config: haproxy.cfg (hostplan.gateway.render_config)
    + unit: the systemd unit (hostplan.gateway.render_unit)
    + pem: the door's certificate chain and private key, one PEM (None: no TLS)
    + cas: each TLS instance's certificate, by its path on this host (hostplan.gateway.ca_path)

    **Example:**

    .. code:: python

        from tensorless_deploy.hostplan.gateway import render_config, render_unit
        from tensorless_deploy.operations import gateway

        gateway.door(
            name="gateway.door",
            config=render_config(plan),
            unit=render_unit(plan),
        )
    """
    staged = posixpath.join(posixpath.dirname(CONFIG_PATH), ".haproxy.cfg.tensorless-new")
    config_changed = host.get_fact(FileSha256, path=CONFIG_PATH) != _sha(config)
    pem_changed = pem is not None and host.get_fact(FileSha256, path=DOOR_PEM) != _sha(pem)
    unit_changed = host.get_fact(FileSha256, path=UNIT_PATH) != _sha(unit)
    cas_changed = {
        path: text
        for path, text in (cas or {}).items()
        if host.get_fact(FileSha256, path=path) != _sha(text)
    }
    running = host.get_fact(SystemdStatus, services=SERVICE).get(SERVICE, False)
    if not (config_changed or pem_changed or unit_changed or cas_changed) and running:
        host.noop(f"{SERVICE}: unchanged, running")
        return
    if pem is not None and pem_changed:
        yield secret_command(DOOR_PEM, pem)
    for path, text in sorted(cas_changed.items()):
        yield secret_command(path, text)
    # a new certificate alone is read by a reload too: the same configuration, checked again
    new = staged if config_changed or pem_changed or cas_changed else ""
    if new:
        yield secret_command(new, config)
    if unit_changed:
        yield FileUploadCommand(StringIO(unit), UNIT_PATH)
    yield script(
        "gateway-install",
        config=CONFIG_PATH,
        new=new,
        service=SERVICE,
        haproxy=HAPROXY_BIN,
        unit_changed=int(unit_changed and running),
    )


@operation(is_idempotent=True)
def marker(path: str, content: str) -> Commands:
    """
    A small file on a host whose instances a door fronts, naming the door.

    + path: hostplan.gateway.MARKER_PATH
    + content: hostplan.gateway.marker_text

    **Example:**

    .. code:: python

        from tensorless_deploy.hostplan.gateway import MARKER_PATH, marker_text
        from tensorless_deploy.operations import gateway

        gateway.marker(name="gateway.marker", path=MARKER_PATH, content=marker_text(plan))
    """
    if host.get_fact(FileSha256, path=path) == _sha(content):
        host.noop(f"{path} unchanged")
        return
    yield StringCommand("mkdir", "-p", posixpath.dirname(path))
    yield FileUploadCommand(StringIO(content), path)
