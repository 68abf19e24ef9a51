"""Inventories: a pyinfra inventory file (or this machine alone), the hosts chosen with --limit,
and each host's options resolved from its data and the command line (decisions.options)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tensorless_deploy.decisions.options import DATA_GPUS, DATA_KEYS, Flags, Options, resolve
from tensorless_deploy.errors import InventoryError, TensorlessError, UsageError
from tensorless_deploy.hostplan.plan import SurveyedHost


def host_data(host: Any) -> dict[str, object]:
    """The tensorless_* keys of a host's inventory data (pyinfra's HostData)."""
    data = host.data
    return {key: data.get(key) for key in DATA_KEYS} if data is not None else {}


def options_for(host: Any, flags: Flags, *, local: bool = False) -> Options:
    """One host's options: the command line, then its inventory data, then the defaults."""
    return resolve(flags, host_data(host), host.name, local=local)


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


def offline_hosts(hosts: Sequence[Any], flags: Flags) -> list[SurveyedHost]:
    """Host facts from inventory data (tensorless_gpus), without connecting."""
    from tensorless_deploy.facts import host_facts_from_inventory

    out = []
    for h in hosts:
        options = options_for(h, flags)
        gpus = h.data.get(DATA_GPUS) if h.data is not None else None
        if gpus is None:
            why = f"--offline: no {DATA_GPUS} in its inventory data (add it, or plan over SSH)"
            out.append(SurveyedHost(h.name, options, None, why))
            continue
        try:
            out.append(SurveyedHost(h.name, options, host_facts_from_inventory({"gpus": gpus})))
        except TensorlessError as exc:
            out.append(SurveyedHost(h.name, options, None, f"{DATA_GPUS}: {exc.message}"))
    return out
