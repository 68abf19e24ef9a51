"""doctor's report: the decisions for every surveyed host, and its stable JSON shape."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tensorless_deploy.decisions.checks import (
    Check,
    Existing,
    Verdict,
    choose_recipe,
    host_verdict,
    no_card_verdict,
)
from tensorless_deploy.fleet.hosts import HostOutcome
from tensorless_deploy.recipe.catalog import Catalog, Entry

# What tensorless-deploy already put on the host for a recipe (its unit, its model file), read
# from the host the way deploy reads it, so doctor and deploy agree about a host already serving.
ExistingFor = Callable[[Entry], Existing]


@dataclass(frozen=True)
class ModelResult:
    model: str | None  # None: readiness only
    entry: Entry | None  # the recipe chosen for this host's card
    verdict: Verdict


@dataclass(frozen=True)
class HostReport:
    host: str
    error: str | None
    results: tuple[ModelResult, ...]
    gpus: tuple[dict[str, Any], ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None and all(r.verdict.ok for r in self.results)


def host_report(
    outcome: HostOutcome,
    catalog: Catalog,
    models: Sequence[str],
    existing: ExistingFor | None = None,
) -> HostReport:
    if outcome.facts is None:
        return HostReport(outcome.name, outcome.error, ())
    facts = outcome.facts
    gpus = tuple(g.model_dump(mode="json") for g in facts.gpus.gpus)
    results: list[ModelResult] = []
    if not models:
        listing = [(e.path, e.recipe) for e in catalog.entries]
        verdict = host_verdict(facts, None, outcome.options, listing)
        results.append(ModelResult(None, None, verdict))
    for model in models:
        entries = catalog.find(model)
        recipe = choose_recipe([e.recipe for e in entries], facts)
        if recipe is None and facts.gpus.state != "ok":
            recipe = entries[0].recipe  # the driver checks say why no card could be seen
        if recipe is None:
            name = entries[0].recipe.model.hf_repo
            verdict = no_card_verdict(name, [e.recipe for e in entries], facts, outcome.options)
            results.append(ModelResult(name, None, verdict))
            continue
        entry = next(e for e in entries if e.recipe is recipe)
        found = existing(entry) if existing is not None else Existing()
        verdict = host_verdict(facts, recipe, outcome.options, existing=found)
        results.append(ModelResult(recipe.model.hf_repo, entry, verdict))
    return HostReport(outcome.name, None, tuple(results), gpus)


def _check_json(c: Check) -> dict[str, Any]:
    return {"id": c.id, "status": c.status, "evidence": c.evidence, "fix": c.fix}


def report_json(reports: Sequence[HostReport]) -> dict[str, Any]:
    """The documented --json shape (docs/doctor.md)."""
    hosts = []
    for r in reports:
        results = []
        for m in r.results:
            v = m.verdict
            results.append(
                {
                    "model": m.model,
                    "card": m.entry.recipe.card.id if m.entry else None,
                    "recipe": m.entry.path if m.entry else None,
                    "ok": v.ok,
                    "engine": v.engine,
                    "gpu_uuids": list(v.match.uuids) if v.match else [],
                    "servable": list(v.servable),
                    "checks": [_check_json(c) for c in v.checks],
                }
            )
        hosts.append(
            {"host": r.host, "ok": r.ok, "error": r.error, "gpus": list(r.gpus), "results": results}
        )
    return {"ok": all(r.ok for r in reports), "hosts": hosts}
