"""logs: a model's units' journal from every host, each line prefixed with its host and unit,
through the same SSH connections pyinfra holds; --follow streams them all at once."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from typing import Any

from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.fleet.channel import host_command, ssh_transport
from tensorless_deploy.fleet.connect import disconnect, new_state
from tensorless_deploy.fleet.status import model_units, read_units
from tensorless_deploy.launch.read import unit_engine
from tensorless_deploy.recipe.catalog import Catalog

Line = Callable[[str, str, str], None]  # (host, unit, line)


def journal_command(unit: str, engine: str, lines: int, follow: bool) -> str:
    """The server's own lines of one unit. podman (quadlet or plain unit): what conmon's journald
    log driver wrote, each line tagged with CONTAINER_NAME (the unit's name); not podman's event
    entries (container create, init, start, attach, each with every label), its container ID or
    systemd's lines. docker (whose default log driver writes no journal): what reached the
    unit's stdout from the attached `docker run`."""
    args = [
        "journalctl",
        "--no-pager",
        "-o",
        "cat",
        "-n",
        str(lines),
        f"_SYSTEMD_UNIT={unit}.service",
    ]
    args.append(f"CONTAINER_NAME={unit}" if engine == "podman" else "_TRANSPORT=stdout")
    if follow:
        args.append("-f")
    return shlex.join(args)


def door_journal_command(lines: int, follow: bool) -> str:
    """The front door's own lines (HAProxy's: a line per request, its reloads), on its host."""
    from tensorless_deploy.hostplan.gateway import SERVICE

    args = ["journalctl", "--no-pager", "-o", "cat", "-n", str(lines), "-u", SERVICE]
    return shlex.join([*args, "-f"] if follow else args)


def _line(host: str, unit: str, raw: bytes, emit: Line) -> None:
    # llama-server's blank journal entries say nothing
    if raw.strip():
        emit(host, unit, raw.decode("utf-8", "replace").rstrip("\r"))


def _stream(host: Any, command: str, unit: str, emit: Line) -> None:
    """Run command on the host's own SSH connection and hand over each line as it arrives; a
    journal that could not be read (journalctl's exit status) raises with what it said."""
    transport = ssh_transport(host)
    channel = transport.open_session()
    channel.exec_command(command)
    buf = b""
    try:
        while True:
            chunk = channel.recv(65536)
            if not chunk:
                break
            buf += chunk
            *whole, buf = buf.split(b"\n")
            for raw in whole:
                _line(host.name, unit, raw, emit)
        _line(host.name, unit, buf, emit)
        code = channel.recv_exit_status()
        if code != 0:
            said = channel.makefile_stderr("rb").read().decode("utf-8", "replace")
            lines = [line.strip() for line in said.splitlines() if line.strip()]
            raise OSError(f"journalctl exit {code}: {lines[-1] if lines else 'no output'}")
    finally:
        channel.close()


def _join_or_interrupt(greenlets: Sequence[Any]) -> None:
    """Wait for the streams; Ctrl-C ends them all and is raised here, in the caller. Python's
    own handler would raise KeyboardInterrupt in whatever runs when the signal lands, often
    paramiko's transport thread (a greenlet under pyinfra's gevent), which then dies and
    leaves its streams waiting for bytes that never come: the CLI hung after Ctrl-C."""
    import signal

    import gevent

    interrupted: list[bool] = []

    def on_interrupt() -> None:
        interrupted.append(True)
        gevent.killall(list(greenlets), block=False)

    python_handler = signal.getsignal(signal.SIGINT)
    handler = gevent.signal_handler(signal.SIGINT, on_interrupt)
    try:
        gevent.joinall(greenlets)
    finally:
        handler.cancel()  # libev puts the default action back: Python's handler again
        signal.signal(signal.SIGINT, python_handler)
    if interrupted:
        raise KeyboardInterrupt


def logs(
    inventory: Any,
    hosts: Sequence[Any],
    catalog: Catalog,
    model: str,
    emit: Line,
    *,
    lines: int = 50,
    follow: bool = False,
    flags: Flags | None = None,
) -> dict[str, str]:
    """The last `lines` journal lines of each of MODEL's units on every host, and of the front
    door that fronts them (as their markers name it; its unit's name tags its lines), then, with
    follow, everything new until interrupted. Returns the hosts that could not be read, with
    why."""
    import gevent
    from pyinfra.api.command import StringCommand

    from tensorless_deploy.fleet.connect import on_each_host
    from tensorless_deploy.fleet.gateway import doors_named, read_markers
    from tensorless_deploy.hostplan.gateway import SERVICE

    entries = catalog.find_or_none(model)
    state = new_state(inventory, flags)  # Ctrl-C and a closed pipe: quiet (fleet.connect)
    found = read_units(state, hosts)
    errors: dict[str, str] = {}
    jobs = []
    by_name = {h.name: h for h in inventory}
    try:
        readable = [h for h in hosts if not isinstance(found[h.name], str)]
        named = doors_named(read_markers(state, readable), set(by_name))
        doors = [by_name[d] for d in named]
        reached = on_each_host(state, doors, lambda h: True, keep_connected=True, step="the door")
        for d, ok in zip(doors, reached, strict=True):
            if ok is not True:
                errors[d.name] = f"the door: {ok}"
                continue
            cmd = host_command(state, d, StringCommand(door_journal_command(lines, follow)))
            name = SERVICE.removesuffix(".service")
            jobs.append((d.name, name, gevent.spawn(_stream, d, cmd, name, emit)))
        for h in hosts:
            units = found[h.name]
            if isinstance(units, str):
                errors[h.name] = units
                continue
            mine = model_units(units, entries, model)
            if not mine:
                errors[h.name] = f"{model} is not deployed here"
                continue
            for u in mine:  # one stream per unit, so every line names its instance
                # the journal is root's: under sudo where the inventory asks for it
                journal = journal_command(u.name, unit_engine(u.path, u.text), lines, follow)
                cmd = host_command(state, h, StringCommand(journal))
                jobs.append((h.name, u.name, gevent.spawn(_stream, h, cmd, u.name, emit)))
        greenlets = [j for _, _, j in jobs]

        def closed(job: Any) -> None:
            if isinstance(job.exception, BrokenPipeError):  # the reader went away: all stop
                gevent.killall([g for g in greenlets if g is not job], block=False)

        for g in greenlets:
            g.link_exception(closed)
        _join_or_interrupt(greenlets)
        for host, unit, j in jobs:
            if isinstance(j.exception, BrokenPipeError):
                raise j.exception  # the CLI ends quietly, as a filter does
            if j.exception is not None:
                errors[host] = f"{unit}: reading the journal failed: {j.exception}"
    finally:
        disconnect(list(inventory))
    return errors
