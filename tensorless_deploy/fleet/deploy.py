"""deploy: survey every host, refuse those that fail preflight, plan the rest, converge them in
parallel with pyinfra, and report per host. Also the shared plumbing of serve, status and stop."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tensorless_deploy.decisions.checks import (
    Check,
    EngineName,
    Existing,
    Options,
    Tuning,
    choose_recipe,
    host_verdict,
    no_card_verdict,
)
from tensorless_deploy.fleet.hosts import (
    HostOutcome,
    disconnect,
    host_fact,
    new_state,
    on_each_host,
    survey_hosts,
)
from tensorless_deploy.hub import cache_paths, resolve_url
from tensorless_deploy.launch.render import (
    QUADLET_DIR,
    SYSTEMD_DIR,
    RenderError,
    render_quadlet,
    render_service,
)
from tensorless_deploy.launch.spec import build_launch_spec, unit_name
from tensorless_deploy.recipe.catalog import Catalog, Entry

Outcome = Literal[
    "changed", "unchanged", "failed", "skipped", "would change", "no change", "untouched"
]
ENGINE_BINS = {"podman": "/usr/bin/podman", "docker": "/usr/bin/docker"}


@dataclass(frozen=True)
class StepResult:
    name: str
    outcome: str  # changed, unchanged, failed, not run
    output: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostResult:
    host: str
    outcome: Outcome
    reason: str | None = None
    recipe: str | None = None
    recipe_digest: str | None = None
    card: str | None = None
    address: str | None = None
    tuning: Tuning | None = None
    transfer: str | None = None  # how model and image got there: pull or push, and why
    failed_checks: tuple[Check, ...] = ()
    steps: tuple[StepResult, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.outcome not in ("failed", "skipped", "untouched")


@dataclass(frozen=True)
class DeployRequest:
    model: str
    base: Options
    context: int | None = None
    extra_args: tuple[str, ...] = ()
    dry: bool = False
    token: str | None = None
    override: dict[str, Any] = field(default_factory=dict)  # explicit --port / --bind
    transfer: str = "auto"  # pull: hosts fetch; push: the controller sends; auto: per host


def existing_on_host(state: Any, host: Any, entry: Entry, options: Options) -> Existing:
    from tensorless_deploy.facts.deployed import FileSha256, ModelBlob

    name = unit_name(entry.recipe)
    unit = any(
        host_fact(state, host, FileSha256, path=p) is not None
        for p in (f"{QUADLET_DIR}/{name}.container", f"{SYSTEMD_DIR}/{name}.service")
    )
    paths = cache_paths(options.models_dir, entry.recipe)
    blob = host_fact(
        state, host, ModelBlob, blob=paths.blob, stamp=paths.stamp, snapshot=paths.snapshot
    )
    return Existing(unit_present=unit, model_present=blob.exists)


def plan_host(
    outcome: HostOutcome,
    entry: Entry,
    engine: str,
    request: DeployRequest,
    gpu_uuids: Sequence[str],
) -> Any:
    """The launch spec, unit and model paths for one host that passed preflight."""
    from tensorless_deploy.operations.deploy import HostPlan

    facts = outcome.facts
    assert facts is not None and facts.engines is not None
    options = outcome.options
    recipe = entry.recipe
    paths = cache_paths(options.models_dir, recipe)
    eng: EngineName = "podman" if engine == "podman" else "docker"
    spec = build_launch_spec(
        recipe,
        engine=eng,
        model_path=paths.blob,
        gpu_uuids=gpu_uuids,
        cpus=facts.cpus,
        port=options.port,
        bind=options.bind,
        context=request.context,
        extra_args=request.extra_args,
    )
    podman = facts.engines.podman
    if eng == "podman" and podman.quadlet_supported:
        unit = render_quadlet(
            spec, digest=entry.digest, notify_healthy=podman.notify_healthy_supported
        )
        quadlet_bin = podman.quadlet_path
    else:
        unit = render_service(spec, digest=entry.digest, engine_bin=ENGINE_BINS[eng])
        quadlet_bin = None
    return HostPlan(
        host=outcome.name,
        recipe_path=entry.path,
        recipe_digest=entry.digest,
        spec=spec,
        unit=unit,
        engine_bin=ENGINE_BINS[eng],
        quadlet_bin=quadlet_bin,
        paths=paths,
        url=resolve_url(recipe),
        sha256=recipe.model.sha256,
        size=recipe.model.size_bytes,
    )


def _meta_lines(meta: Any) -> tuple[str, ...]:
    return tuple(line for line in (meta.stdout + "\n" + meta.stderr).splitlines() if line)


def _step_results(metas: dict[str, Any], dry: bool) -> tuple[StepResult, ...]:
    out = []
    for name, meta in metas.items():
        if dry:
            out.append(StepResult(name, "would change" if meta.will_change else "no change"))
            continue
        if not meta.is_complete():
            out.append(StepResult(name, "not run"))
        elif meta.did_error():
            out.append(StepResult(name, "failed", _meta_lines(meta)))
        elif not meta.executed:  # a noop, or a follow-up whose condition did not hold
            out.append(StepResult(name, "unchanged"))
        else:
            outcome = "changed" if meta.did_change() else "unchanged"
            out.append(StepResult(name, outcome, _meta_lines(meta)))
    return tuple(out)


def deploy(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, request: DeployRequest
) -> list[HostResult]:
    """Converge every host to serve request.model; the per-host result says what happened."""
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operations import run_ops
    from pyinfra.api.state import StateStage

    from tensorless_deploy.operations.deploy import serve_recipe

    entries = catalog.find(request.model)
    state = new_state(inventory)
    outcomes = survey_hosts(
        state, hosts, request.base, keep_connected=True, override=request.override
    )
    by_name = {h.name: h for h in hosts}
    results: dict[str, HostResult] = {}
    plans: dict[str, Any] = {}
    try:
        for o in outcomes:
            if o.facts is None:
                results[o.name] = HostResult(o.name, "failed", o.error)
                continue
            recipe = choose_recipe([e.recipe for e in entries], o.facts)
            if recipe is None:
                v = no_card_verdict(
                    entries[0].recipe.model.hf_repo, [e.recipe for e in entries], o.facts, o.options
                )
                results[o.name] = HostResult(
                    o.name, "skipped", _why(v.failed()), failed_checks=v.failed()
                )
                continue
            entry = next(e for e in entries if e.recipe is recipe)
            existing = existing_on_host(state, by_name[o.name], entry, o.options)
            verdict = host_verdict(o.facts, recipe, o.options, existing=existing)
            if not verdict.ok or verdict.engine is None or verdict.match is None:
                results[o.name] = HostResult(
                    o.name,
                    "skipped",
                    _why(verdict.failed()),
                    entry.path,
                    entry.digest,
                    recipe.card.id,
                    failed_checks=verdict.failed(),
                )
                continue
            try:
                plans[o.name] = plan_host(o, entry, verdict.engine, request, verdict.match.uuids)
            except RenderError as exc:  # this host's values cannot make a safe unit
                results[o.name] = HostResult(
                    o.name, "failed", exc.message, entry.path, entry.digest, recipe.card.id
                )

        steps: dict[str, dict[str, Any]] = {}
        transfers: dict[str, str] = {}
        if plans:
            modes = choose_transfer(state, by_name, plans, request.transfer)
            transfers = {n: f"{m} ({why})" for n, (m, why) in modes.items()}
            pushing = {n: p for n, p in plans.items() if modes[n][0] == "push"}
            if pushing:
                pushing = pushing_plans(pushing)
                plans.update(pushing)
                if not request.dry:
                    errors, sent = push(state, by_name, pushing, entries, request.token)
                    for name, what in sent.items():
                        transfers[name] += f"; {what}"
                    for name, error in errors.items():
                        plans.pop(name)
                        results[name] = HostResult(name, "failed", error, transfer=transfers[name])
        if plans:
            state.set_stage(StateStage.Prepare)
            for name, plan in plans.items():
                add_deploy(state, serve_recipe, plan, request.token, steps, host=by_name[name])
            if not request.dry:
                state.set_stage(StateStage.Execute)
                try:
                    run_ops(state)
                except PyinfraError as exc:
                    if "No hosts remaining" not in str(exc):
                        raise  # pyinfra stops when every host failed: the report says why

        for name, plan in plans.items():
            step_results = _step_results(steps.get(name, {}), request.dry)
            failed = [s for s in step_results if s.outcome == "failed"]
            if request.dry:
                changing = any(s.outcome == "would change" for s in step_results)
                outcome: Outcome = "would change" if changing else "no change"
            elif failed:
                outcome = "failed"
            else:
                changed = any(s.outcome == "changed" for s in step_results)
                outcome = "changed" if changed else "unchanged"
            reason = f"{failed[0].name} failed" if failed else None
            bind = plan.spec.bind
            results[name] = HostResult(
                name,
                outcome,
                reason,
                plan.recipe_path,
                plan.recipe_digest,
                plan.recipe_path.rsplit("/", 1)[-1].removesuffix(".toml"),
                f"{'[' + bind + ']' if ':' in bind else bind}:{plan.spec.port}",
                plan.spec.tuning,
                transfers.get(name),
                (),
                step_results,
            )
    finally:
        disconnect(hosts)
    return [results[h.name] for h in hosts]


def _why(checks: Sequence[Check]) -> str:
    return "; ".join(f"{c.id}: {c.evidence}" for c in checks) or "refused"


@dataclass(frozen=True)
class HostStatus:
    host: str
    error: str | None
    units: tuple[Any, ...] = ()  # UnitStatus


def fleet_status(inventory: Any, hosts: Sequence[Any], catalog: Catalog) -> list[HostStatus]:
    """What every host serves: read-only, in parallel."""
    from tensorless_deploy.facts.deployed import DeployedUnits
    from tensorless_deploy.hostplan.status import unit_status

    state = new_state(inventory)
    results = on_each_host(state, hosts, lambda h: h.get_fact(DeployedUnits))
    out = []
    for host, r in zip(hosts, results, strict=True):
        if isinstance(r, str):
            out.append(HostStatus(host.name, r))
        else:
            out.append(HostStatus(host.name, None, tuple(unit_status(u, catalog) for u in r)))
    return out


def stop(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, model: str, purge: bool, base: Options
) -> list[HostResult]:
    """Stop and remove the model's unit on every host (every card's); --purge: its file too."""
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operation import add_op
    from pyinfra.api.operations import run_ops
    from pyinfra.api.state import StateStage

    from tensorless_deploy.fleet.hosts import options_for
    from tensorless_deploy.operations.operations import unit_removed

    entries = catalog.find(model)
    state = new_state(inventory)
    errors = dict(
        zip(
            [h.name for h in hosts],
            on_each_host(state, hosts, lambda h: None, keep_connected=True),
            strict=True,
        )
    )
    live = [h for h in hosts if errors[h.name] is None]
    metas: dict[str, list[Any]] = {h.name: [] for h in live}
    try:
        state.set_stage(StateStage.Prepare)
        for h in live:
            opts = options_for(h.name, h.data, base)
            for e in entries:
                name = unit_name(e.recipe)
                paths = cache_paths(opts.models_dir, e.recipe) if purge else None
                res = add_op(
                    state,
                    unit_removed,
                    name=f"remove {name}",
                    host=h,
                    unit_name=name,
                    unit_paths=(f"{QUADLET_DIR}/{name}.container", f"{SYSTEMD_DIR}/{name}.service"),
                    paths=paths,
                )
                metas[h.name].append(res[h])
        state.set_stage(StateStage.Execute)
        try:
            run_ops(state)
        except PyinfraError as exc:
            if "No hosts remaining" not in str(exc):
                raise
    finally:
        disconnect(hosts)
    results = []
    for h in hosts:
        err = errors[h.name]
        if err is not None:
            results.append(HostResult(h.name, "failed", str(err)))
            continue
        ms = metas[h.name]
        failed = [m for m in ms if m.is_complete() and m.did_error()]
        changed = any(m.is_complete() and m.executed and m.did_change() for m in ms)
        lines = tuple(line for m in ms if m.is_complete() for line in _meta_lines(m))
        outcome: Outcome = "failed" if failed else ("changed" if changed else "unchanged")
        results.append(
            HostResult(h.name, outcome, None, steps=(StepResult("stop", outcome, lines),))
        )
    return results


def roll(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, request: DeployRequest, serial: int
) -> list[HostResult]:
    """deploy --serial N: N hosts at a time, the next batch only once this one is healthy; the
    first host that fails (restored to its previous unit by deploy itself) stops the roll, and
    the hosts after it are left untouched."""
    results: list[HostResult] = []
    stopped_by: str | None = None
    for start in range(0, len(hosts), serial):
        batch = hosts[start : start + serial]
        if stopped_by is not None:
            results += [
                HostResult(h.name, "untouched", f"the roll stopped at {stopped_by}") for h in batch
            ]
            continue
        done = deploy(inventory, batch, catalog, request)
        results += done
        bad = [r.host for r in done if not r.ok]
        if bad:
            stopped_by = ", ".join(bad)
    return results


def serving_digests(
    inventory: Any, hosts: Sequence[Any], catalog: Catalog, model: str
) -> dict[str, str | None]:
    """Which recipe digest each host's unit for MODEL serves now (None: none, or unreachable)."""
    names = {unit_name(e.recipe) for e in catalog.find(model)}
    out: dict[str, str | None] = {}
    for h in fleet_status(inventory, hosts, catalog):
        unit = next((u for u in h.units if u.unit in names), None)
        out[h.host] = unit.recipe_digest if unit is not None and unit.healthy else None
    return out


def _registry(image: str) -> str:
    first = image.split("/", 1)[0]
    return first if ("." in first or ":" in first or first == "localhost") else "docker.io"


def choose_transfer(
    state: Any, by_name: dict[str, Any], plans: dict[str, Any], mode: str
) -> dict[str, tuple[str, str]]:
    """pull or push per host, and why. auto: a cheap check from the host itself (HEAD of the
    model URL, GET of the registry's /v2/): push where either cannot be reached."""
    from tensorless_deploy.facts.deployed import HttpStatus

    out: dict[str, tuple[str, str]] = {}
    for name, plan in plans.items():
        if mode != "auto":
            out[name] = (mode, f"--transfer {mode}")
            continue
        h = by_name[name]
        model = host_fact(state, h, HttpStatus, url=plan.url, head=True)
        reg = _registry(plan.spec.image)
        registry = max(
            host_fact(state, h, HttpStatus, url=f"{scheme}://{reg}/v2/")
            for scheme in ("https", "http")
        )
        if model and registry:
            out[name] = ("pull", "the host reaches the model server and the registry")
        else:
            gone = [
                what for what, code in (("model server", model), ("registry", registry)) if not code
            ]
            out[name] = ("push", f"the host cannot reach the {' or the '.join(gone)}")
    return out


def pushing_plans(plans: dict[str, Any]) -> dict[str, Any]:
    import dataclasses

    from tensorless_deploy.fleet.push import remote_image_path

    return {
        n: dataclasses.replace(p, transfer="push", archive=remote_image_path(p.spec.image))
        for n, p in plans.items()
    }


def push(
    state: Any,
    by_name: dict[str, Any],
    plans: dict[str, Any],
    entries: Sequence[Entry],
    token: str | None,
) -> tuple[dict[str, str], dict[str, str]]:
    """Fetch model and image once on the controller, send them to every host that lacks them
    (resuming partial files, each byte read once). Returns the hosts that failed, with why, and
    what was sent to each host."""
    from tensorless_deploy.facts.deployed import ImagePresent, ModelBlob
    from tensorless_deploy.fleet.push import TransferError, image_archive
    from tensorless_deploy.local.run import LocalError, fetch_model, hub_cache_dir

    failed: dict[str, str] = {}
    sent: dict[str, list[str]] = {}
    by_sha = {e.recipe.model.sha256: e for e in entries}
    for sha in {p.sha256 for p in plans.values()}:
        group = {n: p for n, p in plans.items() if p.sha256 == sha}
        recipe = by_sha[sha].recipe
        needs_model = [
            n
            for n, p in group.items()
            if not host_fact(
                state,
                by_name[n],
                ModelBlob,
                blob=p.paths.blob,
                stamp=p.paths.stamp,
                snapshot=p.paths.snapshot,
            ).exists
        ]
        needs_image = [
            n
            for n, p in group.items()
            if not host_fact(
                state, by_name[n], ImagePresent, engine_bin=p.engine_bin, image=p.spec.image
            )
        ]
        try:
            if needs_model:
                blob, _ = fetch_model(recipe, hub_cache_dir(), token=token)
                _send(
                    "model",
                    blob,
                    [(n, by_name[n], group[n].paths.partial) for n in needs_model],
                    failed,
                    sent,
                )
            if needs_image:
                archive = image_archive(recipe.engine.image)
                _send(
                    "image",
                    archive,
                    [(n, by_name[n], group[n].archive) for n in needs_image],
                    failed,
                    sent,
                )
        except (LocalError, TransferError) as exc:
            failed.update({n: f"push: {exc.message}" for n in group})
    return failed, {n: "; ".join(parts) for n, parts in sent.items()}


def _send(
    what: str,
    source: Path,
    targets: list[tuple[str, Any, str]],
    failed: dict[str, str],
    sent: dict[str, list[str]],
) -> None:
    """One file to several hosts, each resuming from its partial; what went where is noted."""
    from tensorless_deploy.fleet.push import broadcast, open_receivers

    receivers = open_receivers(targets, source.stat().st_size)
    starts = {r.host: r.offset for r in receivers}
    broadcast(source, receivers)
    failed.update({r.host: r.error for r in receivers if r.error})
    for r in receivers:
        sent.setdefault(r.host, []).append(
            f"{what}: sent {r.sent} bytes (resumed from {starts[r.host]})"
        )
