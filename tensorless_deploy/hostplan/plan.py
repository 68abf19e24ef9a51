"""The host plan: one pure function from (host facts, the catalog's recipes for a model, resolved
options) to what that host serves and why.

It chooses the recipe (the model's first recipe whose card a GPU here matches), judges the host
with every check and its fix (decisions.checks), and lays out the instances to serve: the cards,
the launch spec, the unit text, the paths and the address. doctor prints its verdict, plan sizes
its cards, deploy and serve apply it, run starts its instance in the foreground, status and stop
compare with it. They cannot disagree because there is nothing else to consult.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tensorless_deploy.decisions.checks import (
    Check,
    EngineName,
    Existing,
    Verdict,
    gpu_fits_card,
    host_verdict,
    match_gpus,
    no_card_verdict,
    pick_engine,
    state_refusal,
)
from tensorless_deploy.decisions.device import expected_device
from tensorless_deploy.decisions.memory import CardFit, fit_card, memory_check, own_bytes
from tensorless_deploy.decisions.options import Options
from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.facts.values import (
    LABEL_MODEL,
    LABEL_PORT,
    Gpu,
    HostFacts,
    Podman,
    ToolUnit,
)
from tensorless_deploy.gguf.sizing import SizingProblem, Sizings
from tensorless_deploy.hub import CachePaths, resolve_url
from tensorless_deploy.launch.container import (
    HEALTH_ON_FAILURE_MIN_PODMAN,
)
from tensorless_deploy.launch.render import UnitFile, render_quadlet, render_service
from tensorless_deploy.launch.spec import (
    API_KEY_NAME,
    RESTART_STEPS_MIN_SYSTEMD,
    SECRETS_DIR,
    TLS_CERT_NAME,
    TLS_KEY_NAME,
    LaunchSpec,
    build_launch_spec,
)
from tensorless_deploy.recipe.catalog import Catalog, Entry, model_paths, unit_name
from tensorless_deploy.recipe.schema import Recipe

# Where an engine lives when the survey could not say (surveys older than the engine-paths
# section): the distributions' own packages put both here.
DEFAULT_ENGINE_BINS: dict[EngineName, str] = {
    "podman": "/usr/bin/podman",
    "docker": "/usr/bin/docker",
}
# Checks that decide whether the machine has the card at all: with `run --dry-run` only these
# refuse; the others are shown as what a real run would stop at.
CARD_CHECKS = ("driver.present", "driver.loaded", "gpu.responsive", "card.match", "driver.version")


@dataclass(frozen=True)
class SurveyedHost:
    """One host after the survey: its resolved options, and its facts or why there are none."""

    name: str
    options: Options
    facts: HostFacts | None
    error: str | None = None


@dataclass(frozen=True)
class Instance:
    """One llama-server the host runs for the plan: its cards, its container, its unit."""

    ordinal: int
    gpus: tuple[Gpu, ...]
    spec: LaunchSpec
    unit: UnitFile | None  # None for a foreground run (no unit is written)

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class HostPlan:
    """Everything one host needs for one model, decided before any command runs."""

    host: str
    model: str | None  # the model's repo id; None: readiness only (no MODEL asked)
    options: Options
    entry: Entry | None  # the recipe chosen for this host's cards
    verdict: Verdict
    instances: tuple[Instance, ...] = ()
    paths: CachePaths | None = None
    url: str | None = None  # where the host downloads the model
    engine_bin: str | None = None
    quadlet_bin: str | None = None
    problem: str | None = None  # a value that cannot be written into a unit safely
    surplus: tuple[ToolUnit, ...] = ()  # instances of the recipe there beyond the plan: removed
    fits: tuple[CardFit, ...] = ()  # the memory verdict of every card matching the recipe

    def fit(self, gpu_index: int) -> CardFit | None:
        """The memory verdict of one card (None: it does not match the recipe, or memory was
        not judged)."""
        return next((f for f in self.fits if f.gpu.index == gpu_index), None)

    @property
    def ok(self) -> bool:
        return self.verdict.ok and self.problem is None and bool(self.instances)

    @property
    def recipe(self) -> Recipe | None:
        return self.entry.recipe if self.entry is not None else None

    @property
    def card(self) -> str | None:
        return self.entry.recipe.card.id if self.entry is not None else None

    def failed(self) -> tuple[Check, ...]:
        return self.verdict.failed()

    def blocking(self, dry_run: bool) -> tuple[Check, ...]:
        """The checks that stop the action: every failed one, or for a dry run only those
        that say this machine lacks the card (the state table of a dry run is the CLI's)."""
        failed = self.failed()
        if not dry_run:
            return failed
        return tuple(c for c in failed if c.id in CARD_CHECKS)

    def why(self) -> str:
        """One line: the failed checks, or the problem."""
        if self.problem:
            return self.problem
        return "; ".join(f"{c.id}: {c.evidence}" for c in self.failed()) or "refused"


def secret_sources(options: Options, spec: LaunchSpec) -> tuple[tuple[str, str], ...]:
    """(secret name, path on the controller) for every file the spec's container mounts: what
    operations.secrets installs on a host, and what a foreground run stages on this machine."""
    paths = {
        API_KEY_NAME: options.api_key_file,
        TLS_CERT_NAME: options.tls_cert_file,
        TLS_KEY_NAME: options.tls_key_file,
    }
    out = []
    for s in spec.secrets:
        source = paths[s.name]
        if source is None:  # the spec mounts only what the options name
            raise ValueError(f"{spec.name}: no file for {s.name}")
        out.append((s.name, source))
    return tuple(out)


def select(entries: Sequence[Entry], facts: HostFacts) -> Entry | None:
    """The model's recipe for this host: the first whose card a GPU here matches (the driver is a
    check of its own, with the driver to install). When nvidia-smi cannot list the GPUs, the
    first recipe, so that the driver checks say why; None: no card here fits any recipe."""
    if facts.gpus.state != "ok":
        return entries[0] if entries else None
    for entry in entries:
        if any(gpu_fits_card(g, entry.recipe) for g in facts.gpus.gpus):
            return entry
    return None


def existing_on(facts: HostFacts, unit_names: Sequence[str], blob: str | None) -> Existing:
    """What the tool already put there, as the survey read it (nothing known: nothing there)."""
    tool = facts.tool
    if tool is None:
        return Existing()
    ports = []
    for u in tool.units:
        port = u.labels.get(LABEL_PORT, "")
        if port.isdigit():
            ports.append((int(port), u.name))
    own = tuple(n for n in unit_names if tool.unit(n) is not None)
    present = blob is not None and tool.blob(blob) is not None
    return Existing(own_units=own, model_present=present, port_units=tuple(ports))


def engine_bin(facts: HostFacts, engine: EngineName) -> str:
    """The engine's binary as the survey found it, else where the distributions put it."""
    engines = facts.engines
    found = None
    if engines is not None:
        found = engines.podman.path if engine == "podman" else engines.docker.path
    return found or DEFAULT_ENGINE_BINS[engine]


@dataclass(frozen=True)
class Layout:
    """Which cards get an instance each, on which port, under which unit name; or why the
    operator's choice cannot be met (refused, never guessed around)."""

    instances: tuple[tuple[str, int, Gpu], ...]  # (unit name, port, card)
    problem: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.instances)

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(port for _, port, _ in self.instances)


def instance_name(base: str, ordinal: int) -> str:
    """Instance 0 keeps the recipe's unit name; the others add their ordinal: base-1, base-2."""
    return base if ordinal == 0 else f"{base}-{ordinal}"


def _describe(gpus: Sequence[Gpu]) -> str:
    return ", ".join(f"GPU {g.index} {g.uuid or ''}".strip() for g in gpus) or "none"


def layout(
    usable: Sequence[Gpu], base: str, options: Options, refused: Sequence[CardFit] = ()
) -> Layout:
    """One instance per usable card (the recipe was measured on one card): all of them, the
    first N, or the ones the inventory lists (tensorless_instances); ports from tensorless_port
    plus the ordinal, or the tensorless_ports list. refused: matching cards that cannot hold
    the model (the memory verdict), named with why when the choice needs them."""
    cards = sorted(usable, key=lambda g: g.index)

    def why_not() -> str:
        return "".join(f"; GPU {f.gpu.index} does not fit: {f.why}" for f in refused)

    choice = options.instances
    chosen: list[Gpu]
    if choice == "all":
        chosen = cards
    elif isinstance(choice, int):
        if choice > len(cards):
            return Layout(
                (),
                f"{choice} instance(s) asked, but {len(cards)} usable card(s) "
                f"here: {_describe(cards)}{why_not()}",
            )
        chosen = cards[:choice]
    else:
        chosen = []
        for want in choice:
            hit = next((g for g in cards if g.index == want or g.uuid == want), None)
            if hit is None:
                return Layout(
                    (),
                    f"GPU {want} is not a usable card here (usable: {_describe(cards)}){why_not()}",
                )
            chosen.append(hit)
    if options.ports is not None and len(options.ports) != len(chosen):
        return Layout((), f"{len(options.ports)} port(s) listed for {len(chosen)} instance(s)")
    ports = (
        list(options.ports)
        if options.ports is not None
        else [options.port + i for i in range(len(chosen))]
    )
    bad = [p for p in ports if not 0 < p < 65536]
    if bad:
        return Layout((), f"port {bad[0]} for instance {ports.index(bad[0])} is beyond 65535")
    return Layout(tuple((instance_name(base, i), ports[i], g) for i, g in enumerate(chosen)))


def instance_spec(
    recipe: Recipe,
    options: Options,
    *,
    engine: EngineName,
    model_path: str,
    gpus: Sequence[Gpu],
    cpus: int | None,
    name: str,
    port: int,
    bind: str | None = None,
    heal: bool = True,
    secrets_root: str = SECRETS_DIR,
) -> LaunchSpec:
    """One instance's launch spec from the resolved options: what every plan (a host's, an
    export target's) passes to build_launch_spec. gpus: its cards (none: the target's scheduler
    picks one); bind: where llama-server binds, when not options.bind (in a pod, its own
    address)."""
    values: dict[str, Any] = dict(
        engine=engine,
        model_path=model_path,
        gpu_uuids=tuple(g.uuid for g in gpus if g.uuid is not None),
        cpus=cpus,
        port=port,
        bind=options.bind if bind is None else bind,
        context=options.context,
        extra_args=tuple(options.extra_args),
        name=name,
        api_key=options.api_key_file is not None,
        tls=options.tls,
        metrics=options.metrics,
        pids_limit=options.pids_limit,
        heal=heal,
        secrets_root=secrets_root,
        device=expected_device(recipe.engine.arch, gpus),
        cors_origins=options.cors_origins,
    )
    # a spec is a pure, immutable value of these: made once per distinct set (a plan over a
    # fleet asks for the same instance on every host with the same cards)
    key = (id(recipe), *values.values())
    hit = _SPECS.get(key)
    if hit is not None and hit[0] is recipe:
        return hit[1]
    spec = build_launch_spec(recipe, **values)
    if len(_SPECS) >= _SPECS_MAX:
        _SPECS.clear()
    _SPECS[key] = (recipe, spec)
    return spec


_SPECS: dict[tuple[Any, ...], tuple[Recipe, LaunchSpec]] = {}  # key -> (recipe kept, spec)
_SPECS_MAX = 4096


def surplus_units(
    facts: HostFacts, base: str, keep: Sequence[str], model: str | None = None
) -> tuple[ToolUnit, ...]:
    """Instances of this recipe on the host that the plan no longer has (base-N beyond the
    count): they are stopped and removed when the plan is applied. A unit of that name that
    serves another model is never one of them."""
    if facts.tool is None:
        return ()
    pattern = re.compile(re.escape(base) + r"(-[0-9]+)?")
    key = model.casefold() if model is not None else None

    def ours(u: ToolUnit) -> bool:
        label = u.labels.get(LABEL_MODEL)
        return key is None or label is None or label.casefold() == key

    return tuple(
        u for u in facts.tool.units if pattern.fullmatch(u.name) and u.name not in keep and ours(u)
    )


def _engine(facts: HostFacts, options: Options) -> EngineName:
    """The engine the plan writes units for: the one pick_engine finds on the host, else the
    option's (podman unless it says docker)."""
    picked = pick_engine(facts, options.engine) if facts.engines is not None else None
    return picked or ("docker" if options.engine == "docker" else "podman")


def _memory_fits(
    entry: Entry,
    facts: HostFacts,
    options: Options,
    usable: Sequence[Gpu],
    base: str,
    sizing: Sizings | None,
) -> tuple[CardFit, ...]:
    """The memory verdict of every usable card against the recipe's sizing (what the model's
    own containers hold there counts as free); none when memory is not judged."""
    if sizing is None or not usable:
        return ()
    recipe = entry.recipe
    sized = sizing.get(entry.path) or SizingProblem("pending", "GGUF header not read")
    context = options.context if options.context is not None else recipe.run.context
    own = own_containers(facts, recipe.model.hf_repo, base)
    return tuple(fit_card(sized, g, context, own_bytes(g, facts.gpu_apps, own)) for g in usable)


def _layout_checks(facts: HostFacts, recipe: Recipe, lay: Layout) -> tuple[Check, ...]:
    """The layout's own rows: why the operator's choice of cards cannot be met, else a unit of
    the plan's name that serves another model; and with several instances, where each runs."""
    if lay.problem is not None:
        return (
            Check(
                "instances.cards",
                "fail",
                lay.problem,
                'set tensorless_instances ("all", a count, or GPU indices/UUIDs) and '
                "tensorless_ports to what this host has",
            ),
        )
    owner = _other_owner(facts, recipe.model.hf_repo, lay.names)
    out = (owner,) if owner is not None else ()
    if len(lay.instances) > 1:
        seen = "; ".join(f"{n} on GPU {g.index} at port {p}" for n, p, g in lay.instances)
        out = (*out, Check("instances.cards", "ok", seen))
    return out


def _place(
    entry: Entry, facts: HostFacts, options: Options, base: str, sizing: Sizings | None
) -> tuple[tuple[CardFit, ...], Layout]:
    """The memory verdict of every matching card, and the layout of the instances on the cards
    that hold the model."""
    recipe = entry.recipe
    usable = match_gpus(recipe, facts.gpus.gpus).usable if facts.gpus.state == "ok" else ()
    fits = _memory_fits(entry, facts, options, usable, base, sizing)
    refused = tuple(f for f in fits if f.fits is False)
    usable = tuple(g for g in usable if all(f.gpu is not g for f in refused))
    return fits, layout(usable, base, options, refused) if usable else Layout(())


def _plan_verdict(
    facts: HostFacts,
    recipe: Recipe,
    options: Options,
    paths: CachePaths,
    base: str,
    fits: Sequence[CardFit],
    lay: Layout,
    units: bool,
) -> Verdict:
    """Every check of the host for the recipe, then the memory row and the layout's rows."""
    # with no instance laid out (no card holds it), the recipe's own unit is still its own
    existing = existing_on(facts, lay.names or (base,), paths.blob)
    ports = list(lay.ports) or [options.port]
    # units are root's: a plan that writes them needs the host's commands to run as root
    verdict = host_verdict(facts, recipe, options, existing=existing, ports=ports, root=units)
    memory = memory_check(fits)
    extra = (*((memory,) if memory is not None else ()), *_layout_checks(facts, recipe, lay))
    if not extra:
        return verdict
    return dataclasses.replace(verdict, checks=(*verdict.checks, *extra))


@dataclass(frozen=True)
class _Writer:
    """How this host's units are written: the engine, its binary, quadlet or a service, and
    the keys the host's podman and systemd take."""

    engine: EngineName
    binary: str
    podman: Podman | None
    quadlet: bool  # a podman whose quadlet has every key the units need (facts.values)
    heal: bool  # podman's HealthOnFailure
    backoff: bool  # RestartSteps= (an older systemd would warn of an unknown key)


def _writer(facts: HostFacts, engine: EngineName, units: bool) -> _Writer:
    podman = facts.engines.podman if facts.engines is not None else None
    version = podman.version if podman is not None else None
    systemd = facts.init.systemd_version if facts.init is not None else None
    return _Writer(
        engine=engine,
        binary=engine_bin(facts, engine),
        podman=podman,
        quadlet=units and engine == "podman" and podman is not None and podman.quadlet_supported,
        heal=engine == "podman" and (version is None or version >= HEALTH_ON_FAILURE_MIN_PODMAN),
        backoff=systemd is not None and systemd >= RESTART_STEPS_MIN_SYSTEMD,
    )


def _spec(
    recipe: Recipe,
    facts: HostFacts,
    options: Options,
    writer: _Writer,
    paths: CachePaths,
    slot: tuple[str, int, Gpu],
    secrets_root: str,
) -> LaunchSpec:
    """The launch spec of one laid-out instance (unit name, port, card)."""
    name, port, gpu = slot
    return instance_spec(
        recipe,
        options,
        engine=writer.engine,
        model_path=paths.blob,
        gpus=(gpu,),
        cpus=facts.cpus,
        name=name,
        port=port,
        heal=writer.heal,
        secrets_root=secrets_root,
    )


def _unit(spec: LaunchSpec, digest: str, writer: _Writer) -> UnitFile:
    """The unit file of one instance: a quadlet where the host's podman takes one, else a
    service; raises TensorlessError when this host's values cannot make a safe unit."""
    if writer.quadlet and writer.podman is not None:
        return render_quadlet(
            spec,
            digest=digest,
            notify_healthy=writer.podman.notify_healthy_supported,
            restart_backoff=writer.backoff,
        )
    return render_service(
        spec, digest=digest, engine_bin=writer.binary, restart_backoff=writer.backoff
    )


def _instances(
    entry: Entry,
    facts: HostFacts,
    options: Options,
    writer: _Writer,
    paths: CachePaths,
    lay: Layout,
    *,
    units: bool,
    secrets_root: str,
) -> tuple[tuple[Instance, ...], str | None]:
    """Every laid-out instance with its spec and (units) its unit file; and the problem of the
    last unit that could not be written safely, if any."""
    instances: list[Instance] = []
    problem: str | None = None
    for ordinal, slot in enumerate(lay.instances):
        spec = _spec(entry.recipe, facts, options, writer, paths, slot, secrets_root)
        unit: UnitFile | None = None
        if units:
            try:
                unit = _unit(spec, entry.digest, writer)
            except TensorlessError as exc:  # this host's values cannot make a safe unit
                problem = exc.message
        instances.append(Instance(ordinal, (slot[2],), spec, unit))
    return tuple(instances), problem


def plan_host(
    host: str,
    facts: HostFacts,
    entries: Sequence[Entry],
    options: Options,
    *,
    sizing: Sizings | None,
    units: bool = True,
    secrets_root: str = SECRETS_DIR,
    name: str | None = None,
) -> HostPlan:
    """The host plan for one model (all its recipes, catalog order). sizing: each recipe's
    memory sizing (gguf.sizing.read_sizings, from the GGUF headers): every matching card is
    judged against it and only cards that hold the model get an instance; None: memory is not
    judged (status and prepare compare or prepare, they place nothing). units: render the unit
    files (deploy, serve, doctor); a foreground run needs none. secrets_root: where the
    operator's key and TLS files are installed for the container (a run: this machine's own).
    name: the instances' name instead of the recipe's unit name (gate run's scratch instance,
    which must never be taken for the serving unit)."""
    model = entries[0].recipe.model.hf_repo if entries else None
    entry = select(entries, facts)
    if entry is None:
        verdict = no_card_verdict(
            model or "?", [e.recipe for e in entries], facts, options, root=units
        )
        return HostPlan(host, model, options, None, verdict)
    recipe = entry.recipe
    m = recipe.model
    paths = model_paths(options.models_dir, recipe)
    base = name or unit_name(recipe)
    fits, lay = _place(entry, facts, options, base, sizing)
    verdict = _plan_verdict(facts, recipe, options, paths, base, fits, lay, units)
    writer = _writer(facts, _engine(facts, options), units)
    instances, problem = _instances(
        entry, facts, options, writer, paths, lay, units=units, secrets_root=secrets_root
    )
    return HostPlan(
        host=host,
        model=model,
        options=options,
        entry=entry,
        verdict=verdict,
        instances=instances,
        paths=paths,
        url=resolve_url(m.hf_repo, m.revision, m.file),
        engine_bin=writer.binary,
        quadlet_bin=(
            writer.podman.quadlet_path if writer.quadlet and writer.podman is not None else None
        ),
        problem=problem,
        surplus=surplus_units(facts, base, lay.names, m.hf_repo) if lay.problem is None else (),
        fits=fits,
    )


def _other_owner(facts: HostFacts, model: str, names: Sequence[str]) -> Check | None:
    """A unit of the plan's name that serves another model (two recipes of other catalogs, or
    of an older one, that share a unit name): deploying would replace it, so it is refused."""
    if facts.tool is None:
        return None
    for name in names:
        u = facts.tool.unit(name)
        other = u.labels.get(LABEL_MODEL) if u is not None else None
        if other is not None and other.casefold() != model.casefold():
            return Check(
                "unit.owner",
                "fail",
                f"{name} on this host serves {other} (its {LABEL_MODEL} label), not {model}: "
                "deploying would replace another model's unit",
                f"give the recipe a model.name of its own, or take the other model down first "
                f"(tensorless-deploy stop {other})",
            )
    return None


def own_containers(facts: HostFacts, model: str, base: str) -> tuple[str, ...]:
    """The containers of this model's units on the host (a unit names its container after
    itself): what they hold on a card is free when the model is planned again."""
    if facts.tool is None:
        return ()
    pattern = re.compile(re.escape(base) + r"(-[0-9]+)?")
    key = model.casefold()
    return tuple(
        u.name
        for u in facts.tool.units
        if pattern.fullmatch(u.name) or u.labels.get(LABEL_MODEL, "").casefold() == key
    )


def readiness(host: str, facts: HostFacts, catalog: Catalog, options: Options) -> HostPlan:
    """No model asked: is the host ready at all, and which of the catalog's recipes fit it."""
    listing = [(e.path, e.recipe) for e in catalog.entries]
    verdict = host_verdict(facts, None, options, listing, existing_on(facts, (), None))
    return HostPlan(host, None, options, None, verdict)


def dry_run_refusal(plan: HostPlan) -> str | None:
    """The seed's state table for a dry run (an unpublished recipe is shown, a draft needs
    --allow-draft); None when the preview may be shown."""
    if plan.recipe is None:
        return None
    return state_refusal(plan.recipe, "dry_run", plan.options.allow_draft)


PREVIEW_UUID = "GPU-PREVIEW"  # the card a preview stands for is not on this machine


def recipe_card(recipe: Recipe, index: int, uuid: str | None = None) -> Gpu:
    """One card exactly as the recipe asks for it (compute capability, least memory, oldest
    driver): a preview's stand-in for a card not on this machine, an export target's card."""
    card = recipe.card
    return Gpu(
        index=index,
        uuid=uuid,
        name=card.title or card.id,
        compute_cap=card.compute_capability,
        memory_total_mib=card.min_memory_mib,
        memory_used_mib=0,
        driver_version=card.min_driver,
    )


def with_preview_card(facts: HostFacts, recipe: Recipe) -> HostFacts:
    """This machine's facts with its GPUs replaced by one card exactly as the recipe asks for
    (compute capability, least memory, oldest driver): what `run --dry-run --card ID` previews
    on a machine without that card. Labelled by PREVIEW_UUID wherever a device is named."""
    gpu = recipe_card(recipe, 0, PREVIEW_UUID)
    report = facts.gpus.model_copy(update={"state": "ok", "gpus": (gpu,), "exit_code": 0})
    return facts.model_copy(update={"gpus": report})
