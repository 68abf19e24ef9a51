"""One change at a time per host: every command that changes a host (deploy, prepare, stop,
rollback, prune, gate run, maintain) holds the host's lock from before its survey until it is
done with the host.

The lock is an ``flock`` held on the host by ``operations/scripts/run-lock.sh``, started on a
stream of its own (``fleet.channel``), which keeps it while the controller's heartbeat arrives
(a line every few seconds) and lets go at EOF or after the host's SSH deadline of silence. So
a lock is never stale: it goes with its holder, and its holder goes with the run that started
it, whether that run ends, is killed, or loses the link (a reboot empties /run as well). A
second run refuses at once, naming who holds it (``--wait-lock N``: waits up to N s first).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from tensorless_deploy.fleet.channel import Stream, open_stream

LOCK_PATH = "/run/tensorless-deploy/deploy.lock"
LOCKED_EXIT = 75  # run-lock.sh: another run holds it
CANNOT_LOCK = "cannot take the host's lock"  # how a lock that could not be taken at all is said


def heartbeat_every(deadline: float) -> float:
    """How often the controller says something to a host it holds (its lock's heartbeat, its
    SSH keepalive): a few times within the host's deadline, at most every 5 s."""
    return max(0.2, min(5.0, deadline / 4))


class LockHeld(str):
    """The error text of a host whose lock another run holds."""


@dataclass
class HostLock:
    """A host's lock, held by this run: the holder's pid on the host, and its heartbeat."""

    host: str
    pid: int
    stream: Stream
    beat: Any = None  # the heartbeat greenlet
    released: bool = field(default=False)

    def release(self) -> None:
        """Let go: the holder sees EOF and exits, and the kernel drops its flock."""
        if self.released:
            return
        self.released = True
        if self.beat is not None:
            self.beat.kill(block=False)
        with contextlib.suppress(OSError, EOFError):
            self.stream.close()


def who(command: str) -> str:
    """The record a holder leaves on the host: what runs, from where, as whom."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{command} by {user}@{socket.gethostname()} (pid {os.getpid()})"


def lock_host(
    state: Any, host: Any, command: str, *, wait: int, deadline: int
) -> HostLock | LockHeld:
    """Take the host's lock for this run, waiting up to wait seconds for another run's; the
    refusal names who holds it."""
    import gevent

    from tensorless_deploy.operations._run import script

    cmd = script("run-lock", lock=LOCK_PATH, wait=wait, deadline=deadline, who=who(command))
    stream = open_stream(state, host, cmd)
    first = stream.readline(wait + deadline + 5)
    word, _, rest = first.partition(" ")
    if word == "locked" and rest.isdigit():
        held = HostLock(host.name, int(rest), stream)
        every = heartbeat_every(deadline)

        def beat() -> None:
            while True:
                gevent.sleep(every)
                try:
                    stream.write(b"beat\n")
                except (OSError, EOFError):
                    return

        held.beat = gevent.spawn(beat)
        return held
    err = stream.rest() if word != "held" else ""
    stream.close()
    if word == "held":
        age, _, holder = rest.partition(" ")
        seconds = f"for {age} s" if age.isdigit() else "since a time not recorded"
        waited = f"; still held after waiting {wait} s" if wait else ""
        return LockHeld(
            f"locked by another run: {holder}, {seconds}{waited} (fix: wait for it to end, "
            "or pass --wait-lock SECONDS)"
        )
    return LockHeld(f"{CANNOT_LOCK}: {err or first or 'no answer'}")
