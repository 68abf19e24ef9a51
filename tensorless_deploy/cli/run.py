"""run, pull, serve: one recipe on this machine, through the same decisions and launch spec as
a fleet deploy."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any

from tensorless_deploy.cli.catalog import catalog_from
from tensorless_deploy.cli.deploy import print_results, result_json
from tensorless_deploy.cli.output import emit_json, paint
from tensorless_deploy.decisions.checks import (
    Existing,
    Options,
    Verdict,
    choose_recipe,
    host_verdict,
    no_card_verdict,
    state_refusal,
)
from tensorless_deploy.errors import TensorlessError, UsageError
from tensorless_deploy.facts.values import HostFacts
from tensorless_deploy.fleet.hosts import is_ip_address
from tensorless_deploy.recipe.catalog import Entry

# Checks that decide whether this machine has the card at all; with --dry-run only these
# refuse (the recipe's state is judged by the seed's table for --dry-run), the others are
# shown as what a real run would stop at.
CARD_CHECKS = ("driver.present", "driver.loaded", "card.match", "driver.version")


class Refused(TensorlessError):
    """This machine cannot run the recipe; the failed checks say why and how to fix it."""

    def __init__(self, verdict: Verdict, what: str) -> None:
        failed = verdict.failed()
        super().__init__(f"{what}: refused on this machine")
        self.failed_checks = failed

    def lines(self) -> list[str]:
        out = [self.message]
        for c in self.failed_checks:
            out.append(f"  {c.id}: {c.evidence}")
            if c.fix:
                out.append(f"    fix: {c.fix}")
        return out


def _options(args: argparse.Namespace) -> Options:
    bind = getattr(args, "host", None) or "127.0.0.1"
    if not is_ip_address(bind):
        raise UsageError(f"--host {bind}: must be an IP address such as 127.0.0.1")
    return Options(
        port=getattr(args, "port", None) or 8080,
        bind=bind,
        engine=getattr(args, "engine", None) or "auto",
        allow_draft=args.allow_draft,
        local=True,
    )


def _choose(
    args: argparse.Namespace, facts: HostFacts, options: Options, dry: bool
) -> tuple[Entry, Verdict]:
    from tensorless_deploy.hub import cache_paths
    from tensorless_deploy.local.run import hub_cache_dir, model_is_verified

    entries = catalog_from(args).find(args.model)
    recipe = choose_recipe([e.recipe for e in entries], facts)
    if recipe is None:
        if facts.gpus.state == "ok":
            raise Refused(
                no_card_verdict(
                    entries[0].recipe.model.hf_repo, [e.recipe for e in entries], facts, options
                ),
                args.model,
            )
        recipe = entries[0].recipe  # the driver checks below say why no card was seen
    entry = next(e for e in entries if e.recipe is recipe)
    refusal = state_refusal(recipe, "dry_run" if dry else "run", options.allow_draft)
    if refusal:
        raise UsageError(refusal)
    present = model_is_verified(cache_paths(hub_cache_dir(), recipe))
    verdict = host_verdict(facts, recipe, options, existing=Existing(model_present=present))
    blocking = [c for c in verdict.failed() if not dry or c.id in CARD_CHECKS]
    if blocking:
        raise Refused(verdict, f"{recipe.model.hf_repo} on {recipe.card.id}")
    return entry, verdict


def _spec(
    args: argparse.Namespace, entry: Entry, verdict: Verdict, facts: HostFacts, options: Options
) -> Any:
    from tensorless_deploy.hub import cache_paths
    from tensorless_deploy.launch.spec import build_launch_spec
    from tensorless_deploy.local.run import hub_cache_dir

    engine = verdict.engine or ("docker" if options.engine == "docker" else "podman")
    return build_launch_spec(
        entry.recipe,
        engine=engine,
        model_path=cache_paths(hub_cache_dir(), entry.recipe).blob,
        gpu_uuids=verdict.match.uuids if verdict.match else (),
        cpus=facts.cpus,
        port=options.port,
        bind=options.bind,
        context=args.context,
        extra_args=tuple(args.extra),
    )


def _print_untuned(spec: Any) -> None:
    if not spec.tuning.tuned:
        print(
            paint("untuned", "33")
            + ": "
            + "; ".join(spec.tuning.reasons)
            + " (the receipt's numbers do not apply)",
            file=sys.stderr,
        )


def cmd_run(args: argparse.Namespace) -> int:
    from tensorless_deploy.local.run import (
        container_argv,
        engine_bin,
        hub_cache_dir,
        local_facts,
        pull_image,
        run_foreground,
    )

    options = _options(args)
    facts = local_facts(hub_cache_dir())
    entry, verdict = _choose(args, facts, options, args.dry_run)
    spec = _spec(args, entry, verdict, facts, options)
    r = entry.recipe
    if args.dry_run:
        command = container_argv(spec, spec.engine)
        would_stop = [c for c in verdict.failed()]
        if args.json:
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
                    "address": f"{spec.bind}:{spec.port}",
                    "tuned": spec.tuning.tuned,
                    "untuned_reasons": list(spec.tuning.reasons),
                    "command": command,
                    "would_refuse": [
                        {"id": c.id, "evidence": c.evidence, "fix": c.fix} for c in would_stop
                    ],
                }
            )
            return 0
        print(f"recipe    {entry.path} ({r.state}, {entry.digest})")
        print(f"image     {r.engine.image}")
        print(
            f"model     {r.model.hf_repo}@{r.model.revision} {r.model.file} "
            f"sha256 {r.model.sha256} ({r.model.size_bytes} bytes)"
        )
        print(f"cache     {spec.model_path}")
        print(f"gpus      {', '.join(spec.gpu_uuids) or '-'}")
        print("env       " + " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env))
        print(f"address   http://{spec.bind}:{spec.port}")
        print("command   " + shlex.join(command))
        _print_untuned(spec)
        for c in would_stop:
            print(
                f"a real run would refuse: {c.id}: {c.evidence}"
                + (f" (fix: {c.fix})" if c.fix else ""),
                file=sys.stderr,
            )
        return 0
    engine = engine_bin(spec.engine)
    pull_image(engine, r.engine.image)
    _fetch(r)
    _print_untuned(spec)

    def healthy(seconds: float) -> None:
        print(
            f"serving {r.run.alias} on http://{spec.bind}:{spec.port} (healthy after "
            f"{seconds:.1f} s; Ctrl-C stops and removes it)",
            flush=True,
        )

    return run_foreground(spec, engine, on_healthy=healthy)


class _Bar:
    """A one-line progress bar on stderr (redrawn only on a terminal, at most 10 times a second)."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.last = label, total, 0.0
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.tty or (now - self.last < 0.1 and done < total):
            return
        self.last = now
        pct = 100 * done / total if total else 100.0
        bar = "#" * int(pct / 5)
        sys.stderr.write(
            f"\r{self.label} [{bar:<20}] {pct:5.1f}% {done / 1e6:,.1f}/{total / 1e6:,.1f} MB"
        )
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _fetch(recipe: Any) -> None:
    from tensorless_deploy.local.run import fetch_model, hub_cache_dir, hub_token

    bar = _Bar(recipe.model.file, recipe.model.size_bytes)
    blob, fetched = fetch_model(recipe, hub_cache_dir(), token=hub_token(), progress=bar)
    word = f"downloaded {fetched} bytes" if fetched else "already in the cache, verified earlier"
    print(
        f"model {recipe.model.file}: {word}; sha256 {recipe.model.sha256[:12]}... ok ({blob})",
        file=sys.stderr,
    )


def cmd_pull(args: argparse.Namespace) -> int:
    from tensorless_deploy.local.run import engine_bin, pull_image

    entries = catalog_from(args).find(args.model)
    if args.card:
        entries = [e for e in entries if e.recipe.card.id == args.card] or entries[:0]
        if not entries:
            raise UsageError(f"{args.model}: no recipe for card {args.card!r}")
    entry = entries[0]
    if len(entries) > 1 and not args.card:
        from tensorless_deploy.local.run import hub_cache_dir, local_facts

        chosen = choose_recipe([e.recipe for e in entries], local_facts(hub_cache_dir()))
        if chosen is None:
            cards = ", ".join(e.recipe.card.id for e in entries)
            raise UsageError(f"{args.model}: no GPU here picks a card; pass --card ({cards})")
        entry = next(e for e in entries if e.recipe is chosen)
    refusal = state_refusal(entry.recipe, "run", args.allow_draft)
    if refusal:
        raise UsageError(refusal)
    r = entry.recipe
    engine = args.engine or ("podman" if _which("podman") else "docker")
    pulled = pull_image(engine_bin(engine), r.engine.image)
    print(f"image {r.engine.image}: {'pulled' if pulled else 'already present'}", file=sys.stderr)
    _fetch(r)
    return 0


def _which(name: str) -> bool:
    import shutil

    return shutil.which(name) is not None


def cmd_serve(args: argparse.Namespace) -> int:
    """The always-on form on this machine: the deploy path, this machine as the inventory."""
    from tensorless_deploy.cli.deploy import hf_token
    from tensorless_deploy.fleet.deploy import DeployRequest, deploy
    from tensorless_deploy.fleet.hosts import load_inventory, select_hosts

    catalog = catalog_from(args)
    catalog.find(args.model)
    inventory = load_inventory(None, local=True)
    override = {k: v for k, v in (("port", args.port), ("bind", args.host)) if v is not None}
    if args.host is not None and not is_ip_address(args.host):
        raise UsageError(f"--host {args.host}: must be an IP address such as 127.0.0.1")
    request = DeployRequest(
        args.model,
        Options(allow_draft=args.allow_draft),
        args.context,
        tuple(args.extra),
        False,
        hf_token(),
        override,
    )
    results = deploy(inventory, select_hosts(inventory, []), catalog, request)
    if args.json:
        emit_json({"ok": all(r.ok for r in results), "hosts": [result_json(r) for r in results]})
    else:
        print_results(results, args.verbose)
    return 0 if all(r.ok for r in results) else 1
