"""deploy --transfer push --relay: the controller sends a file once, to one host, and hosts that
hold verified bytes pass them on to the others, host to host, so the controller's bytes and CPU
stay those of one receiver however many hosts there are (docs/design.md, "The relay").

The tree is a binomial one, built as the hops end: every host that holds the file verified
(its receive hashed it on arrival and the sha256 is the expected one) serves one receiver at a
time, so the holders double with every round and N hosts have the file after about
log2(N + 1) hop times; the controller sends only while no host holds verified bytes (the first
hop, or after every holder failed). Each hop is a push as fleet.push makes one: the receiver's
``model-receive.sh`` says how much it has, the sender sends the rest, the receiver hashes as it
appends and never takes more than the size. A hop that stops (a cut link, a killed ssh) is
tried again, from the offset the receiver reports; a hop whose receiver hashed other bytes is
refused (the receiver's copy deleted, the sender not trusted again) and tried from another.

Hosts never gain standing access to each other: each hop has an ed25519 key made for it on
the controller, its public half in the receiver's authorized_keys limited to the hop (restrict,
from= the sender's address as the sender routes to the receiver, command= the receive program
of this file), its private half 0600 in a directory of the hop's on the sender, with the
receiver's host key pinned from the controller's own connection; the hop's end revokes it, and
the relay's end (success, failure, Ctrl-C) sweeps every host it touched for the run's hops.
"""

from __future__ import annotations

import posixpath
import queue
import re
import secrets
import shlex
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorless_deploy.fleet.channel import host_command, ssh_transport
from tensorless_deploy.fleet.push import Progress, Receiver, receive_command, send_one

CONTROLLER = "controller"
RELAY_ROOT = "/run/tensorless-relay"  # tmpfs: a hop's directory never outlives a reboot
ATTEMPTS = 3  # hops one receiver is given before it fails (each resumes where the last stopped)
HOP_TIMEOUT_S = 30.0  # the grant, the revoke and the route question, each
RECEIVED = re.compile(r"received (\d+) bytes \(resumed from (\d+)\), sha256 ([0-9a-f]{64})")
UNVERIFIED = 3  # relay-send.sh's exit status when the sender's own copy is not verified


@dataclass
class Copy:
    """One file to relay: the controller's copy, what it must hash to, where it goes on each
    host (the partial the receive appends to, by host) and each host's lock of that partial."""

    what: str
    source: Path | Callable[[], Path]  # the controller's copy, or how to get it when needed
    sha256: str
    size: int
    remote: dict[str, str]
    locks: dict[str, str] = field(default_factory=dict)
    # hosts of the run that hold the file already, verified by this tool (the model's blob in
    # its cache and the stamp its verification left): host -> (blob, stamp); they send first
    held: dict[str, tuple[str, str]] = field(default_factory=dict)

    def controller_file(self) -> Path:
        """The controller's copy, fetched the first time the controller has to send (never,
        where a holder sends it)."""
        if callable(self.source):
            self.source = self.source()  # one controller hop at a time (the schedule's)
        assert isinstance(self.source, Path)
        return self.source

    def source_of(self, host: str) -> tuple[str, str]:
        """What a sender sends from: its blob and stamp where it held the file before the run,
        else the partial the relay filled ("": verified by the receive's own record)."""
        return self.held.get(host) or (self.remote[host], "")


@dataclass
class Hop:
    """One sender to one receiver: what came of it. kind: ok, cut (try again from the offset),
    wrong (the receiver hashed other bytes: refused), unverified (the sender's copy is not)."""

    sender: str
    receiver: str
    kind: str = "ok"
    sent: int = 0
    offset: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def line(self) -> str:
        return f"relay {self.sender} -> {self.receiver}: {self.error}"


@dataclass
class RelayReport:
    """Per receiver the hop that gave it the file (or its last failed one), all hops in order,
    and the bytes the controller itself sent."""

    done: dict[str, Hop] = field(default_factory=dict)
    failed: dict[str, Hop] = field(default_factory=dict)
    hops: list[Hop] = field(default_factory=list)
    controller_bytes: int = 0


def new_key(mark: str) -> tuple[bytes, str]:
    """A fresh ed25519 key: (the private half in OpenSSH's format, the public line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, f"{public.decode()} tensorless-relay-{mark}"


def authorized_line(public: str, source: str, command: str) -> str:
    """The receiver's authorized_keys line for one hop: nothing but command, from source."""
    quoted = command.replace("\\", "\\\\").replace('"', '\\"')
    return f'restrict,from="{source}",command="{quoted}" {public}'


def known_line(transport: Any) -> tuple[str, int, str, str]:
    """(address, port, login user, known_hosts line) of a host as the controller reaches it:
    the host key is the one the controller's connection verified."""
    addr, port = transport.getpeername()[:2]
    key = transport.get_remote_server_key()
    name = addr if port == 22 else f"[{addr}]:{port}"
    return addr, port, transport.get_username(), f"{name} {key.get_name()} {key.get_base64()}"


def run_channel(
    transport: Any, command: str, stdin: bytes = b"", timeout: float | None = None
) -> Any:
    """command on its own channel: (exit status, stdout, stderr), stdin written and closed."""
    channel = transport.open_session()
    try:
        channel.settimeout(timeout)
        channel.exec_command(command)
        if stdin:
            channel.sendall(stdin)
        channel.shutdown_write()
        out = channel.makefile("rb").read().decode(errors="replace")
        err = channel.makefile_stderr("rb").read().decode(errors="replace")
        return channel.recv_exit_status(), out, err
    finally:
        channel.close()


def _script(state: Any, host: Any, which: str, **params: str | int) -> str:
    from tensorless_deploy.operations._run import script

    return host_command(state, host, script(which, **params))


def _short(text: str) -> str:
    return " ".join(text.split())[-300:]


class Relay:
    """One file to many hosts, the hops scheduled as holders become free (see the module)."""

    def __init__(self, state: Any, by_name: dict[str, Any], copy: Copy) -> None:
        self.state, self.by_name, self.copy = state, by_name, copy
        self.run = secrets.token_hex(6)
        self.count = 0
        self.touched: set[str] = set()
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ one hop
    def _hop_dir(self) -> tuple[str, str]:
        with self.lock:
            self.count += 1
            mark = f"{self.run}-{self.count}"
        return mark, posixpath.join(RELAY_ROOT, mark)

    def from_controller(self, receiver: str) -> Hop:
        host = self.by_name[receiver]
        r = Receiver(receiver, host, self.copy.remote[receiver])
        lock = self.copy.locks.get(receiver, "")
        send_one(
            self.copy.controller_file(),
            r,
            receive_command(self.state, host, r.path, self.copy.size, lock),
        )
        hop = Hop(CONTROLLER, receiver, sent=r.sent, offset=r.offset, seconds=r.seconds)
        with self.lock:
            self.touched.add(receiver)
        if r.error:
            hop.kind, hop.error = "cut", r.error.partition(": ")[2] or r.error
            return hop
        return self._judge(hop, "\n".join(r.said))

    def between(self, sender: str, receiver: str) -> Hop:
        t0 = time.monotonic()
        hop = Hop(sender, receiver)
        with self.lock:
            self.touched.update((sender, receiver))
        try:
            said = self._between(hop)
        except (OSError, EOFError) as exc:
            hop.kind, hop.error = "cut", f"the connection stopped: {exc}"
            return hop
        finally:
            hop.seconds = time.monotonic() - t0
        return hop if said is None else self._judge(hop, said)

    def _between(self, hop: Hop) -> str | None:
        src, dst = self.by_name[hop.sender], self.by_name[hop.receiver]
        s_t, r_t = ssh_transport(src), ssh_transport(dst)
        if s_t is None or r_t is None or not (s_t.is_active() and r_t.is_active()):
            hop.kind, hop.error = "cut", "a relay needs both hosts connected over SSH"
            return None
        addr, port, user, known = known_line(r_t)
        code, out, err = run_channel(
            s_t, f"ip -o route get {shlex.quote(addr)}", timeout=HOP_TIMEOUT_S
        )
        found = re.search(r"\bsrc (\S+)", out)
        if code != 0 or found is None:
            hop.kind = "cut"
            hop.error = f"{hop.sender} has no route to {addr}: {_short(err or out)}"
            return None
        mark, where = self._hop_dir()
        private, public = new_key(mark)
        receive = receive_command(
            self.state,
            dst,
            self.copy.remote[hop.receiver],
            self.copy.size,
            self.copy.locks.get(hop.receiver, ""),
        )
        forced = host_command(self.state, dst, f"sh {shlex.quote(where)}/receive.sh")
        line = authorized_line(public, found.group(1), forced)
        grant = _script(self.state, dst, "relay-grant", dir=where, line=line)
        code, out, err = run_channel(r_t, grant, receive.encode(), timeout=HOP_TIMEOUT_S)
        if code != 0:
            hop.kind, hop.error = "cut", f"access not granted on {hop.receiver}: {_short(err)}"
            return None
        file, stamp = self.copy.source_of(hop.sender)
        try:
            send = _script(
                self.state,
                src,
                "relay-send",
                dir=where,
                file=file,
                stamp=stamp,
                sha=self.copy.sha256,
                size=self.copy.size,
                addr=addr,
                port=port,
                user=user,
                known=known,
            )
            code, out, err = run_channel(s_t, send, private)
        finally:
            self.revoke(hop.receiver, mark)
        if code == UNVERIFIED:
            hop.kind, hop.error = "unverified", _short(err)
            return None
        if code != 0:
            hop.kind, hop.error = "cut", _short(err) or f"exit {code}"
            return None
        return str(out)

    def _judge(self, hop: Hop, said: str) -> Hop:
        """The receiver's own word on what it hashed: the expected sha256, or refused."""
        found = RECEIVED.search(said)
        if found is None:
            hop.kind, hop.error = "cut", f"the receiver said nothing of a hash: {_short(said)}"
            return hop
        hop.sent, hop.offset = int(found.group(1)), int(found.group(2))
        if found.group(3) != self.copy.sha256:
            hop.error = (
                f"{hop.receiver} hashed sha256 {found.group(3)}, not {self.copy.sha256}: "
                "refused and deleted there"
            )
            self.forget(hop.receiver)
            if hop.offset:  # the receiver's own prefix may be the wrong part: once more, whole
                hop.kind = "cut"
            else:
                hop.kind = "wrong"
                if hop.sender != CONTROLLER:
                    hop.error += f"; {hop.sender}'s copy is not used again"
                    self.forget(hop.sender)
        return hop

    def forget(self, name: str) -> None:
        """A copy that hashed wrong: the partial and its record deleted (a sender's own arrival
        then hashes the file again, and refuses it). A host's own blob is never deleted here:
        the sender is only not used again (its next deploy verifies it again)."""
        if name in self.copy.held:
            return
        transport = ssh_transport(self.by_name[name])
        if transport is None or not transport.is_active():
            return
        p = shlex.quote(self.copy.remote[name])
        run_channel(
            transport, host_command(self.state, self.by_name[name], f"rm -f {p} {p}.sha256")
        )

    def revoke(self, name: str, pattern: str) -> str:
        """The run's access (hops matching pattern) taken away on one host; '' or why not."""
        transport = ssh_transport(self.by_name[name])
        if transport is None or not transport.is_active():
            return f"{name}: not connected, its relay access could not be checked"
        cmd = _script(
            self.state, self.by_name[name], "relay-revoke", root=RELAY_ROOT, pattern=pattern
        )
        try:
            code, _, err = run_channel(transport, cmd, timeout=HOP_TIMEOUT_S)
        except (OSError, EOFError) as exc:
            return f"{name}: its relay access could not be revoked: {exc}"
        return "" if code == 0 else f"{name}: its relay access could not be revoked: {_short(err)}"

    def sweep(self) -> list[str]:
        """Every host the run touched: the run's hops revoked (what could not be, said)."""
        return [why for n in sorted(self.touched) if (why := self.revoke(n, f"{self.run}-*"))]


def relay(
    state: Any,
    by_name: dict[str, Any],
    copy: Copy,
    receivers: Sequence[str],
    holders: Sequence[str] = (),
    progress: Progress | None = None,
) -> RelayReport:
    """copy to every receiver: from the controller while no host holds it verified, then from
    host to host (holders: hosts that already hold it verified, at copy.remote or, for those of
    copy.held, in their own cache; with one, the controller sends nothing)."""
    relay_ = Relay(state, by_name, copy)
    report = RelayReport()
    try:
        _schedule(relay_, report, list(receivers), list(holders), progress)
    finally:
        left = relay_.sweep()
    for why in left:  # access that could not be taken away fails the run's hosts loudly
        name = why.partition(":")[0]
        report.failed.setdefault(name, Hop(CONTROLLER, name, "cut", error=why))
        report.done.pop(name, None)
    return report


def _schedule(
    relay_: Relay,
    report: RelayReport,
    pending_: list[str],
    holders: list[str],
    progress: Progress | None,
) -> None:
    pending = deque(pending_)
    free = deque(holders)  # holders not sending now
    trusted = set(holders)
    running = 0
    tries: dict[str, int] = {}
    ended: queue.Queue[Hop] = queue.Queue()

    def start(sender: str, receiver: str) -> None:
        def hop() -> None:
            done = (
                relay_.from_controller(receiver)
                if sender == CONTROLLER
                else relay_.between(sender, receiver)
            )
            ended.put(done)

        threading.Thread(target=hop, daemon=True).start()

    while pending or running:
        while pending and free:
            start(free.popleft(), pending.popleft())
            running += 1
        if pending and not trusted and not running:
            start(CONTROLLER, pending.popleft())
            running += 1
        if not running:
            break
        hop = ended.get()
        running -= 1
        report.hops.append(hop)
        if hop.sender == CONTROLLER:
            report.controller_bytes += hop.sent
        _ended(hop, report, pending, free, trusted, tries)
        if progress is not None and hop.kind == "ok":
            progress(hop.receiver, f"relay {relay_.copy.what}", relay_.copy.size, relay_.copy.size)


def _ended(
    hop: Hop,
    report: RelayReport,
    pending: deque[str],
    free: deque[str],
    trusted: set[str],
    tries: dict[str, int],
) -> None:
    """What a hop's end changes: a new holder, a sender no longer trusted, a receiver to try
    again (first in line, from where it stopped) or, after ATTEMPTS, failed."""
    sender_ok = hop.sender != CONTROLLER and hop.kind not in ("wrong", "unverified")
    if sender_ok and hop.sender in trusted:
        free.append(hop.sender)
    elif hop.sender in trusted:
        trusted.discard(hop.sender)
    if hop.kind == "ok":
        report.done[hop.receiver] = hop
        report.failed.pop(hop.receiver, None)
        trusted.add(hop.receiver)
        free.append(hop.receiver)
        return
    tries[hop.receiver] = tries.get(hop.receiver, 0) + 1
    report.failed[hop.receiver] = hop
    if tries[hop.receiver] < ATTEMPTS:
        pending.appendleft(hop.receiver)
