"""status and stop over an inventory: what every host serves (read-only, in parallel), and
taking a model's units down."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tensorless_deploy.decisions.checks import Check
from tensorless_deploy.decisions.options import (
    DEFAULT_BIND,
    Flags,
    Options,
    address,
    api_key,
    reach_host,
)
from tensorless_deploy.errors import UnknownModelError, UsageError
from tensorless_deploy.facts.values import (
    LABEL_BIND,
    LABEL_CARD,
    LABEL_MODEL,
    LABEL_PORT,
    LABEL_TUNED,
    DeployedUnit,
    HostFacts,
)
from tensorless_deploy.fleet.connect import (
    CANNOT_CONNECT,
    UNREACHABLE,
    AccessNeed,
    Refused,
    disconnect,
    new_state,
    on_each_host,
    require_root,
)
from tensorless_deploy.fleet.inventory import options_for
from tensorless_deploy.fleet.runner import HostResult, Step, StepResult
from tensorless_deploy.hostplan.plan import HostPlan, plan_host
from tensorless_deploy.hostplan.status import (
    UnitStatus,
    host_card_checks,
    model_file,
    rollback_preview,
    unit_status,
)
from tensorless_deploy.hostplan.targets import Job, Skipped
from tensorless_deploy.launch.spec import (
    LABEL_TLS,
    SECRETS_DIR,
    api_key_path,
    secrets_dir,
    unit_model_slug,
)
from tensorless_deploy.recipe.catalog import Catalog, Entry, model_paths, slug, unit_name
from tensorless_deploy.shell import QUADLET_DIR, SYSTEMD_DIR

if TYPE_CHECKING:
    from tensorless_deploy.hostplan.gateway import ServerState
    from tensorless_deploy.local.bench import Connect
    from tensorless_deploy.operations.deploy import Door


@dataclass(frozen=True)
class HostStatus:
    host: str
    error: str | None
    units: tuple[UnitStatus, ...] = ()
    cards: tuple[Check, ...] = ()  # the cards' driver and health checks (hostplan.status)

    @property
    def cards_fail(self) -> bool:
        return any(c.status == "fail" for c in self.cards)

    @property
    def state(self) -> str:
        """unreachable (no connection), unreadable (connected, but its units could not be
        read: not root, facts unreadable), nothing deployed (read: no unit of this tool), or
        deployed (its units say the rest)."""
        if self.error is not None:
            # no SSH session, or one that passed its deadline (fleet.connect.Unreachable)
            gone = self.error.startswith((CANNOT_CONNECT, UNREACHABLE))
            return "unreachable" if gone else "unreadable"
        return "deployed" if self.units else "nothing deployed"


def host_status(
    name: str, facts: HostFacts, units: Sequence[DeployedUnit], catalog: Catalog, options: Options
) -> HostStatus:
    """Every unit of this tool on one host against the host plan of its model (pure)."""
    plans: dict[str, HostPlan | None] = {}
    out = []
    for u in units:
        model = u.unit_labels.get(LABEL_MODEL)
        if model is None:
            out.append(unit_status(u, None, False))
            continue
        key = model.casefold()
        if key not in plans:
            try:
                plans[key] = plan_host(name, facts, catalog.find(model), options, sizing=None)
            except UnknownModelError:
                plans[key] = None
        out.append(unit_status(u, plans[key], plans[key] is not None))
    return HostStatus(name, None, tuple(out), host_card_checks(facts))


def fleet_status(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, flags: Flags | None = None
) -> list[HostStatus]:
    """What every host serves, and how it drifted from the catalog: read-only, in parallel,
    three round trips per host (the survey the host plan needs; the units with their files,
    health and, where a unit enables them, llama-server's metrics; the door marker), and one
    more to each front door those markers name (its state of each instance)."""
    from tensorless_deploy.facts.pyinfra import DeployedUnits, HostSurvey
    from tensorless_deploy.fleet.deploy import unit_port as deployed_port
    from tensorless_deploy.fleet.gateway import fronting_door, read_markers
    from tensorless_deploy.hostplan.gateway import door_word

    state = new_state(inventory, flags)
    options = {h.name: options_for(h, flags or Flags()) for h in hosts}

    def read(h: Any) -> tuple[HostFacts, tuple[DeployedUnit, ...]]:
        facts = HostSurvey.typed(h.get_fact(HostSurvey, models_dir=options[h.name].models_dir))
        # as another user the containers (and the keys of /metrics) cannot be read: the host
        # is not readable, rather than drifted
        require_root(facts)
        units = DeployedUnits.typed(h.get_fact(DeployedUnits, secrets_root=SECRETS_DIR))
        return facts, units

    try:
        results = on_each_host(state, hosts, read, keep_connected=True)
        read_ok = [h for h, r in zip(hosts, results, strict=True) if not isinstance(r, str)]
        markers = read_markers(state, read_ok)
        at_doors = _doors(state, inventory, markers)
    finally:
        disconnect(list(inventory))
    out = []
    for host, r in zip(hosts, results, strict=True):
        if isinstance(r, str):
            out.append(HostStatus(host.name, r))
            continue
        report = host_status(host.name, r[0], r[1], catalog, options[host.name])
        door = fronting_door(markers.get(host.name, {}))
        if door is not None and door in at_doors:
            seen = [
                replace(u, door=door_word(door, at_doors[door], host.name, deployed_port(d)))
                for u, d in zip(report.units, r[1], strict=True)
            ]
            report = replace(report, units=tuple(seen))
        out.append(report)
    return out


def _doors(
    state: Any, inventory: Any, markers: dict[str, dict[str, str]]
) -> dict[str, tuple[ServerState, ...] | None]:
    """Each door the markers name (one of this inventory): its servers as it sees them now
    (None: it did not answer)."""
    from tensorless_deploy.fleet.gateway import Door, doors_named

    by_name = {h.name: h for h in inventory}
    names = doors_named(markers, set(by_name))

    def ask(h: Any) -> tuple[tuple[ServerState, ...], str | None]:
        return Door(state, h).read()

    got = on_each_host(
        state, [by_name[n] for n in names], ask, keep_connected=True, step="the door"
    )
    return {
        n: r[0] if isinstance(r, tuple) and r[1] is None else None
        for n, r in zip(names, got, strict=True)
    }


def serving_digests(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, model: str, flags: Flags | None = None
) -> dict[str, str | None]:
    """Which recipe digest each host's first unit of MODEL serves now (None: none healthy, or
    the host unreachable): after a roll, which hosts run the new recipe."""
    entries = catalog.find(model)
    out: dict[str, str | None] = {}
    for h in fleet_status(inventory, hosts, catalog, flags):
        units = [
            u
            for u in h.units
            if u.model
            and u.model.casefold() in {e.recipe.model.hf_repo.casefold() for e in entries}
        ]
        unit = next((u for u in units if u.healthy), None)
        out[h.host] = unit.recipe_digest if unit is not None else None
    return out


def model_units(
    units: Sequence[DeployedUnit], entries: Sequence[Entry], model: str | None = None
) -> list[DeployedUnit]:
    """The units of a model on a host, every card's and every instance's: by the model label
    the unit carries (the catalog's repo id, or MODEL as typed when the catalog lacks it), or by
    name (base, base-1, ...) for a unit without labels."""
    repos = {e.recipe.model.hf_repo.casefold() for e in entries}
    if model is not None:
        repos.add(model.casefold())
    bases = [re.escape(unit_name(e.recipe)) + r"(-[0-9]+)?" for e in entries]
    names = re.compile("|".join(bases)) if bases else None
    typed = slug(model) if model is not None else None

    def by_name(u: DeployedUnit) -> bool:
        if names is not None and names.fullmatch(u.name):
            return True
        card = u.unit_labels.get(LABEL_CARD)
        return typed is not None and card is not None and unit_model_slug(u.name, card) == typed

    return [
        u for u in units if u.unit_labels.get(LABEL_MODEL, "").casefold() in repos or by_name(u)
    ]


def unit_recipe(unit: DeployedUnit, entries: Sequence[Entry]) -> Entry | str:
    """The recipe a unit of a model runs, by the card its labels name (each card of a model has
    its own recipe and receipt: an H200 instance is never judged by the P100 receipt), or why
    there is none to judge it by."""
    labels = unit.container_labels or unit.unit_labels
    card = labels.get(LABEL_CARD)
    if card is None:
        return f"{unit.name} carries no {LABEL_CARD} label: which recipe it runs is not known"
    entry = next((e for e in entries if e.recipe.card.id == card), None)
    if entry is None:
        cards = ", ".join(sorted({e.recipe.card.id for e in entries})) or "none"
        return (
            f"{unit.name} serves card {card}, for which the catalog has no recipe of this model "
            f"(recipes for: {cards}): not compared"
        )
    return entry


# what bench measures: its name, how to reach it, its tuned label, the API key, the recipe to
# judge it by
BenchTarget = tuple[str, "Connect", "bool | None", "str | None", Entry]


@contextmanager
def bench_targets(
    inventory: Any, hosts: Sequence[Any], entries: Sequence[Entry], card: str | None = None
) -> Iterator[tuple[list[BenchTarget], list[str]]]:
    """bench -i: one target per unit of the model on each host (with card, of that card), each
    judged by the recipe of the card its labels name (unit_recipe: a unit of a card the catalog
    has no recipe for is refused, not compared), each reached through an SSH direct-tcpip
    channel to the host's own 127.0.0.1 (or its bind address): the API never has to listen on
    the network. Yields the targets and the hosts' and units' refusals; the connections stay
    open until the block ends."""
    from tensorless_deploy.facts.pyinfra import DeployedUnits

    state = new_state(inventory)
    try:
        found = on_each_host(
            state,
            hosts,
            lambda h: DeployedUnits.typed(h.get_fact(DeployedUnits)),
            keep_connected=True,
        )
        targets: list[BenchTarget] = []
        failed: list[str] = []
        for host, units in zip(hosts, found, strict=True):
            if isinstance(units, str):
                failed.append(f"{host.name}: {units}")
                continue
            targets += _host_targets(host, units, entries, card, failed)
        yield targets, failed
    finally:
        disconnect(hosts)


def _host_targets(
    host: Any,
    units: Sequence[DeployedUnit],
    entries: Sequence[Entry],
    card: str | None,
    failed: list[str],
) -> list[BenchTarget]:
    """One host's bench targets; what cannot be measured there is added to failed."""
    from tensorless_deploy.fleet.connect import loopback
    from tensorless_deploy.local.bench import over_channel, tls_context

    chosen = [e for e in entries if not card or e.recipe.card.id == card]
    # the key the host was given (tensorless_api_key_file), read here, sent by this client
    key = _host_key(host)
    instances: list[tuple[DeployedUnit, Entry]] = []
    refused: list[str] = []
    for unit in model_units(units, entries):  # every card's, every instance's
        judged = unit_recipe(unit, entries)
        if isinstance(judged, str):
            refused.append(f"{host.name}: {judged}")
        elif judged in chosen:
            instances.append((unit, judged))
    failed.extend(refused)
    if not instances:
        if not refused:
            want = " or ".join(unit_name(e.recipe) for e in chosen)
            failed.append(f"{host.name}: {want} is not deployed here")
        return []
    out: list[BenchTarget] = []
    for unit, entry in instances:
        labels = unit.container_labels or unit.unit_labels
        port_text = labels.get(LABEL_PORT, "")
        if not port_text.isdigit():
            failed.append(f"{host.name}: {unit.name} carries no {LABEL_PORT} label")
            continue
        port = int(port_text)
        bind = reach_host(labels.get(LABEL_BIND, DEFAULT_BIND))
        tuned = {"true": True, "false": False}.get(labels.get(LABEL_TUNED, ""))
        # https inside the SSH channel: the host key vouches for the other end, and the
        # certificate names the host, not its loopback
        tls = tls_context(verify=False) if labels.get(LABEL_TLS) == "true" else None
        where = f"{host.name} {unit.name} ({address(bind, port)} over ssh)"
        out.append((where, over_channel(loopback(host, bind, port), tls), tuned, key, entry))
    return out


def client_key(path: str | None, what: str) -> str | None:
    """The key in an API key file on this machine, for a client to send (never printed), or
    None; a usage error naming what gave the file (a flag, a host's inventory key) where it
    cannot be read."""
    if path is None:
        return None
    try:
        return api_key(path)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None


def _host_key(host: Any) -> str | None:
    """The API key in the file the inventory gives the host (tensorless_api_key_file), read on
    this machine; a usage error naming the host where it cannot be read."""
    path = options_for(host, Flags()).api_key_file
    return client_key(path, f"{host.name}: tensorless_api_key_file")


def unit_paths(name: str) -> tuple[str, str]:
    """Where a unit of this tool may be: quadlet first, then the plain .service."""
    return (f"{QUADLET_DIR}/{name}.container", f"{SYSTEMD_DIR}/{name}.service")


def read_units(
    state: Any, hosts: Sequence[Any], access: AccessNeed = "root"
) -> dict[str, tuple[DeployedUnit, ...] | str]:
    """Every host's units of this tool (or why they could not be read); connections stay open.
    access: "root" (stop, rollback, logs: their commands need root, checked first) or "sudo"
    (a read that a plain user can make: targets)."""
    from tensorless_deploy.facts.pyinfra import DeployedUnits

    found = on_each_host(
        state,
        hosts,
        lambda h: DeployedUnits.typed(h.get_fact(DeployedUnits)),
        keep_connected=True,
        access=access,
        step="its units",
    )
    return dict(zip([h.name for h in hosts], found, strict=True))


def reach_name(host: Any) -> str:
    """The host's address as the inventory names it: its ssh_hostname, else its name (this
    machine's own name for @local)."""
    if str(host.name).startswith("@local"):
        import socket

        return socket.gethostname()
    return str(host.data.get("ssh_hostname") or host.name)


def fleet_targets(
    inventory: Any, hosts: Sequence[Any], flags: Flags | None = None
) -> tuple[list[Job], list[Skipped], dict[str, str]]:
    """The fleet's Prometheus scrape jobs from the units on every host (one read-only round
    trip each), the units left out and why, and the hosts that could not be read."""
    from tensorless_deploy.fleet.gateway import read_markers
    from tensorless_deploy.hostplan.gateway import specs_of
    from tensorless_deploy.hostplan.targets import HostUnits, door_target, jobs

    state = new_state(inventory, flags)
    by_name = {h.name: h for h in inventory}
    try:
        found = read_units(state, hosts, access="sudo")  # unit files: any user may read them
        readable = [h for h in hosts if not isinstance(found[h.name], str)]
        # the front doors over these hosts, as their markers record them
        specs = specs_of(read_markers(state, readable))
    finally:
        disconnect(hosts)
    doors = [
        door_target(d, reach_name(by_name[d]), spec)
        for d, spec in sorted(specs.items())
        if d in by_name
    ]
    read: list[HostUnits] = []
    errors: dict[str, str] = {}
    for h in hosts:
        units = found[h.name]
        if isinstance(units, str):
            errors[h.name] = units
            continue
        options = options_for(h, flags or Flags())
        read.append(
            HostUnits(h.name, reach_name(h), units, options.api_key_file, options.tls_cert_file)
        )
    made, skipped = jobs(read, doors)
    return made, skipped, errors


def stop(
    inventory: Any,
    hosts: Sequence[Any],
    catalog: Catalog,
    model: str,
    purge: bool,
    flags: Flags | None = None,
    *,
    dry: bool = False,
    door: Door | None = None,
) -> list[HostResult]:
    """Stop and remove the model's units on every host (every card's, every instance's): found
    on the host by their model label, so a unit whose recipe left the catalog goes too; with
    purge, the model files of the catalog's recipes for it as well. With a door, each unit is
    taken out of it first (the answers in the host's "door" step)."""
    from tensorless_deploy.fleet.deploy import take_out_units
    from tensorless_deploy.fleet.runner import Step, apply_steps
    from tensorless_deploy.operations.unit import removed

    entries = catalog.find(model) if purge else catalog.find_or_none(model)
    state = new_state(inventory, flags, lock=None if dry else f"stop {model}")
    options = {h.name: options_for(h, flags or Flags()) for h in hosts}
    found = read_units(state, hosts)
    live = [h for h in hosts if not isinstance(found[h.name], str)]
    steps: dict[str, list[Step]] = {}
    said: dict[str, tuple[str, ...]] = {}
    for h in live:
        units = found[h.name]
        assert not isinstance(units, str)
        mine = model_units(units, entries, model)
        if not dry and mine:
            said[h.name] = take_out_units(door, h.name, mine, options[h.name].drain_timeout)
        todo = [
            Step(
                f"remove {u.name}",
                removed,
                dict(
                    service=u.name,
                    paths=unit_paths(u.name),
                    secrets=secrets_dir(u.name),
                    **drain_args(u, options[h.name]),
                ),
                preview=()
                if purge or (f := model_file(u)) is None
                else (f"would keep the model file {f} (--purge removes it)",),
            )
            for u in mine
        ]
        if purge:
            for e in entries:
                m = e.recipe.model
                models_dir = options[h.name].models_dir
                blob = model_paths(models_dir, e.recipe).blob
                todo.append(
                    Step(
                        f"purge {m.file}",
                        removed,
                        dict(
                            service=unit_name(e.recipe),
                            paths=unit_paths(unit_name(e.recipe)),
                            models_dir=models_dir,
                            repo=m.hf_repo,
                            revision=m.revision,
                            filename=m.file,
                            sha256=m.sha256,
                        ),
                        preview=(f"would remove the model file {blob}",),
                    )
                )
        steps[h.name] = todo
    try:
        done = apply_steps(state, live, steps, dry=dry, nothing=f"{model} is not deployed here")
    finally:
        disconnect(hosts)
    # a host whose units could not be read (unreachable, locked, access.root) ran no command of
    # stop's: everything there is as it was, and the line says so rather than leave it guessed
    untouched = "nothing stopped or removed"
    out = [
        with_door(done[h.name], said.get(h.name, ()))
        if h.name in done
        else not_read(h.name, found[h.name], untouched)
        for h in hosts
    ]
    # asked to stop, refused (access.root): the model still serves there, which is a failure
    return [
        replace(r, outcome="failed") if isinstance(found.get(r.host), Refused) else r for r in out
    ]


def rollback(
    inventory: Any,
    hosts: Sequence[Any],
    catalog: Catalog,
    model: str,
    flags: Flags | None = None,
    *,
    dry: bool = False,
    door: Door | None = None,
) -> list[HostResult]:
    """Bring back, on every host, the previous unit kept for each of the model's units,
    health-gated; a unit with no previous one kept fails that host (nothing to go back to).
    With a door, each unit is taken out of it before its swap and put back once the one it
    swapped to is healthy and on its card (the answers in the host's "door" step)."""
    from tensorless_deploy.fleet.runner import Step, apply_steps
    from tensorless_deploy.operations.unit import rolled_back

    entries = catalog.find_or_none(model)
    state = new_state(inventory, flags, lock=None if dry else f"rollback {model}")
    options = {h.name: options_for(h, flags or Flags()) for h in hosts}
    found = read_units(state, hosts)
    live = [h for h in hosts if not isinstance(found[h.name], str)]
    steps: dict[str, list[Step]] = {}
    said: dict[str, list[str]] = {}
    refused: dict[str, HostResult] = {}
    for h in live:
        units = found[h.name]
        assert not isinstance(units, str)
        mine = model_units(units, entries, model)
        none = [u.name for u in mine if u.previous_sha256 is None]
        if not mine or none:
            why = (
                f"no previous unit is kept for {', '.join(none)}"
                if none
                else f"{model} is not deployed here"
            )
            refused[h.name] = HostResult(h.name, "failed", why)
            continue
        steps[h.name] = []
        for u in mine:
            rolled = Step(
                f"rollback {u.name}",
                rolled_back,
                dict(
                    path=u.path,
                    timeout_s=start_timeout(u.previous_text),
                    **drain_args(u, options[h.name]),
                ),
                preview=rollback_preview(u),
            )
            steps[h.name] += door_around(door, h.name, u, options[h.name], rolled, said)
    try:
        ready = [h for h in live if h.name in steps]
        done = apply_steps(state, ready, steps, dry=dry)
    finally:
        disconnect(hosts)
    out = []
    for h in hosts:
        if h.name in refused:
            out.append(refused[h.name])
        elif h.name in done:
            out.append(with_door(done[h.name], tuple(said.get(h.name, ()))))
        else:
            out.append(not_read(h.name, found[h.name]))
    return out


def drain_args(unit: DeployedUnit, options: Options) -> dict[str, Any]:
    """What an operation that stops or restarts a serving unit needs for its wait until the
    unit is idle (operations.unit's idle_s and key): the host's drain timeout, and where the
    unit's API key file is on the host (sent where it exists)."""
    return {"idle_s": options.drain_timeout, "key": api_key_path(unit.name)}


def door_around(
    door: Door | None,
    host: str,
    unit: DeployedUnit,
    options: Options,
    step: Step,
    said: dict[str, list[str]],
) -> list[Step]:
    """step (a unit's swap) between the door's take_out and put_back of the unit, each a
    pyinfra python.call run in its turn on the host's schedule, its answer kept in said; the
    step alone without a door (or a port to name the unit by)."""
    from pyinfra.operations import python

    from tensorless_deploy.fleet.deploy import unit_port
    from tensorless_deploy.fleet.runner import Step

    port = unit_port(unit)
    if door is None or port is None or not door.fronts(host):
        return [step]
    lines = said.setdefault(host, [])

    def take_out() -> None:
        why = door.take_out(host, port, float(options.drain_timeout))
        lines.append(f"{unit.name} ({port}): {why or 'taken out'}")

    def put_back() -> None:
        lines.append(f"{unit.name} ({port}): {door.put_back(host, port) or 'put back'}")

    return [
        Step(f"door: take out {unit.name}", python.call, {"function": take_out}),
        step,
        Step(f"door: put back {unit.name}", python.call, {"function": put_back}),
    ]


def with_door(result: HostResult, said: Sequence[str]) -> HostResult:
    """A host's result with what the door answered, as its "door" step (none: as it was)."""
    if not said:
        return result
    return replace(result, steps=(*result.steps, StepResult("door", "changed", tuple(said))))


def not_read(host: str, error: object, what: str | None = None) -> HostResult:
    """The result of a host whose units could not be read (unreachable, locked, ...); what: the
    words the reason starts with (what was therefore not done)."""
    from tensorless_deploy.fleet.deploy import not_reached

    text = error if isinstance(error, str) else str(error)
    return HostResult(host, not_reached(text), f"{what}: {text}" if what else text)


def start_timeout(text: str, default: int = 300) -> int:
    """A unit's TimeoutStartSec (what a deploy gave its model to load)."""
    for line in text.splitlines():
        if line.startswith("TimeoutStartSec="):
            value = line.split("=", 1)[1].strip().removesuffix("s")
            if value.isdigit():
                return int(value)
    return default
