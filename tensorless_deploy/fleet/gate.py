"""gate run: a recipe measured on its card, as its receipts are measured, through a scratch
instance that touches no serving unit; and the receipt (with --promote, the release) that the
measurement earns.

On the first inventory host with an idle card of the recipe's (hostplan.gate.scratch_plan): the
image and the model as deploy fetches them (operations.image, operations.model), then the
container the deploy path would run, as a transient systemd unit of its own name and port
(scripts/gate-start.sh: systemd-run, no unit file, no daemon-reload), measured over an SSH
channel to the host's loopback with bench's own requests (local.bench), then stopped, removed
and verified gone (scripts/gate-stop.sh) on every way out: an error, Ctrl-C, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import dataclasses
import posixpath
import secrets
import shlex
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tensorless_deploy.decisions.checks import Tuning, gpu_fits_card, tuning
from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.facts.values import Gpu
from tensorless_deploy.fleet.connect import (
    disconnect,
    loopback,
    new_state,
    on_each_host,
    run_script,
    survey_and_size,
)
from tensorless_deploy.hostplan.gate import ScratchPlan, scratch_plan
from tensorless_deploy.launch.container import run_argv
from tensorless_deploy.launch.spec import scratch_name
from tensorless_deploy.local.bench import (
    TOLERANCE,
    BenchError,
    Comparison,
    Summary,
    compare,
    measure,
    measure_prefill,
    over_channel,
    run_notes,
    summarise,
)
from tensorless_deploy.recipe.catalog import Entry, parse_recipe
from tensorless_deploy.recipe.gate import (
    DIGEST,
    Measured,
    Receipt,
    RunFacts,
    judge,
    promotion_refusals,
    write_receipt,
)
from tensorless_deploy.recipe.schema import Recipe

PACKAGE = "tensorless_deploy.fleet"
RUNS = 3  # the receipts' median of 3 (docs/design.md)
# How long a scratch instance may live beyond its start: the measurement's budget. A controller
# that vanishes mid-run leaves it to systemd's RuntimeMaxSec, which stops it then.
MEASURE_BUDGET_S = 1800
STOP_TIMEOUT_S = 150  # gate-stop.sh: 60 s stop, 60 s rm, 30 s to see it all gone


class GateError(TensorlessError):
    """gate run could not measure, or refused to write what it measured."""


@dataclass(frozen=True)
class GateRequest:
    entry: Entry
    text: str  # the recipe file as read before the run: the receipt is written into it
    flags: Flags = field(default_factory=Flags)  # the extra llama-server args (untuned)
    promote: bool = False
    date: str = ""  # the day of the measurement, for the receipt's source
    token_source: Callable[[], str | None] | None = None  # asked only when the host downloads
    tolerance: float = TOLERANCE


@dataclass(frozen=True)
class GateResult:
    host: str
    unit: str  # the scratch instance's transient unit (and container)
    port: int
    gpu: Gpu
    driver: str | None
    tuning: Tuning
    image_seen: str | None  # the digest the container ran, as the host reported it
    summary: Summary
    prefill_4k: Summary | None
    prefill_note: str | None  # why there is no prefill at 4k
    comparisons: tuple[Comparison, ...]
    receipt: Receipt
    promote: bool
    refusals: tuple[str, ...]  # why --promote was refused (empty: promoted, or not asked)
    text: str | None  # the recipe file to write; None: nothing is to be written
    not_written: str | None  # why nothing is to be written
    cleanup: tuple[str, ...]  # what gate-stop.sh read back: the unit, container, port gone

    @property
    def promoted(self) -> bool:
        return self.promote and not self.refusals and self.text is not None


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP end the run in its main greenlet, wherever pyinfra's greenlets
    are when the signal comes (there, a KeyboardInterrupt would be printed by gevent and land in
    the main greenlet only by way of its hub), so the scratch instance is removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from gevent import getcurrent

    main = getcurrent()

    def interrupt(signum: int, frame: Any) -> None:
        if getcurrent() is main:
            raise KeyboardInterrupt
        main.throw(KeyboardInterrupt)

    wanted = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, interrupt) for s in wanted}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextmanager
def _uninterrupted() -> Iterator[None]:
    """The removal runs to its end: a second Ctrl-C or SIGTERM waits for it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, signal.SIG_IGN) for s in wanted}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def gate_receipt(
    recipe: Recipe,
    summary: Summary,
    prefill: Summary | None,
    prefill_note: str | None,
    gpu: Gpu,
    driver: str | None,
    date: str,
) -> Receipt:
    """The [receipt] of a gate run: the figures, and a source naming the engine release, the
    image by digest, the card, the driver and the date."""
    e = recipe.engine
    source = (
        f"tensorless-deploy gate run {date}: {e.release}, {e.image}, {recipe.card.id} "
        f"({gpu.name}), driver {driver or 'unknown'}"
    )
    decode = {"short": round(summary.decode_median, 2)}
    fill = {"short": round(summary.prefill_median, 2)}
    line = f"Decode {summary.decode_median:.2f} tok/s at short context"
    notes = run_notes(summary)
    notes[0] = notes[0].removesuffix(".") + f", context {recipe.run.context}."
    if prefill is not None:
        fill["ctx_4k"] = round(prefill.prefill_median, 2)
        line += f", prefill {prefill.prefill_median:.2f} tok/s at 4k"
        notes.append(
            f"prefill_tps.ctx_4k: median of {prefill.runs} runs of a {prefill.prompt_n}-token "
            f"prompt (4k of context with the token generated), spread "
            f"{prefill.prefill_min:.2f}-{prefill.prefill_max:.2f} tok/s."
        )
    else:
        notes.append(f"Prefill at 4k not measured: {prefill_note}.")
    return Receipt(
        source=source,
        summary=f"{line}, on {gpu.name} with {e.release}.",
        decode_tps=decode,
        prefill_tps=fill,
        notes=notes,
    )


def _choose(
    state: Any, hosts: Sequence[Any], request: GateRequest, flags: Flags, name: str
) -> tuple[Any, Any, ScratchPlan]:
    """The first host (inventory order) that can run the scratch instance; else every host's
    reason, one line each."""
    from tensorless_deploy.facts.pyinfra import DeployedUnits

    surveyed, sizing = survey_and_size(state, hosts, flags, [request.entry], keep_connected=True)
    by_name = {h.name: h for h in hosts}
    live = [by_name[s.name] for s in surveyed if s.facts is not None]
    found = dict(
        zip(
            [h.name for h in live],
            on_each_host(
                state,
                live,
                lambda h: DeployedUnits.typed(h.get_fact(DeployedUnits)),
                keep_connected=True,
            ),
            strict=True,
        )
    )
    reasons = []
    for s in surveyed:
        units = found.get(s.name)
        if s.facts is None or units is None:
            reasons.append(f"{s.name}: {s.error}")
            continue
        if isinstance(units, str):
            reasons.append(f"{s.name}: {units}")
            continue
        sp = scratch_plan(s.name, s.facts, request.entry, s.options, units, name, sizing)
        if sp.ok:
            return by_name[s.name], s, sp
        reasons.append(f"{s.name}: {sp.why()}")
    recipe = request.entry.recipe
    raise GateError(
        f"no host can measure {recipe.model.hf_repo} on {recipe.card.id}: " + "; ".join(reasons),
        fix="tensorless-deploy doctor -i INVENTORY MODEL says what each host lacks",
    )


def _fetch(state: Any, host: Any, surveyed: Any, sp: ScratchPlan, request: GateRequest) -> None:
    """The image by digest and the verified model, exactly as deploy fetches them."""
    from tensorless_deploy.fleet.runner import FAILING, Step, apply_steps
    from tensorless_deploy.operations.image import image
    from tensorless_deploy.operations.model import model

    plan = sp.plan
    assert plan is not None and plan.recipe is not None and plan.paths is not None
    recipe, paths = plan.recipe, plan.paths
    tool = surveyed.facts.tool
    there = tool is not None and tool.verified(paths.blob, paths.snapshot, paths.link_target)
    token = request.token_source() if request.token_source and not there else None
    m = recipe.model
    steps = [
        Step("image", image, dict(engine_bin=plan.engine_bin, image=recipe.engine.image)),
        Step(
            "model",
            model,
            dict(
                models_dir=plan.options.models_dir,
                repo=m.hf_repo,
                revision=m.revision,
                filename=m.file,
                sha256=m.sha256,
                size=m.size_bytes,
                url=plan.url,
                token=token,
            ),
        ),
    ]
    done = apply_steps(state, [host], {host.name: steps})[host.name]
    if not done.ok:
        failed = next((s for s in done.steps if s.outcome in FAILING), None)
        said = "; ".join(failed.output[-3:]) if failed and failed.output else done.reason
        raise GateError(f"{host.name}: {failed.name if failed else 'fetch'} failed: {said}")


def _digests(lines: Sequence[str]) -> list[str]:
    return [d for line in lines if line.startswith("@image ") for d in DIGEST.findall(line)]


def gate_run(inventory: Any, hosts: Sequence[Any], request: GateRequest) -> GateResult:
    """Measure request.entry's recipe on the first host with an idle card of its own, and say
    what may be written: the new receipt (tuned runs only), with --promote also released, only
    when every promotion condition held."""
    recipe = request.entry.recipe
    tune = tuning(recipe, None, request.flags.extra_args)
    if request.promote and not tune.tuned:
        raise GateError(
            "--promote refused: the run would be untuned (" + "; ".join(tune.reasons) + "); "
            "nothing was started",
            fix="promote what the recipe says: put the flags into [run].args first",
        )
    flags = dataclasses.replace(request.flags, allow_draft=True)
    with _signals_interrupt():
        return _gate_run(inventory, hosts, request, tune, flags)


def _gate_run(
    inventory: Any, hosts: Sequence[Any], request: GateRequest, tune: Tuning, flags: Flags
) -> GateResult:
    # surveyed under each host's lock (fleet.lock), so the idle card it chooses stays idle: the
    # chosen host's lock is held until its scratch instance is gone, the others' let go at once
    lock = f"gate run {request.entry.recipe.model.hf_repo}"
    state = new_state(inventory, flags, lock=lock)
    name = scratch_name(request.entry.recipe, secrets.token_hex(3))
    try:
        host, surveyed, sp = _choose(state, hosts, request, flags, name)
        disconnect([h for h in hosts if h is not host])
        _fetch(state, host, surveyed, sp, request)
        plan, spec = sp.plan, sp.instance.spec
        assert plan is not None and plan.engine_bin is not None and sp.gpu is not None
        svc = f"{spec.name}.service"
        measured: tuple[Summary, Summary | None, str | None, list[str]] | None = None
        failure: TensorlessError | None = None
        try:
            ok, out, err = run_script(
                state,
                host,
                PACKAGE,
                "gate-start",
                spec.start_timeout_s + 60,
                svc=svc,
                name=spec.name,
                argv=shlex.join(run_argv(spec, plan.engine_bin, health=True)),
                url=spec.health_url,
                timeout=spec.start_timeout_s,
                runtime=spec.start_timeout_s + MEASURE_BUDGET_S,
                engine=plan.engine_bin,
            )
            if not ok:
                why = " ".join(err[:1] + [line.strip() for line in err[1:]][-8:])
                raise GateError(f"{host.name}: the scratch instance did not start: {why}")
            connect = over_channel(loopback(host, "127.0.0.1", spec.port))
            summary = summarise(measure(connect, RUNS))
            try:
                prefill: Summary | None = summarise(measure_prefill(connect, RUNS))
                note = None
            except BenchError as exc:
                prefill, note = None, exc.message
            measured = (summary, prefill, note, _digests(out))
        except BenchError as exc:
            failure = GateError(f"{host.name}: {spec.name}: {exc.message}")
        except GateError as exc:
            failure = exc
        finally:
            with _uninterrupted():
                gone, said, left = run_script(
                    state,
                    host,
                    PACKAGE,
                    "gate-stop",
                    STOP_TIMEOUT_S,
                    svc=svc,
                    name=spec.name,
                    port=spec.port,
                    engine=plan.engine_bin,
                )
            if not gone:
                why = "; ".join(left) or "gate-stop.sh did not finish"
                raise GateError(
                    f"{host.name}: the scratch instance {spec.name} was not removed: {why}"
                    + (f" (and before that: {failure.message})" if failure else ""),
                    fix=f"remove it by hand: systemctl stop {svc}; "
                    f"{posixpath.basename(plan.engine_bin)} rm -f {spec.name}",
                )
    finally:
        disconnect(hosts)
    if failure is not None:
        raise failure
    assert measured is not None
    summary, prefill, note, seen = measured
    return _judged(request, surveyed, sp, tune, summary, prefill, note, seen, tuple(said))


def _judged(
    request: GateRequest,
    surveyed: Any,
    sp: ScratchPlan,
    tune: Tuning,
    summary: Summary,
    prefill: Summary | None,
    note: str | None,
    seen: list[str],
    cleanup: tuple[str, ...],
) -> GateResult:
    """What the measurement earns: the receipt, the promotion's verdict, the file's text."""
    entry, recipe = request.entry, request.entry.recipe
    gpu, spec = sp.gpu, sp.instance.spec
    assert gpu is not None
    driver = gpu.driver_version or surveyed.facts.driver_version
    comparisons = tuple(compare(summary, recipe, request.tolerance, prefill))
    image_seen = seen[0] if len(set(seen)) == 1 else None
    if recipe.engine.digest in seen:
        image_seen = recipe.engine.digest
    facts = RunFacts(
        tuned=tune.tuned,
        untuned_reasons=tune.reasons,
        card=recipe.card.id,
        card_seen=recipe.card.id if gpu_fits_card(gpu, recipe) else None,
        image=recipe.engine.image,
        image_seen=image_seen,
        comparisons=tuple(Measured(c.key, c.measured, c.receipt, c.meets) for c in comparisons),
        tolerance=request.tolerance,
    )
    refusals = tuple(promotion_refusals(facts)) if request.promote else ()
    receipt = gate_receipt(recipe, summary, prefill, note, gpu, driver, request.date)
    text: str | None = None
    not_written: str | None = None
    if not tune.tuned:
        not_written = (
            "the run was untuned (" + "; ".join(tune.reasons) + "): its numbers are not the "
            "recipe's"
        )
    elif refusals:
        not_written = "--promote refused: " + "; ".join(refusals)
    else:
        text = write_receipt(request.text, receipt, promote=request.promote)
        _check_written(entry, request.text, text)
    return GateResult(
        host=sp.host,
        unit=spec.name,
        port=spec.port,
        gpu=gpu,
        driver=driver,
        tuning=tune,
        image_seen=image_seen,
        summary=summary,
        prefill_4k=prefill,
        prefill_note=note,
        comparisons=comparisons,
        receipt=receipt,
        promote=request.promote,
        refusals=refusals,
        text=text,
        not_written=not_written,
        cleanup=cleanup,
    )


def _check_written(entry: Entry, before: str, after: str) -> None:
    """What is written must be a recipe `check` accepts, and a change `gate check` passes."""
    recipe, problems = parse_recipe(after, entry.path)
    if recipe is None or problems:
        raise GateError(
            "the new receipt would make an invalid recipe, so nothing was written: "
            + "; ".join(problems)
        )
    _, violations = judge(entry.path, before, after, "the file before this run")
    if violations:
        raise GateError(
            "the new receipt would not pass gate check, so nothing was written: "
            + "; ".join(v.line() for v in violations)
        )
