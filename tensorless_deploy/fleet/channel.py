"""A command on a host outside pyinfra's operations, on a stream of its own: the host side of a
push (the controller writes the file into it) and the holder of the host's lock (the controller
writes a heartbeat into it). Wrapped as pyinfra wraps every command for this host (sudo and su
from its inventory data); over SSH it is one more channel of the connection pyinfra holds, on
@local a child process."""

from __future__ import annotations

import contextlib
import subprocess
from typing import Any, Protocol


def executor_arguments(state: Any, host: Any) -> dict[str, Any]:
    """How pyinfra runs a command on this host (sudo, su, its shell: from the host's inventory
    data), for a command the tool runs itself outside an operation."""
    from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments

    arguments, _ = pop_global_arguments(state, host, {})
    return {
        k: v
        for k, v in arguments.items()
        if k in CONNECTOR_ARGUMENT_KEYS
        and k not in ("_get_pty", "_timeout", "_stdin", "_success_exit_codes")
    }


def host_command(state: Any, host: Any, cmd: Any) -> str:
    """cmd (a pyinfra StringCommand, or shell text) as this host's connector would run it."""
    from pyinfra.api.command import StringCommand
    from pyinfra.connectors.util import make_unix_command_for_host

    command = cmd if isinstance(cmd, StringCommand) else StringCommand(cmd)
    wrapped: StringCommand = make_unix_command_for_host(
        state, host, command, **executor_arguments(state, host)
    )
    return str(wrapped.get_raw_value())


class Stream(Protocol):
    def readline(self, timeout: float) -> str: ...
    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def rest(self) -> str: ...


def ssh_transport(host: Any) -> Any:
    """The paramiko transport of a connected SSH host (None: not SSH, or not connected)."""
    client = getattr(getattr(host, "connector", None), "client", None)
    return client.get_transport() if client is not None else None


class _Channel:
    def __init__(self, transport: Any, command: str) -> None:
        self.channel = transport.open_session()
        self.channel.exec_command(command)
        self.out = self.channel.makefile("rb")

    def readline(self, timeout: float) -> str:
        self.channel.settimeout(timeout)
        try:
            return str(self.out.readline().decode(errors="replace")).strip()
        except TimeoutError:
            return ""
        finally:
            self.channel.settimeout(None)

    def write(self, data: bytes) -> None:
        self.channel.sendall(data)

    def rest(self) -> str:
        self.channel.settimeout(5)
        try:
            err = self.channel.makefile_stderr("rb").read().decode(errors="replace")
            return " ".join(str(err).split())
        except (OSError, EOFError):
            return ""

    def close(self) -> None:
        self.channel.close()


class _Process:
    def __init__(self, command: str) -> None:
        self.proc = subprocess.Popen(
            ["sh", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def readline(self, timeout: float) -> str:
        import gevent

        assert self.proc.stdout is not None
        try:
            with gevent.Timeout(timeout):
                return self.proc.stdout.readline().decode(errors="replace").strip()
        except gevent.Timeout:
            return ""

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def rest(self) -> str:
        assert self.proc.stderr is not None
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            return ""
        return " ".join(self.proc.stderr.read().decode(errors="replace").split())

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def open_stream(state: Any, host: Any, cmd: Any) -> Stream:
    """Start cmd on the host with a stdin the controller writes and a stdout it reads."""
    command = host_command(state, host, cmd)
    transport = ssh_transport(host)
    if transport is not None:
        return _Channel(transport, command)
    return _Process(command)
