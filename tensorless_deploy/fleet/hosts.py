"""Layer 5 (effects): inventories, per-host settings, and reading facts from many hosts at once.

pyinfra does the fan-out: every host is connected and surveyed in parallel, an unreachable host
becomes one outcome with its SSH error, and the others still report.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tensorless_deploy.decisions.checks import EngineChoice, Options
from tensorless_deploy.errors import TensorlessError, UsageError
from tensorless_deploy.facts.values import HostFacts

# Host data keys an inventory may set for tensorless-deploy (documented in
# inventories/example.py); everything else in host data belongs to pyinfra and its connectors.
DATA_PORT = "tensorless_port"
DATA_BIND = "tensorless_bind"
DATA_MODELS_DIR = "tensorless_models_dir"
DATA_ENGINE = "tensorless_engine"
DATA_GPUS = "tensorless_gpus"  # offline planning: the GPUs as nvidia-smi would list them
CONNECT_TIMEOUT_S = 10
T = TypeVar("T")


class InventoryError(TensorlessError):
    """An inventory that cannot be read, or host data of the wrong shape."""


@dataclass(frozen=True)
class HostOutcome:
    """One host after the survey: its settings, and its facts or why there are none."""

    name: str
    options: Options
    facts: HostFacts | None
    error: str | None = None
    data: Any = None  # the host's pyinfra data, for offline planning


def is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return "%" not in text


def options_for(name: str, data: Any, base: Options) -> Options:
    """Per-host settings from host data, falling back to the command line's."""

    def get(key: str, default: Any) -> Any:
        value = getattr(data, key, None) if data is not None else None
        return default if value is None else value

    port = get(DATA_PORT, base.port)
    bind = get(DATA_BIND, base.bind)
    models_dir = get(DATA_MODELS_DIR, base.models_dir)
    engine = get(DATA_ENGINE, base.engine)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise InventoryError(f"{name}: {DATA_PORT}: must be a port number 1-65535 ({port!r})")
    if not isinstance(bind, str) or not is_ip_address(bind):
        raise InventoryError(
            f"{name}: {DATA_BIND}: must be an IP address such as 127.0.0.1 or 0.0.0.0 ({bind!r})"
        )
    if not isinstance(models_dir, str) or not re.fullmatch(r"/[A-Za-z0-9._/+-]*", models_dir):
        raise InventoryError(
            f"{name}: {DATA_MODELS_DIR}: must be an absolute path of letters, digits and "
            f". _ / + - ({models_dir!r})"
        )
    if engine not in ("auto", "podman", "docker"):
        raise InventoryError(f"{name}: {DATA_ENGINE}: must be podman, docker or auto ({engine!r})")
    chosen: EngineChoice = engine
    return Options(
        port=port,
        bind=bind,
        models_dir=models_dir,
        engine=chosen,
        allow_draft=base.allow_draft,
        local=base.local,
    )


def load_inventory(path: str | None, local: bool) -> Any:
    """A pyinfra Inventory from a file (or host list), or this machine alone (@local)."""
    from pyinfra.api.inventory import Inventory

    if local:
        return Inventory((["@local"], {}))
    if path is None:
        raise UsageError("say which hosts: -i INVENTORY or --local")
    if not Path(path).exists() and "," not in path and "@" not in path:
        raise UsageError(f"{path}: no such inventory file", fix="pass -i FILE.py or --local")
    from click import ClickException
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    # pyinfra executes inventory files inside a state context, as its own CLI does.
    try:
        with ctx_state.use(State(check_for_changes=False)):
            inventory = make_inventory(path)
        if not list(inventory):
            raise InventoryError(
                f"{path}: no hosts (a group is a module-level list of names or (name, data) "
                "tuples; see inventories/example.py)"
            )
        return inventory
    except ClickException as exc:
        # An inventory is the operator's own Python: whatever it raised is reported as theirs.
        cause = getattr(exc, "exception", None) or exc.__cause__ or exc
        raise InventoryError(
            f"{path}: cannot load the inventory: {type(cause).__name__}: {cause}"
        ) from exc
    except (SyntaxError, ImportError, OSError) as exc:
        raise InventoryError(f"{path}: cannot load the inventory: {exc}") from exc


def select_hosts(inventory: Any, limit: Sequence[str]) -> list[Any]:
    hosts = list(inventory)
    if not limit:
        return hosts
    names = {h.name for h in hosts}
    unknown = [n for n in limit if n not in names]
    if unknown:
        raise UsageError(
            f"--limit {', '.join(unknown)}: not in the inventory "
            f"(hosts: {', '.join(sorted(names))})"
        )
    return [h for h in hosts if h.name in limit]


def new_state(inventory: Any) -> Any:
    from pyinfra.api.config import Config
    from pyinfra.api.state import State

    # pyinfra logs every connection and command; our own output says what matters.
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
    return State(inventory, Config(CONNECT_TIMEOUT=CONNECT_TIMEOUT_S))


def _connect(host: Any) -> str | None:
    from pyinfra.api.exceptions import ConnectError

    try:
        host.connect(show_errors=False, raise_exceptions=True)
    except ConnectError as exc:
        return f"cannot connect: {exc.args[0] if exc.args else exc}"
    except OSError as exc:
        return f"cannot connect: {exc}"
    return None


def on_each_host(
    state: Any, hosts: Sequence[Any], job: Callable[[Any], T], *, keep_connected: bool = False
) -> list[T | str]:
    """Connect to every host and run job(host) on each, all in parallel. A host that cannot be
    reached, or whose facts cannot be read, gives the error text instead of a result."""
    import gevent
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

    with ctx_state.use(state):
        jobs = [gevent.spawn(one, h) for h in hosts]
        gevent.joinall(jobs)
    try:
        return [j.get() for j in jobs]
    finally:
        if not keep_connected:
            disconnect(hosts)


def survey_hosts(
    state: Any,
    hosts: Sequence[Any],
    base: Options,
    *,
    keep_connected: bool = False,
    override: dict[str, Any] | None = None,
) -> list[HostOutcome]:
    """Connect to each host and read its facts, all hosts in parallel; nothing is changed.
    With keep_connected, the connections stay open for operations that follow."""
    from tensorless_deploy.facts.pyinfra import HostSurvey

    options = {
        h.name: dataclasses.replace(options_for(h.name, h.data, base), **(override or {}))
        for h in hosts
    }  # the command line's explicit --port / --bind win over host data

    def survey(host: Any) -> HostFacts | None:
        models_dir = options[host.name].models_dir
        facts: HostFacts | None = host.get_fact(HostSurvey, models_dir=models_dir)
        return facts

    results = on_each_host(state, hosts, survey, keep_connected=keep_connected)
    out = []
    for host, r in zip(hosts, results, strict=True):
        opts = options[host.name]
        if isinstance(r, str):
            out.append(HostOutcome(host.name, opts, None, r, host.data))
        elif r is None:
            out.append(HostOutcome(host.name, opts, None, "cannot read facts", host.data))
        else:
            out.append(HostOutcome(host.name, opts, r, None, host.data))
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
