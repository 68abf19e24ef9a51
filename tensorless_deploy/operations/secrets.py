"""operations.secrets: the operator's secrets on a host (the API key, the TLS certificate and
key, the Hub token), each sent on the stdin of one SSH command that writes it, umask 077, into
a temporary file in the final root-only directory and renames it into place.

Never through pyinfra's file upload: with ``_sudo`` that stages the bytes in
``/tmp/pyinfra-<sha1 of the destination>`` (a predictable name, created by the SSH user's
SFTP server with its default umask, so world-readable) before ``sudo cp``; without sudo it
writes the destination with default permissions before any chmod. Here the secret is in no
argv, no unit file, no log and no file but its own (docs/security.md).
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from collections.abc import Callable, Iterable

from pyinfra.api.command import StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.facts import FactBase
from pyinfra.api.operation import operation
from pyinfra.context import host

from tensorless_deploy import shell
from tensorless_deploy.decisions.options import api_key_text, pem_text
from tensorless_deploy.launch.spec import (
    API_KEY_NAME,
    ENGINE_GID,
    SECRET_FILE_MODE,
    TLS_CERT_NAME,
    TLS_KEY_NAME,
)
from tensorless_deploy.operations._run import Commands, script

PACKAGE = "tensorless_deploy.operations"
DIR_MODE = "700"
# How each file the container reads is read (and checked) on the controller.
READERS: dict[str, Callable[[str], str]] = {
    API_KEY_NAME: api_key_text,
    TLS_CERT_NAME: lambda p: pem_text(p, "certificate"),
    TLS_KEY_NAME: lambda p: pem_text(p, "private key"),
}


def secret_command(
    path: str, content: str, *, group: str = "root", mode: str = "600"
) -> StringCommand:
    """One command that writes ``content`` (text, ending in a newline) to ``path`` on the host
    through the command's stdin, umask 077, via a mktemp file in path's own directory (made
    0700 root), then ``chown root:group`` and ``chmod mode`` and a rename: the secret is in no
    argv, no temporary file outside that directory, no world-readable file at any moment. With
    ``_sudo`` the stdin passes through sudo (it asks no password on stdin: -n, or askpass)."""
    if not content.endswith("\n"):
        content += "\n"  # pyinfra's stdin writer adds one anyway; keep the bytes predictable
    command = script("secret-write", path=path, group=group, mode=mode)
    return StringCommand(*command.bits, _stdin=content)


class SecretFiles(FactBase[dict[str, tuple[str, int, int, str]]]):
    """A secrets directory: name -> (mode, uid, gid, sha256); "." is the directory itself
    (sha256 "-"); empty: no directory."""

    @staticmethod
    def default() -> dict[str, tuple[str, int, int, str]]:
        return {}

    def command(self, directory: str) -> str:
        return "sh -c " + shlex.quote(shell.program(PACKAGE, "secret-state", dir=directory))

    def process(self, output: Iterable[str]) -> dict[str, tuple[str, int, int, str]]:
        out: dict[str, tuple[str, int, int, str]] = {}
        for line in output:
            parts = line.split()
            if len(parts) == 5 and parts[2].isdigit() and parts[3].isdigit():
                out[parts[0]] = (parts[1], int(parts[2]), int(parts[3]), parts[4])
        return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@operation(is_idempotent=True)
def secrets(directory: str, sources: tuple[tuple[str, str], ...]) -> Commands:
    """
    Install one unit's secret files from files on the controller, readable by the engine only.

    Each file is ``directory/NAME``, ``root:10001`` mode ``0440`` (the engine image's group), in
    ``directory`` (``0700 root``): no other host user can open it; the container reads it
    through a read-only file mount. A file whose sha256, owner and mode are already right is
    left alone; a file the unit no longer uses is removed. The bytes travel on the stdin of
    the command that writes them (``secret_command``), never as an upload.

    + directory: the unit's secrets directory, e.g. ``/etc/tensorless-deploy/secrets/NAME``
    + sources: ``(NAME, controller path)`` pairs; NAME is ``api-key``, ``tls.crt`` or
      ``tls.key``

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import secrets

        secrets.secrets(
            name="API key",
            directory="/etc/tensorless-deploy/secrets/tensorless-pn3-p100",
            sources=(("api-key", "~/.config/tensorless/api.key"),),
        )
    """
    have = {n: tuple(v) for n, v in host.get_fact(SecretFiles, directory=directory).items()}
    group = str(ENGINE_GID)
    changed = False
    dir_state = have.get(".")
    for name, source in sources:
        try:
            content = READERS[name](source)
        except (KeyError, ValueError) as exc:
            raise OperationError(f"{host.name}: {name}: {exc}") from None
        want = (SECRET_FILE_MODE, 0, ENGINE_GID, _sha(content))
        if have.get(name) == want and dir_state == (DIR_MODE, 0, 0, "-"):
            continue
        changed = True
        yield secret_command(
            posixpath.join(directory, name), content, group=group, mode=SECRET_FILE_MODE
        )
    names = {n for n, _ in sources}
    stale = sorted(n for n in have if n != "." and n not in names)
    if stale:
        changed = True
        yield StringCommand("rm", "-f", *(posixpath.join(directory, n) for n in stale))
    if not changed:
        host.noop(f"{directory}: {', '.join(sorted(names))} unchanged")


@operation(is_idempotent=True)
def secrets_absent(directory: str) -> Commands:
    """
    Remove a unit's secrets directory once its unit no longer reads any.

    + directory: the unit's secrets directory

    **Example:**

    .. code:: python

        from tensorless_deploy.operations import secrets

        secrets.secrets_absent(
            name="no API key any more",
            directory="/etc/tensorless-deploy/secrets/tensorless-pn3-p100",
        )
    """
    if not host.get_fact(SecretFiles, directory=directory):
        host.noop(f"{directory}: no secrets here")
        return
    yield script("secret-remove", dir=directory)
