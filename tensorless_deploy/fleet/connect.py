"""Reaching many hosts at once: pyinfra's state, connections and fact reads fanned out over its
own pool (so its parallel limit holds); an unreachable host becomes one error text, and the
others still report."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.facts.values import HostFacts
from tensorless_deploy.fleet.inventory import options_for
from tensorless_deploy.gguf.sizing import Sizings
from tensorless_deploy.hostplan.plan import SurveyedHost
from tensorless_deploy.recipe.catalog import Entry

CONNECT_TIMEOUT_S = 10
T = TypeVar("T")


def new_state(inventory: Any) -> Any:
    from pyinfra.api.config import Config
    from pyinfra.api.state import State

    # pyinfra logs every connection and command; our own output says what matters.
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
    # A host keeps the order of the operations added to it (op_hash_order) across states: a
    # second state on the same inventory (maintain end's phases, a roll's next batch) would
    # order its operations by the previous state's, which it does not know (KeyError).
    for host in inventory:
        host.op_hash_order = []
    return State(inventory, Config(CONNECT_TIMEOUT=CONNECT_TIMEOUT_S))


def _connect(host: Any) -> str | None:
    from pyinfra.api.exceptions import PyinfraError

    try:
        host.connect(show_errors=False, raise_exceptions=True)
    except (PyinfraError, OSError) as exc:  # ConnectError, and a missing key file
        return connect_problem(exc, host)
    return None


def on_each_host(
    state: Any, hosts: Sequence[Any], job: Callable[[Any], T], *, keep_connected: bool = False
) -> list[T | str]:
    """Connect to every host and run job(host) on each, in parallel on pyinfra's own pool (its
    PARALLEL limit holds). A host that cannot be reached, or whose facts cannot be read, gives
    the error text instead of a result."""
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.context import ctx_host, ctx_state

    def one(host: Any) -> T | str:
        error = _connect(host)
        if error is not None:
            return error
        state.activate_host(host)  # operations run only on activated hosts
        try:
            with ctx_state.use(state), ctx_host.use(host):
                return job(host)
        except PyinfraError as exc:
            return f"cannot read facts: {exc}"
        except TensorlessError as exc:
            return exc.lines()[0]

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

    def survey(host: Any) -> HostFacts | None:
        plain = host.get_fact(HostSurvey, models_dir=options[host.name].models_dir)
        return None if plain is None else HostSurvey.typed(plain)

    results = on_each_host(state, hosts, survey, keep_connected=keep_connected)
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
    for host in hosts:
        if host.connected:
            host.disconnect()


def host_fact(state: Any, host: Any, fact: Any, **kwargs: Any) -> Any:
    """One fact from one connected host, outside of any operation."""
    from pyinfra.context import ctx_host, ctx_state

    with ctx_state.use(state), ctx_host.use(host):
        return host.get_fact(fact, **kwargs)


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


def run_script(
    state: Any, host: Any, package: str, script: str, timeout: float, /, **params: str | int
) -> tuple[bool, list[str], list[str]]:
    """``<package>/scripts/<name>.sh`` with its parameters bound, run on one connected host as
    pyinfra runs its commands there: (exit status 0, stdout lines, stderr lines)."""
    import shlex

    from pyinfra.api.command import StringCommand
    from pyinfra.api.exceptions import PyinfraError

    from tensorless_deploy import shell

    text = shell.bind(shell.load(package, script), **params)
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
    transport = host.connector.client.get_transport()

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
