"""run, pull, serve: one recipe on this machine, through the same host plan as a fleet deploy."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from typing import TYPE_CHECKING, Any

from tensorless_deploy.cli.bundle import catalog_of, from_bundle, from_bundle_flag
from tensorless_deploy.cli.common import (
    Bar,
    Refused,
    access_flags,
    access_from,
    catalog_from,
    dry_run_flag,
    flags_from,
    print_results,
    recipes_flag,
    result_json,
    untuned_line,
)
from tensorless_deploy.cli.output import emit_json
from tensorless_deploy.errors import TensorlessError, UsageError

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.facts.values import HostFacts
    from tensorless_deploy.fleet.bundle import Bundle
    from tensorless_deploy.hostplan.plan import HostPlan
    from tensorless_deploy.local.facts import LocalSurvey
    from tensorless_deploy.recipe.schema import Recipe

HERE = "this machine"
RUN_FLAG_NAMES = {"bind": "--host"}  # run and serve call the bind address --host


def _refusal(plan: HostPlan, model: str) -> TensorlessError | None:
    """What a real run raises for this plan (None: it runs): the seed's state table first (a
    usage error), then the failed checks."""
    from tensorless_deploy.decisions.checks import state_refusal

    if plan.recipe is None:
        return Refused(model, plan.failed())
    refusal = state_refusal(plan.recipe, "run", plan.options.allow_draft)
    if refusal:
        return UsageError(refusal)
    if plan.blocking(False) or not plan.instances:
        return Refused(f"{plan.recipe.model.hf_repo} on {plan.recipe.card.id}", plan.failed())
    return None


LocalPlan = tuple["HostPlan", "HostPlan", "TensorlessError | None", "HostFacts"]


def _local_plan(args: argparse.Namespace, dry: bool, bundle: Bundle | None = None) -> LocalPlan:
    """This machine's host plan for MODEL, the model in this machine's Hugging Face cache; the
    seed's state table and the failed checks refuse here, before anything is fetched. With dry:
    the plan shown (a preview card's where --card names one this machine lacks), this machine's
    own plan, and what a real run would refuse with (the dry run exits with its status); and the
    survey's facts of this machine."""
    from tensorless_deploy.hub import cache_dir
    from tensorless_deploy.local.facts import LocalSurvey

    cache = cache_dir()
    # the survey runs (a shell and its probes) while the rest is imported, loaded and decided
    with LocalSurvey(cache) as survey:
        return _local_plan_with(args, dry, bundle, cache, survey)


def _local_plan_with(
    args: argparse.Namespace, dry: bool, bundle: Bundle | None, cache: str, survey: LocalSurvey
) -> LocalPlan:
    from tensorless_deploy.decisions.checks import state_refusal
    from tensorless_deploy.decisions.options import resolve
    from tensorless_deploy.gguf.sizing import read_sizings
    from tensorless_deploy.hostplan.plan import plan_host, select, with_preview_card
    from tensorless_deploy.local.run import local_secrets_root

    catalog = catalog_of(args, bundle)
    card = getattr(args, "card", None)
    entries = [catalog.card(args.model, card)] if card else catalog.find(args.model)
    flags = access_from(args, flags_from(args, **RUN_FLAG_NAMES))
    # the Hub cache is where huggingface_hub puts it, whatever its path: not an operator option;
    # a foreground run is one instance: the card --gpu names, else the first that matches
    options = dataclasses.replace(
        resolve(flags, None, HERE, local=True),
        models_dir=cache,
        instances=flags.instances if flags.instances is not None else 1,
    )
    secrets = local_secrets_root()
    sizing = read_sizings([(e.path, e.recipe) for e in entries])  # the memory verdict's input
    facts = survey.facts()
    plan = plan_host(
        HERE, facts, entries, options, sizing=sizing, units=False, secrets_root=secrets
    )
    real = _refusal(plan, args.model)
    if not dry:
        if real is not None:
            raise real
        return plan, plan, None, facts
    shown = plan
    if card and (facts.gpus.state != "ok" or select(entries, facts) is None):
        # a preview of the card's recipe on a machine without that card
        preview = with_preview_card(facts, entries[0].recipe)
        shown = plan_host(
            HERE, preview, entries, options, sizing=sizing, units=False, secrets_root=secrets
        )
    if shown.recipe is None:
        raise Refused(args.model, shown.failed())
    refusal = state_refusal(shown.recipe, "dry_run", options.allow_draft)
    if refusal:
        raise UsageError(refusal)
    if shown.blocking(True) or not shown.instances:
        raise Refused(f"{shown.recipe.model.hf_repo} on {shown.recipe.card.id}", shown.failed())
    return shown, plan, real, facts


def _print_dry_run(
    plan: HostPlan, command: list[str], as_json: bool, real: HostPlan, code: int
) -> None:
    """The dry run's report: every value and the exact command of the plan shown, then what a
    real run here (real: this machine's own plan) would refuse, and the status it would exit
    with (code)."""
    from tensorless_deploy.hostplan.plan import PREVIEW_UUID

    assert plan.entry is not None
    entry, r = plan.entry, plan.entry.recipe
    spec = plan.instances[0].spec
    would_stop = real.failed()
    if as_json:
        emit_json(
            {
                "recipe": entry.path,
                "recipe_digest": entry.digest,
                "state": r.state,
                "image": r.engine.image,
                "model_path": spec.model_path,
                "gpu_uuids": list(spec.gpu_uuids),
                "env": dict(spec.env),
                "server_args": list(spec.server_args),
                "address": spec.address,
                "url": spec.url,
                "health_url": spec.health_url,
                "api_key_file": plan.options.api_key_file,  # the path only, never the key
                "tls": spec.tls,
                "metrics": spec.metrics,
                "tuned": spec.tuning.tuned,
                "untuned_reasons": list(spec.tuning.reasons),
                "command": command,
                "preview": PREVIEW_UUID in spec.gpu_uuids,
                "would_refuse": [
                    {"id": c.id, "evidence": c.evidence, "fix": c.fix} for c in would_stop
                ],
                "exit_code": code,
            }
        )
        return
    print(f"recipe    {entry.path} ({r.state}, {entry.digest})")
    print(f"image     {r.engine.image}")
    print(
        f"model     {r.model.hf_repo}@{r.model.revision} {r.model.file} "
        f"sha256 {r.model.sha256} ({r.model.size_bytes} bytes)"
    )
    print(f"cache     {spec.model_path}")
    print(f"gpus      {', '.join(spec.gpu_uuids) or '-'}")
    if PREVIEW_UUID in spec.gpu_uuids:
        print(
            f"preview   no {r.card.id} card here: {PREVIEW_UUID} stands for the one a run would "
            "be given",
            file=sys.stderr,
        )
    print("env       " + " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env))
    print(f"address   {spec.url}")
    if plan.options.api_key_file:
        print(f"api key   required; from {plan.options.api_key_file} (/health needs none)")
    print("command   " + shlex.join(command))
    if not spec.tuning.tuned:
        print(untuned_line(spec.tuning.reasons), file=sys.stderr)
    for c in would_stop:
        print(
            f"a real run would refuse: {c.id}: {c.evidence}"
            + (f" (fix: {c.fix})" if c.fix else ""),
            file=sys.stderr,
        )


def cmd_run(args: argparse.Namespace) -> int:
    from tensorless_deploy.local.run import container_argv, pull_image, run_foreground

    bundle = from_bundle(args)
    plan, real, refusal, facts = _local_plan(args, args.dry_run, bundle)
    assert plan.recipe is not None and plan.engine_bin is not None
    spec = plan.instances[0].spec
    if args.dry_run:
        # a dry run exits as the real run would: its refusal's status (docs/commands.md)
        code = refusal.exit_code if refusal is not None else 0
        _print_dry_run(plan, container_argv(spec, spec.engine), args.json, real, code)
        return code
    r = plan.recipe
    if bundle is not None:
        _from_bundle(bundle, plan.engine_bin, plan.options.models_dir)
    else:
        # the survey listed the engine's images: asked again only where it could not say
        held = facts.tool.has_image(spec.engine, r.engine.image) if facts.tool else None
        pull_image(plan.engine_bin, r.engine.image, present=held)
        _fetch(r, plan.options.models_dir, quiet=bool(args.json))
    if not spec.tuning.tuned:
        print(untuned_line(spec.tuning.reasons), file=sys.stderr)

    def healthy(seconds: float, device: str) -> None:
        print(
            f"serving {r.run.alias} on {spec.url} (healthy after "
            f"{seconds:.1f} s, on {device}; Ctrl-C stops and removes it)",
            flush=True,
        )

    from tensorless_deploy.hostplan.plan import secret_sources

    sources = secret_sources(plan.options, spec)
    return run_foreground(spec, plan.engine_bin, on_healthy=healthy, sources=sources)


def _fetch(recipe: Recipe, cache: str, *, quiet: bool = False) -> tuple[Any, int]:
    from tensorless_deploy.hub import token
    from tensorless_deploy.local.fetch import fetch_model

    bar = Bar(recipe.model.file, recipe.model.size_bytes, quiet=quiet)
    # the token is looked up only when a download starts (not for a model verified earlier)
    got = fetch_model(recipe, cache, token=token, progress=bar)
    word = {
        "downloaded": f"downloaded {got.downloaded} bytes",
        "hashed": "already in the cache, hashed now",
        "verified earlier": "already in the cache, verified earlier",
    }[got.how]
    print(
        f"model {recipe.model.file}: {word}; sha256 {recipe.model.sha256[:12]}... ok ({got.blob})",
        file=sys.stderr,
    )
    return got.blob, got.downloaded


def _from_bundle(bundle: Bundle, engine: str, cache: str) -> tuple[bool, Any]:
    """The bundle's image and model on this machine, as pull leaves them; what it said."""
    from tensorless_deploy.fleet.bundle import image_here, model_here

    r = bundle.entry.recipe
    loaded = image_here(bundle, engine)
    said = "loaded from the bundle" if loaded else "already present"
    print(f"image {r.engine.image}: {said}", file=sys.stderr)
    blob = model_here(bundle, cache)
    print(
        f"model {r.model.file}: from the bundle; sha256 {r.model.sha256[:12]}... ok ({blob})",
        file=sys.stderr,
    )
    return loaded, blob


def _pull(
    r: Recipe, engine: str, cache: str, bundle: Bundle | None, quiet: bool
) -> tuple[bool, Any, int]:
    """pull's image and model: from the bundle, else the registry and the Hub; whether the
    image was pulled (or loaded), where the model is, the bytes downloaded."""
    from tensorless_deploy.local.run import pull_image

    if bundle is not None:
        loaded, blob = _from_bundle(bundle, engine, cache)
        return loaded, blob, 0
    pulled = pull_image(engine, r.engine.image)
    print(f"image {r.engine.image}: {'pulled' if pulled else 'already present'}", file=sys.stderr)
    blob, fetched = _fetch(r, cache, quiet=quiet)
    return pulled, blob, fetched


def cmd_pull(args: argparse.Namespace) -> int:
    from tensorless_deploy.decisions.checks import pick_engine, state_refusal
    from tensorless_deploy.hostplan.plan import engine_bin, select
    from tensorless_deploy.hub import cache_dir
    from tensorless_deploy.local.facts import local_facts
    from tensorless_deploy.local.fetch import LocalError

    bundle = from_bundle(args)
    catalog = catalog_of(args, bundle)
    flags = flags_from(args)
    entries = [catalog.card(args.model, args.card)] if args.card else catalog.find(args.model)
    cache = cache_dir()
    facts = local_facts(cache)
    entry: Any = entries[0]
    if len(entries) > 1:
        entry = select(entries, facts) if facts.gpus.state == "ok" else None
        if entry is None:
            cards = ", ".join(e.recipe.card.id for e in entries)
            raise UsageError(f"{args.model}: no GPU here picks a card; pass --card ({cards})")
    refusal = state_refusal(entry.recipe, "run", flags.allow_draft)
    if refusal:
        raise UsageError(refusal)
    r = entry.recipe
    engine = pick_engine(facts, flags.engine or "auto")  # type: ignore[arg-type]
    if engine is None:
        raise LocalError(
            f"no container engine ({flags.engine or 'podman or docker'}) on this machine",
            fix="install podman",
        )
    pulled, blob, fetched = _pull(r, engine_bin(facts, engine), cache, bundle, bool(args.json))
    if args.json:
        emit_json(
            {
                "ok": True,
                "recipe": entry.path,
                "image": r.engine.image,
                "image_pulled": pulled,
                "model": str(blob),
                "model_bytes_downloaded": fetched,
                "sha256": r.model.sha256,
            }
        )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """The always-on form on this machine: the deploy path, this machine as the inventory."""
    from tensorless_deploy.fleet.deploy import DeployRequest, deploy
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.hub import token

    catalog = catalog_from(args)
    catalog.find(args.model)
    flags = access_from(args, flags_from(args, **RUN_FLAG_NAMES))
    inventory = load_inventory(None, local=True)
    dry = args.dry_run
    request = DeployRequest(args.model, flags, dry, None if dry else token(), "pull", local=True)
    results = deploy(inventory, select_hosts(inventory, []), catalog, request)
    if args.json:
        emit_json({"ok": all(r.ok for r in results), "hosts": [result_json(r) for r in results]})
    else:
        print_results(results, args.verbose)
    return 0 if all(r.ok for r in results) else 1


def _local_flags(p: argparse.ArgumentParser, server: bool, run: bool = False) -> None:
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    p.add_argument("--allow-draft", action="store_true", help="accept a draft recipe")
    p.add_argument(
        "--engine",
        choices=("podman", "docker"),
        help="container engine (default: podman, else docker)",
    )
    if server:
        p.add_argument("--port", type=int, metavar="N", help="API port (default 8080)")
        p.add_argument(
            "--host", dest="bind", metavar="ADDR", help="API address (default 127.0.0.1)"
        )
        p.add_argument(
            "--context", type=int, metavar="N", help="context instead of the recipe's (untuned)"
        )
        p.set_defaults(takes_extra=True)
    if server and run:
        access_flags(p, "--host")
    recipes_flag(p)


def register(command: Command) -> None:
    p = command(
        "run",
        "run a recipe on this machine in the foreground until Ctrl-C "
        "(extra llama-server args after --, untuned)",
        cmd_run,
    )
    _local_flags(p, server=True, run=True)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print every value and the exact command; change nothing",
    )
    p.add_argument(
        "--card",
        metavar="ID",
        help="the card's recipe; with --dry-run, previewed even where this machine lacks it",
    )
    p.add_argument(
        "--gpu",
        metavar="N|UUID",
        help="the card to run on (index or GPU-uuid; default: the first that matches)",
    )
    from_bundle_flag(p)
    p = command("pull", "fetch a recipe's image (by digest) and model (sha256-verified)", cmd_pull)
    _local_flags(p, server=False)
    p.add_argument("--card", metavar="ID", help="the card's recipe (default: this machine's GPU)")
    from_bundle_flag(p)
    p = command(
        "serve", "serve a recipe always-on on this machine: the deploy path, locally", cmd_serve
    )
    _local_flags(p, server=True, run=True)
    dry_run_flag(p)
