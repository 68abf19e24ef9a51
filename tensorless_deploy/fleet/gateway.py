"""gateway: the front door over the fleet's instances of some models, on one host.

Every inventory host is surveyed and planned as deploy plans it (hostplan.plan.plan_host, with
the same sizing); each planned instance of the models becomes a server of its model's pool at
the door (hostplan.gateway renders the door). On the door host, HAProxy is installed from its
packages and the door written and (re)loaded (operations.gateway); each backend host gets a
marker naming its door (door_of reads it). ``Door`` is the control path deploy drains through:
the door's stats page on its root-only unix socket, over the SSH connection the run holds.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensorless_deploy.decisions.checks import secret_file_checks
from tensorless_deploy.decisions.options import (
    Flags,
    Options,
    api_key,
    pem_text,
    resolve,
)
from tensorless_deploy.errors import UsageError
from tensorless_deploy.fleet.connect import (
    disconnect,
    new_state,
    on_each_host,
    run_script,
    survey_and_size,
)
from tensorless_deploy.fleet.runner import HostResult, Step, apply_steps
from tensorless_deploy.hostplan.gateway import (
    DEFAULT_DOOR_PORT,
    MARKER_PATH,
    STATS_SOCKET,
    Backend,
    DoorPlan,
    DoorSpec,
    Pool,
    ServerState,
    backend_address,
    ca_path,
    door_refusal,
    marker_text,
    parse_marker,
    parse_stats_csv,
    render_config,
    render_unit,
    server_name,
    specs_of,
)
from tensorless_deploy.hostplan.plan import plan_host
from tensorless_deploy.hostplan.prepare import DOOR
from tensorless_deploy.recipe.catalog import Catalog

PACKAGE = "tensorless_deploy.fleet"
ADMIN_TIMEOUT_S = 30
DRAIN_POLL_S = 0.5
READY_TIMEOUT_S = 30  # put_back: until the door's health checks see the instance UP


@dataclass(frozen=True)
class GatewayResult:
    """What one gateway run did: the door's plan, the door host's and each backend host's
    result, and the hosts whose instances the door does not front (and why)."""

    plan: DoorPlan
    door: HostResult | None  # None: a dry run
    markers: tuple[HostResult, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # (host, why)
    config: str = ""

    @property
    def ok(self) -> bool:
        return (self.door is None or self.door.ok) and all(m.ok for m in self.markers)


def door_options(flags: Flags) -> Options:
    """The door's own options, from the command line only (a host's inventory port and bind
    are its instances'): --port (default DEFAULT_DOOR_PORT), --bind, its key, its TLS."""
    port = flags.port if flags.port is not None else DEFAULT_DOOR_PORT
    return resolve(dataclasses.replace(flags, port=port))


def _refuse(options: Options) -> None:
    problem = door_refusal(options)
    if problem is not None:
        raise UsageError(problem)
    for c in secret_file_checks(options):
        if c.status == "fail":
            flag = "--api-key-file" if c.id == "api.key_file" else "--tls-cert-file/--tls-key-file"
            raise UsageError(f"{flag}: {c.evidence}")


def _host_address(host: Any) -> str:
    data = host.data
    value = data.get("ssh_hostname") if data is not None else None
    return str(value or host.name)


@dataclass
class _Planned:
    pools: list[Pool] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    candidates: set[str] = field(default_factory=set)  # hosts with a card for the models


def _pools(
    state: Any,
    hosts: Sequence[Any],
    catalog: Catalog,
    models: Sequence[str],
    door: str,
    host_timeout: int | None = None,
) -> _Planned:
    """Every host planned for every model as deploy plans it (its options its inventory's: the
    command line's --port, --bind and key are the door's); each planned instance whose unit is
    deployed there a server."""
    wanted = [(m, catalog.find(m)) for m in models]
    entries = [e for _, es in wanted for e in es]
    survey_flags = Flags(host_timeout=host_timeout)
    surveyed, sizing = survey_and_size(state, hosts, survey_flags, entries, keep_connected=True)
    by_name = {h.name: h for h in hosts}
    out = _Planned()
    for model, es in wanted:
        backends: list[Backend] = []
        alias = es[0].recipe.run.alias
        for s in surveyed:
            if s.facts is None:
                out.skipped.append((s.name, s.error or "not surveyed"))
                continue
            plan = plan_host(s.name, s.facts, es, s.options, sizing=sizing)
            if plan.entry is None:
                continue  # no card here for this model
            out.candidates.add(s.name)
            if not plan.ok:
                out.skipped.append((s.name, f"{model}: {plan.why()}"))
                continue
            key = api_key(s.options.api_key_file) if s.options.api_key_file else None
            tool = s.facts.tool  # what this tool put on the host (None: not known)
            for inst in plan.instances:
                spec = inst.spec
                if tool is not None and tool.unit(inst.name) is None:
                    # planned, not deployed (or stopped): the door fronts what serves
                    out.skipped.append((s.name, f"{model}: {inst.name} is not deployed"))
                    continue
                where, problem = backend_address(
                    door, s.name, spec.bind, spec.port, _host_address(by_name[s.name])
                )
                if where is None:
                    out.skipped.append((s.name, problem or "unreachable from the door"))
                    continue
                ca_file, ca_pem = None, None
                if spec.tls:  # verified by its own certificate (the inventory's)
                    try:
                        ca_pem = pem_text(s.options.tls_cert_file or "", "certificate")
                        ca_pem += "" if ca_pem.endswith("\n") else "\n"  # as it is written
                    except ValueError as exc:
                        out.skipped.append((s.name, f"{model}: no certificate to verify: {exc}"))
                        continue
                    ca_file = ca_path(s.name, spec.port)
                backends.append(Backend(s.name, spec.port, where, key, spec.tls, ca_file, ca_pem))
        if backends:
            out.pools.append(Pool(alias, tuple(backends)))
        else:
            out.skipped.append(("*", f"{model}: no instance planned on any host"))
    return out


def plan_door(
    state: Any,
    hosts: Sequence[Any],
    catalog: Catalog,
    models: Sequence[str],
    door: str,
    flags: Flags,
    *,
    allow_empty: bool = False,
) -> tuple[DoorPlan, _Planned]:
    """The door's plan (refused as deploy refuses a keyless wide bind), and what was planned
    (the hosts left out, and those with a card for the models). allow_empty: a door with no
    instance left (a refresh after a stop) rather than a refusal."""
    options = door_options(flags)
    _refuse(options)
    if door not in {h.name for h in hosts}:
        raise UsageError(f"--on {door}: not in the inventory")
    planned = _pools(state, hosts, catalog, models, door, flags.host_timeout)
    if not planned.pools and not allow_empty:
        why = "; ".join(f"{h}: {w}" for h, w in planned.skipped) or "no instances"
        raise UsageError(f"no instance of {', '.join(models)} to front: {why}")
    key = api_key(options.api_key_file) if options.api_key_file else None
    plan = DoorPlan(door, options, tuple(planned.pools), key)
    return plan, planned


def spec_of(models: Sequence[str], flags: Flags, only: Sequence[str] | None) -> DoorSpec:
    """What a gateway run was asked, to record (its files' paths absolute: a later run may
    start elsewhere)."""

    def path(p: str | None) -> str | None:
        return os.path.abspath(p) if p else None

    return DoorSpec(
        models=tuple(models),
        only=None if only is None else tuple(only),
        port=flags.port if flags.port is not None else DEFAULT_DOOR_PORT,
        bind=flags.bind,
        api_key_file=path(flags.api_key_file),
        insecure_open=bool(flags.insecure_open),
        tls_cert_file=path(flags.tls_cert_file),
        tls_key_file=path(flags.tls_key_file),
    )


def flags_of(spec: DoorSpec, run: Flags) -> Flags:
    """The flags of the gateway run a spec records, with this run's reach (its deadline)."""
    return Flags(
        port=spec.port,
        bind=spec.bind,
        api_key_file=spec.api_key_file,
        insecure_open=spec.insecure_open or None,
        tls_cert_file=spec.tls_cert_file,
        tls_key_file=spec.tls_key_file,
        host_timeout=run.host_timeout,
        wait_lock=run.wait_lock,
    )


def _door_pem(options: Options) -> str | None:
    if not options.tls or options.tls_cert_file is None or options.tls_key_file is None:
        return None
    cert = pem_text(options.tls_cert_file, "certificate")
    return cert + pem_text(options.tls_key_file, "private key")


def gateway(
    inventory: Any,
    catalog: Catalog,
    models: Sequence[str],
    door: str,
    flags: Flags,
    *,
    dry: bool = False,
    only: Sequence[str] | None = None,
    refresh: bool = False,
) -> GatewayResult:
    """Plan the door, then (unless dry) install HAProxy on the door host, write and (re)load the
    door there, and mark each host with a card for the models with its door (and this run's
    spec: refresh_doors renders it again from that). only: the hosts whose instances it fronts
    (--limit; None: every inventory host); the door host is surveyed either way. refresh: a
    deploy's or a stop's re-render, where a door with no instance left is still written. Every
    host it connects is locked for it (one change at a time per host)."""
    from tensorless_deploy.operations import gateway as ops

    hosts = [h for h in inventory if only is None or h.name in only or h.name == door]
    state = new_state(inventory, flags, lock=None if dry else "gateway")
    try:
        plan, planned = plan_door(state, hosts, catalog, models, door, flags, allow_empty=refresh)
        skipped = tuple(planned.skipped)
        config = render_config(plan)
        if dry:
            return GatewayResult(plan, None, (), skipped, config)
        spec = spec_of(models, flags, only)
        by_name = {h.name: h for h in hosts}
        fronted = {b.host for b in plan.backends}
        marked = sorted(fronted | planned.candidates | {door})
        steps: dict[str, list[Step]] = {name: [] for name in marked}
        steps[door] = [
            Step(DOOR, ops.haproxy),  # prepare --gateway's step
            Step(
                "gateway.door",
                ops.door,
                {
                    "config": config,
                    "unit": render_unit(plan),
                    "pem": _door_pem(plan.options),
                    "cas": {b.ca_file: b.ca_pem for b in plan.backends if b.ca_file and b.ca_pem},
                },
            ),
        ]
        for name in marked:
            content = marker_text(plan, spec, fronted=name in fronted)
            steps[name].append(
                Step("gateway.marker", ops.marker, {"path": MARKER_PATH, "content": content})
            )
        ran = [by_name[n] for n in steps]
        results = apply_steps(state, ran, steps)
        markers = tuple(results[n] for n in marked if n != door)
        return GatewayResult(plan, results[door], markers, skipped, config)
    finally:
        disconnect(hosts)


class Door:
    """The door's control path for one run: drain an instance, wait until the door's own count
    of its requests in flight is zero, and put it back (the stats page on the door host's
    root-only unix socket, over the SSH connection the run holds)."""

    def __init__(self, state: Any, host: Any) -> None:
        self.state = state
        self.host = host

    def _admin(self, **params: str) -> tuple[tuple[ServerState, ...], str | None]:
        ok, out, err = run_script(
            self.state,
            self.host,
            PACKAGE,
            "gateway-admin",
            ADMIN_TIMEOUT_S,
            socket=STATS_SOCKET,
            **params,
        )
        if not ok:
            return (), f"the door on {self.host.name}: " + ("; ".join(err) or "no answer")
        return parse_stats_csv("\n".join(out)), None

    def servers(self) -> tuple[ServerState, ...]:
        """Every instance as the door sees it now (empty: the door did not answer)."""
        return self.read()[0]

    def read(self) -> tuple[tuple[ServerState, ...], str | None]:
        """Every instance as the door sees it now, or why the door did not answer."""
        return self._admin()

    def _find(self, host_name: str, port: int) -> tuple[ServerState | None, str | None]:
        rows, error = self._admin()
        if error is not None:
            return None, error
        name = server_name(host_name, port)
        row = next((r for r in rows if r.server == name), None)
        if row is None:
            return None, f"the door on {self.host.name} fronts no instance {host_name}:{port}"
        return row, None

    def _until(
        self,
        rows: tuple[ServerState, ...],
        server: str,
        done: Callable[[ServerState], bool],
        timeout_s: float,
    ) -> tuple[ServerState | None, float, str | None]:
        """Read the door's stats until done(the server's row) or timeout_s has passed: the last
        row seen (None: gone), the seconds waited, and the door's error if it stopped answering."""
        started = time.monotonic()
        while True:
            now = next((r for r in rows if r.server == server), None)
            waited = time.monotonic() - started
            if (now is not None and done(now)) or waited >= timeout_s:
                return now, waited, None
            time.sleep(DRAIN_POLL_S)
            rows, error = self._admin()
            if error is not None:
                return now, waited, error

    def take_out(self, host_name: str, port: int, timeout_s: float) -> str | None:
        """Set the instance to drain at the door (no new request goes to it) and wait, at most
        timeout_s, until the door counts none of its requests in flight. None: drained; else
        why not (the requests still in flight when the wait ended)."""
        row, error = self._find(host_name, port)
        if row is None:
            return error
        rows, error = self._admin(action="drain", pool=row.pool, server=row.server)
        if error is not None:
            return error
        now, waited, error = self._until(rows, row.server, lambda r: r.current == 0, timeout_s)
        if error is not None:
            return error
        if now is not None and now.current == 0:
            return None
        left = now.current if now is not None else "?"
        return f"{left} request(s) still in flight at the door after {waited:.0f} s"

    def put_back(self, host_name: str, port: int) -> str | None:
        """Set the instance ready at the door again, then wait (at most READY_TIMEOUT_S) until
        the door's own health checks see it UP: the next instance of a roll is taken out only
        once this one takes requests at the door. None: UP; else what the door said last."""
        row, error = self._find(host_name, port)
        if row is None:
            return error
        rows, error = self._admin(action="ready", pool=row.pool, server=row.server)
        if error is not None:
            return error

        def up(r: ServerState) -> bool:
            return r.status.startswith("UP")

        now, waited, error = self._until(rows, row.server, up, READY_TIMEOUT_S)
        if error is not None:
            return error
        if now is not None and up(now):
            return None
        seen = now.status if now is not None else "gone"
        return f"set ready, yet the door says {seen} after {waited:.0f} s"


def read_markers(state: Any, hosts: Sequence[Any]) -> dict[str, dict[str, str]]:
    """Each host's door marker, parsed (empty: no door marks it, or it could not be read), all
    hosts in parallel over connections kept open."""

    def read(h: Any) -> tuple[bool, str]:
        ok, out, _ = run_script(state, h, PACKAGE, "gateway-marker", 10, path=MARKER_PATH)
        return ok, "\n".join(out)

    got = on_each_host(state, hosts, read, keep_connected=True, step="the door's marker")
    return {
        h.name: parse_marker(r[1]) if isinstance(r, tuple) and r[0] else {}
        for h, r in zip(hosts, got, strict=True)
    }


def fronting_door(marker: dict[str, str]) -> str | None:
    """The door a host's marker says fronts its instances (None: none does)."""
    return marker.get("door") if marker.get("fronted", "yes") != "no" else None


def doors_named(markers: dict[str, dict[str, str]], names: set[str]) -> list[str]:
    """The doors that front the hosts of these markers and are among names (the inventory's
    hosts), each once, sorted."""
    fronting = (fronting_door(m) for m in markers.values())
    return sorted({d for d in fronting if d is not None and d in names})


def door_of(state: Any, hosts: Sequence[Any], host_name: str) -> Door | None:
    """The door that fronts host_name's instances, as that host's marker names it (None: no
    door, or the door is not in this inventory)."""
    by_name = {h.name: h for h in hosts}
    host = by_name.get(host_name)
    if host is None:
        return None
    door = fronting_door(read_markers(state, [host])[host_name])
    if door is None or door not in by_name:
        return None
    on_each_host(state, [by_name[door]], lambda h: "", keep_connected=True, step="the door")
    return Door(state, by_name[door])


class FleetDoor:
    """The door of each host of a run, found when an instance there first changes (its marker
    read then, over a connection of the door's own: a converged run never asks), for deploy,
    rollback, stop and the maintenance window (operations.deploy.Door). Its connections are
    its own inventory's, apart from the run's pyinfra state; close() ends them."""

    def __init__(self, inventory: Any) -> None:
        from gevent.lock import RLock

        self.names_data = [(h.name, h.data.dict()) for h in inventory]
        self.state: Any = None
        self.hosts: list[Any] = []
        self.doors: dict[str, Door | None] = {}
        self.lock = RLock()

    def _connect(self) -> None:
        if self.state is None:
            from pyinfra.api.inventory import Inventory

            own = Inventory((self.names_data, {}))
            self.state, self.hosts = new_state(own), list(own)

    def _door(self, host_name: str) -> Door | None:
        with self.lock:
            if host_name not in self.doors:
                self._connect()
                self.doors[host_name] = door_of(self.state, self.hosts, host_name)
            return self.doors[host_name]

    def fronts(self, host_name: str) -> bool:
        return self._door(host_name) is not None

    def take_out(self, host_name: str, port: int, timeout_s: float) -> str | None:
        door = self._door(host_name)
        return door.take_out(host_name, port, timeout_s) if door is not None else None

    def put_back(self, host_name: str, port: int) -> str | None:
        door = self._door(host_name)
        return door.put_back(host_name, port) if door is not None else None

    def specs(self) -> dict[str, DoorSpec | None]:
        """Every door of the inventory, as the hosts' markers record it: door host -> the spec
        of the gateway run that made it (None: a marker without one, from an older run)."""
        with self.lock:
            self._connect()
            return specs_of(read_markers(self.state, self.hosts))

    def close(self) -> None:
        if self.hosts:
            disconnect(self.hosts)
            self.hosts = []
            self.state = None


@dataclass(frozen=True)
class Refreshed:
    """One door rendered again after a change: its result, or why it was not."""

    door: str
    result: GatewayResult | None
    why: str | None = None  # not rendered again: why, and the command that would


def refresh_doors(inventory: Any, catalog: Catalog, door: FleetDoor, run: Flags) -> list[Refreshed]:
    """After a deploy or a stop changed hosts: every door of the inventory rendered again from
    the host plans, as the gateway run its markers record was (a door whose instances are the
    same is left as it is; one whose instances changed is reloaded hitlessly). A door whose
    spec this controller cannot follow (its key file is not here, a model not in this catalog)
    is left as it is, and says which and the command to run (a key or TLS file that cannot be
    read: plan_door's own refusal, as the gateway command line's)."""
    out = []
    names = {h.name for h in inventory}
    for host, spec in sorted(door.specs().items()):
        again = f"run `tensorless-deploy gateway --on {host} ...` again"
        if host not in names:
            continue  # a door of another inventory
        if spec is None:
            out.append(Refreshed(host, None, f"its markers record no gateway run: {again}"))
            continue
        unknown = [m for m in spec.models if not catalog.find_or_none(m)]
        if unknown:
            out.append(Refreshed(host, None, f"{', '.join(unknown)} not in this catalog: {again}"))
            continue
        try:
            result = gateway(
                inventory,
                catalog,
                spec.models,
                host,
                flags_of(spec, run),
                only=spec.only,
                refresh=True,
            )
        except UsageError as exc:
            out.append(Refreshed(host, None, f"{exc}: {again}"))
            continue
        out.append(Refreshed(host, result))
    return out
