"""Reaching many hosts at once: pyinfra's state, connections and fact reads fanned out over its
own pool (so its parallel limit holds); an unreachable host becomes one error text, and the
others still report.

Every host step has a deadline, the host's ``host_timeout`` (``--host-timeout``, inventory
``tensorless_host_timeout``, default ``DEFAULT_HOST_TIMEOUT_S``): the SSH session must be up
within it, and while the run holds the connection the host must answer an SSH keepalive
within it, whatever the step (a fact, an operation, a push). A host that does not is
``unreachable``, named with the step it was in; its connection is closed, so whatever waited on
it returns, and every other host goes on on its own schedule (``fleet.runner.run_hosts``: each
host runs its operations in its own order, never waiting for another host's).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from tensorless_deploy.decisions.checks import access_check, check_line, survey_access_check
from tensorless_deploy.decisions.options import Flags, resolve_one
from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.facts.values import HostFacts
from tensorless_deploy.fleet.channel import executor_arguments, ssh_transport
from tensorless_deploy.fleet.inventory import host_data, options_for
from tensorless_deploy.fleet.lock import (
    CANNOT_LOCK,
    HostLock,
    LockHeld,
    heartbeat_every,
    lock_host,
)
from tensorless_deploy.gguf.sizing import Sizings
from tensorless_deploy.hostplan.plan import SurveyedHost
from tensorless_deploy.recipe.catalog import Entry

CONNECT_TIMEOUT_S = 10  # the TCP connect alone (within the host's deadline for the session)
CANNOT_CONNECT = "cannot connect"  # how every connection error's text starts
UNREACHABLE = "unreachable"  # how a host's text starts that passed its deadline (Unreachable)
T = TypeVar("T")
# What on_each_host makes sure of before a host's job: "sudo": where the inventory asks for sudo,
# that it works without a password (never a prompt); "root": besides, on a host without sudo,
# that the SSH user is root (for a job that needs root and reads no survey); "checked": nothing
# (an earlier call of the same run did).
AccessNeed = Literal["sudo", "root", "checked"]


class AccessError(TensorlessError):
    """The host's commands would not run as root: access.root, one line with its fix."""


def wants_sudo(host: Any) -> bool:
    """The inventory asks pyinfra to run this host's commands under sudo, with no password of
    its own to give sudo (with _sudo_password pyinfra answers sudo itself)."""
    return bool(host.data.get("_sudo")) and not host.data.get("_sudo_password")


def login_refusal(host: Any, need: AccessNeed) -> str | None:
    """Before any command runs under sudo on the host: why its commands would not run as root
    (access.root as one line), or None. One command, never under sudo; none where nothing is
    asked (a host without sudo whose job reads the survey's own access section)."""
    from tensorless_deploy.facts.pyinfra import HostLogin

    sudo = wants_sudo(host)
    if need == "checked" or (need == "sudo" and not sudo):
        return None
    login = HostLogin.typed(host.get_fact(HostLogin, sudo=sudo, _sudo=False))
    check = access_check(login.access, login.sudo)
    return None if check.status == "ok" else Refused(check_line(check))


def require_root(facts: HostFacts) -> None:
    """A job that needs root and read the survey: stop here (AccessError) unless the survey's
    commands ran as root."""
    check = survey_access_check(facts)
    if check is not None and check.status != "ok":
        raise AccessError(check_line(check))


class Refused(str):
    """The error text of a host refused before anything ran on it: its commands would not run
    as root (access.root, one line with its fix)."""


class Unreachable(str):
    """The error text of a host that passed its deadline: what it was doing, for how long."""


@dataclass
class Watch:
    """One host while the run holds its connection: its deadline, the step it is in, and why
    it was given up (None: it answers)."""

    host: str
    deadline: int
    step: str = "connect"
    lost: Unreachable | None = None
    greenlet: Any = None
    answered: float = 0.0  # when the host last answered a keepalive (time.monotonic)


@dataclass
class Fleet:
    """What a run keeps per host beside pyinfra's state: the flags the deadlines come from,
    the command to lock hosts for (None: a read-only run takes no lock), each host's watch and
    lock."""

    flags: Flags = field(default_factory=Flags)
    lock: str | None = None
    watches: dict[str, Watch] = field(default_factory=dict)
    locks: dict[str, HostLock] = field(default_factory=dict)


def fleet_of(state: Any) -> Fleet:
    fleet: Fleet | None = getattr(state, "tensorless", None)
    if fleet is None:
        fleet = Fleet()
        state.tensorless = fleet
    return fleet


def new_state(inventory: Any, flags: Flags | None = None, *, lock: str | None = None) -> Any:
    """pyinfra's state for one run over inventory. With lock (what the run does, e.g. "deploy
    pn3"), every host it connects is locked for it first (fleet.lock)."""
    from pyinfra.api.config import Config
    from pyinfra.api.state import State

    # pyinfra logs every connection and command; our own output says what matters.
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
    _quiet_interrupt()
    # a host's operation order lives on the Host (pyinfra appends to it for every operation
    # added): a new run starts it afresh, or an earlier run's operations (a --serial batch
    # with more instances) would be looked up in this state, which never had them
    for host in inventory:
        host.op_hash_order = []
    state: Any = State(inventory, Config(CONNECT_TIMEOUT=CONNECT_TIMEOUT_S))
    state.tensorless = Fleet(flags or Flags(), lock)
    return state


def _quiet_interrupt() -> None:
    """Ctrl-C is one line: gevent's hub (or a greenlet of pyinfra's, or a push writer, or a
    stream of logs) would print a KeyboardInterrupt it catches before passing it to the main
    greenlet, where the CLI says "interrupted"; it still passes it on, now without the
    traceback. So is a closed pipe, which ends every stream: the CLI stops quietly."""
    import gevent

    hub = gevent.get_hub()
    quiet = tuple(e for e in (KeyboardInterrupt, BrokenPipeError) if e not in hub.NOT_ERROR)
    hub.NOT_ERROR = (*hub.NOT_ERROR, *quiet)


def host_timeout(fleet: Fleet, host: Any) -> int:
    """The host's deadline in seconds (flag, else inventory data, else the default)."""
    value: int = resolve_one("host_timeout", fleet.flags, host_data(host), host.name)
    return value


def _connect(state: Any, host: Any) -> str | None:
    import gevent
    from pyinfra.api.exceptions import PyinfraError

    fleet = fleet_of(state)
    watch = fleet.watches.get(host.name)
    if watch is not None and watch.lost is not None:
        return watch.lost
    if host.connected:
        return None
    watch = Watch(host.name, host_timeout(fleet, host))
    fleet.watches[host.name] = watch
    try:
        with gevent.Timeout(watch.deadline):
            host.connect(show_errors=False, raise_exceptions=True)
    except gevent.Timeout:
        _close(host)
        watch.lost = Unreachable(
            f"{UNREACHABLE}: no SSH session within {watch.deadline} s (connect; "
            f"--host-timeout or tensorless_host_timeout sets it)"
        )
        return watch.lost
    except (PyinfraError, OSError) as exc:  # ConnectError, and a missing key file
        return connect_problem(exc, host)
    watch.greenlet = gevent.spawn(_keepalive, host, watch)
    return None


def _keepalive(host: Any, watch: Watch) -> None:
    """While the connection is up: an SSH keepalive every few seconds, each to be answered
    within the deadline; one that is not gives the host up and closes its connection."""
    import gevent

    transport = ssh_transport(host)
    if transport is None:
        return  # @local: nothing between this machine and itself
    every = heartbeat_every(watch.deadline)
    while transport.is_active():
        gevent.sleep(every)
        try:
            with gevent.Timeout(watch.deadline):
                transport.global_request("keepalive@openssh.com", wait=True)
            if transport.is_active():
                watch.answered = time.monotonic()
        except gevent.Timeout:
            watch.lost = Unreachable(
                f"{UNREACHABLE}: no answer over SSH for {watch.deadline} s, during {watch.step} "
                "(--host-timeout or tensorless_host_timeout sets the deadline)"
            )
            transport.close()
            return
        except (OSError, EOFError):
            return


def still_there(state: Any, host: Any) -> bool:
    """After a host's step failed: does the host still answer? A cut link can show first as a
    failed step, not a silent one: the host lets the run go when the controller's heartbeat
    stops (its lock, and the download that lock guards, end) and says so over a link that may
    still carry what the host sends. So wait for the host's next keepalive answer, asked after
    the failure, before calling the failure the host's own: False (the host is given up as
    unreachable, named with its step) when none comes within its deadline. A live host answers
    within a heartbeat; only a host that is gone costs its deadline."""
    import gevent

    watch = fleet_of(state).watches.get(host.name)
    if watch is None or watch.greenlet is None:
        return True  # @local, or never connected: nothing to ask
    failed_at = time.monotonic()
    give_up = failed_at + heartbeat_every(watch.deadline) + watch.deadline + 1
    while watch.lost is None and watch.answered <= failed_at:
        if watch.greenlet.dead or time.monotonic() > give_up:
            return True  # the connection ended otherwise: the failure says what happened
        gevent.sleep(0.1)
    return watch.lost is None


def lost(state: Any, name: str) -> Unreachable | None:
    """Why the host was given up during this run (None: it was not)."""
    watch = fleet_of(state).watches.get(name)
    return watch.lost if watch is not None else None


def in_step(state: Any, host: Any, step: str) -> None:
    """Say which step the host is in: an unreachable host's report names it."""
    watch = fleet_of(state).watches.get(host.name)
    if watch is not None:
        watch.step = step


def on_each_host(
    state: Any,
    hosts: Sequence[Any],
    job: Callable[[Any], T],
    *,
    keep_connected: bool = False,
    access: AccessNeed = "sudo",
    step: str = "reading facts",
) -> list[T | str]:
    """Connect to every host (and lock it, in a run that changes hosts) and run job(host) on
    each, in parallel on pyinfra's own pool (its PARALLEL limit holds). A host that cannot be
    reached or locked, whose facts cannot be read, whose commands would not run as root
    (``access``: what is checked first, before the lock; see AccessNeed), or that passes its
    deadline, gives the error text instead of a result."""
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.context import ctx_host, ctx_state

    fleet = fleet_of(state)

    def one(host: Any) -> T | str:
        error = _connect(state, host)
        if error is not None:
            return error
        state.activate_host(host)  # operations run only on activated hosts
        try:
            with ctx_state.use(state), ctx_host.use(host):
                # access.root before anything runs under sudo, the lock's command among them
                refused = login_refusal(host, access)
                if refused is not None:
                    return refused
                if fleet.lock is not None and host.name not in fleet.locks:
                    in_step(state, host, "taking the host's lock")
                    watch = fleet.watches[host.name]
                    got = lock_host(
                        state,
                        host,
                        fleet.lock,
                        wait=resolve_one("wait_lock", fleet.flags, host_data(host), host.name),
                        deadline=watch.deadline,
                    )
                    if isinstance(got, LockHeld):
                        # the lock is root's: one that could not be taken at all, on a host
                        # without sudo, is first asked whether its commands run as root (one
                        # more command, only on this way out; a converged run costs none)
                        if got.startswith(CANNOT_LOCK) and access == "sudo":
                            why = login_refusal(host, "root")
                            if why is not None:
                                return why
                        return watch.lost or got
                    fleet.locks[host.name] = got
                in_step(state, host, step)
                result: T | str = job(host)
        except PyinfraError as exc:
            result = f"cannot read facts: {exc}"
        except TensorlessError as exc:
            result = exc.lines()[0]
        except (OSError, EOFError) as exc:
            result = f"the connection failed: {exc}"
        return lost(state, host.name) or result

    with ctx_state.use(state):
        jobs = [state.pool.spawn(one, h) for h in hosts]
        state.pool.join()
    try:
        return [j.get() for j in jobs]
    finally:
        if not keep_connected:
            disconnect(hosts)


def survey_hosts(
    state: Any,
    hosts: Sequence[Any],
    flags: Flags,
    *,
    local: bool = False,
    keep_connected: bool = False,
    images: Sequence[str] = (),
) -> list[SurveyedHost]:
    """Each host's options (validated before any connection) and facts, read in one round trip
    per host, all hosts in parallel; nothing is changed. With keep_connected, the connections
    stay open for the operations that follow. images: the GPU engine images the plans will
    judge (engine.code): each is read once from its registry here for the hosts that do not
    hold it (fleet.registry), before any host pulls it."""
    from tensorless_deploy.facts.pyinfra import HostSurvey

    options = {h.name: options_for(h, flags, local=local) for h in hosts}
    fleet_of(state).flags = flags  # the run's flags: each host's deadline among them

    def survey(host: Any) -> HostFacts | None:
        plain = host.get_fact(HostSurvey, models_dir=options[host.name].models_dir)
        return None if plain is None else HostSurvey.typed(plain)

    results = on_each_host(state, hosts, survey, keep_connected=keep_connected, step="the survey")
    results = with_engine_images(results, images)
    out = []
    for host, r in zip(hosts, results, strict=True):
        opts = options[host.name]
        if isinstance(r, str):
            out.append(SurveyedHost(host.name, opts, None, r))
        elif r is None:
            out.append(SurveyedHost(host.name, opts, None, "cannot read facts"))
        else:
            out.append(SurveyedHost(host.name, opts, r))
    return out


def survey_and_size(
    state: Any,
    hosts: Sequence[Any],
    flags: Flags,
    entries: Sequence[Entry],
    *,
    local: bool = False,
    keep_connected: bool = False,
) -> tuple[list[SurveyedHost], Sizings]:
    """survey_hosts, and at the same time the memory sizing of every recipe in entries from its
    GGUF header (HTTP Range through the per-commit cache): what the host plan judges each card's
    memory by, so that doctor, plan and deploy refuse the same cards with the same numbers."""
    from concurrent.futures import ThreadPoolExecutor

    from tensorless_deploy.gguf.sizing import read_sizings

    if not entries:
        return survey_hosts(state, hosts, flags, local=local, keep_connected=keep_connected), {}
    pairs = [(e.path, e.recipe) for e in dict((e.path, e) for e in entries).values()]
    images = gpu_images(entries)  # engine.code: what the registry says of images a host lacks
    with ThreadPoolExecutor(1) as pool:  # headers over HTTP while SSH surveys the hosts
        pending = pool.submit(read_sizings, pairs)
        surveyed = survey_hosts(
            state, hosts, flags, local=local, keep_connected=keep_connected, images=images
        )
        return surveyed, pending.result()


def gpu_images(entries: Sequence[Entry]) -> list[str]:
    """The engine images of these recipes whose device code engine.code judges (not the CPU
    engines, which have none)."""
    return list(
        dict.fromkeys(e.recipe.engine.image for e in entries if e.recipe.engine.arch != "cpu")
    )


def with_engine_images(
    results: Sequence[HostFacts | str | None], images: Sequence[str]
) -> list[HostFacts | str | None]:
    """Each surveyed host's facts with what the registry says of the images it does not hold
    (read once per image, only when some host lacks it)."""
    from tensorless_deploy.fleet.registry import read_engine_image

    read: dict[str, Any] = {}
    out: list[HostFacts | str | None] = []
    for r in results:
        if not isinstance(r, HostFacts) or not images:
            out.append(r)
            continue
        known = dict(r.engine_images or {})
        for image in dict.fromkeys(images):
            held = r.engine_image(image)
            if held is not None and held.labels is not None:
                continue
            if image not in read:
                read[image] = read_engine_image(image)
            known[image] = read[image]
        out.append(r.model_copy(update={"engine_images": known}))
    return out


def disconnect(hosts: Sequence[Any]) -> None:
    """Let go of every host: its lock first (the holder sees EOF), then its keepalive and its
    connection (pyinfra's own disconnect leaves the SSH client open)."""
    for host in hosts:
        state = getattr(host, "state", None)
        fleet = getattr(state, "tensorless", None)
        if fleet is not None:
            held = fleet.locks.pop(host.name, None)
            if held is not None:
                held.release()
            watch = fleet.watches.pop(host.name, None)
            if watch is not None and watch.greenlet is not None:
                watch.greenlet.kill(block=False)
        if host.connected:
            host.disconnect()
            _close(host)


def _close(host: Any) -> None:
    client = getattr(getattr(host, "connector", None), "client", None)
    if client is not None:
        with contextlib.suppress(OSError, EOFError):
            client.close()


def host_fact(state: Any, host: Any, fact: Any, **kwargs: Any) -> Any:
    """One fact from one connected host, outside of any operation."""
    from pyinfra.context import ctx_host, ctx_state

    with ctx_state.use(state), ctx_host.use(host):
        return host.get_fact(fact, **kwargs)


def run_script(
    state: Any, host: Any, package: str, script: str, timeout: float, /, **params: str | int
) -> tuple[bool, list[str], list[str]]:
    """``<package>/scripts/<name>.sh`` with its parameters bound, run on one connected host as
    pyinfra runs its commands there: (exit status 0, stdout lines, stderr lines)."""
    import shlex

    from pyinfra.api.command import StringCommand
    from pyinfra.api.exceptions import PyinfraError

    from tensorless_deploy import shell

    text = shell.program(package, script, **params)
    command = StringCommand("sh -c " + shlex.quote(text))
    try:
        ok, output = host.run_shell_command(
            command, _timeout=timeout, **executor_arguments(state, host)
        )
    except (PyinfraError, OSError) as exc:  # a timeout, a connection gone
        return False, [], [f"{script}: {exc}"]
    return bool(ok), list(output.stdout_lines), list(output.stderr_lines)


def loopback(host: Any, bind: str, port: int) -> Callable[[], Any]:
    """Opens an SSH direct-tcpip channel to bind:port as the connected host itself sees it
    (its own loopback): an API that never listens beyond 127.0.0.1, reached from here."""
    transport = ssh_transport(host)

    def channel() -> Any:
        return transport.open_channel("direct-tcpip", (bind, port), ("127.0.0.1", 0), timeout=10)

    return channel


def connect_problem(exc: BaseException, host: Any) -> str:
    """An SSH failure as one line with its fix. pyinfra's ConnectError carries only text (a
    fresh controller without ~/.ssh/known_hosts read "[Errno 2] No such file or directory"),
    so the cause it was raised from is asked first, then the text."""
    import errno
    import os
    import shlex
    import socket

    from paramiko.ssh_exception import AuthenticationException, NoValidConnectionsError

    data = host.data
    where = f"{data.get('ssh_hostname') or host.name}:{data.get('ssh_port') or 22}"
    text = str(exc.args[0] if exc.args else exc)
    cause = exc.__cause__ or exc.__context__ or exc
    known = data.get("ssh_known_hosts_file")
    if isinstance(cause, FileNotFoundError) and str(cause.filename).endswith("known_hosts"):
        made = shlex.quote(str(cause.filename))
        return (
            f"cannot connect: no known_hosts file {cause.filename} (fix: create it, "
            f"mkdir -p {shlex.quote(os.path.dirname(str(cause.filename)))} && touch {made}, "
            "and pyinfra records each new host's key on first contact; or name another with "
            "ssh_known_hosts_file in the inventory)"
        )
    if isinstance(cause, (NoValidConnectionsError, socket.timeout)):
        codes = {getattr(e, "errno", None) for e in getattr(cause, "errors", {}).values()}
        why = (
            "connection refused: no sshd listens there"
            if errno.ECONNREFUSED in codes
            else "no route to the host"
            if errno.EHOSTUNREACH in codes
            else "no answer"
        )
        return (
            f"cannot connect: nothing answers SSH at {where} ({why}) (fix: check that the host "
            "is up and reachable from here, and its ssh_hostname and ssh_port in the inventory)"
        )
    if isinstance(cause, socket.gaierror):
        return (
            f"cannot connect: {data.get('ssh_hostname') or host.name} does not resolve "
            "(fix: correct ssh_hostname in the inventory, or its DNS entry)"
        )
    if isinstance(cause, AuthenticationException):
        user = data.get("ssh_user") or "the default user"
        key = data.get("ssh_key") or "the agent's keys"
        return (
            f"cannot connect: {where} refused the login as {user} with {key} (fix: authorize "
            "that key for that user on the host, e.g. ssh-copy-id, or correct ssh_user and "
            "ssh_key in the inventory)"
        )
    if "No authentication methods available" in text:
        return (
            f"cannot connect: no SSH key to log in to {where} with (fix: set ssh_key in the "
            "inventory, or load a key into the agent: ssh-add)"
        )
    if text.startswith("No such private key file"):
        return f"cannot connect: {text} (fix: correct ssh_key in the inventory)"
    if "does not match" in text:
        return (
            f"cannot connect: {where}: {text} (fix: if the host was reinstalled, remove the old "
            f"key with ssh-keygen -R {data.get('ssh_hostname') or host.name}"
            f"{' -f ' + shlex.quote(str(known)) if known else ''}; otherwise do not "
            "connect: something may be in between)"
        )
    if "No host key for" in text:
        return (
            f"cannot connect: {where}: its key is not in known_hosts and host key checking is "
            "strict (fix: check its fingerprint and record it: ssh to it once, or add it to "
            "the ssh_known_hosts_file the inventory names)"
        )
    return f"cannot connect: {text}"
