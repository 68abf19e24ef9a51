"""doctor's report: the host plan of every surveyed host for every model asked (or readiness
without one), and its stable JSON shape (docs/doctor.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tensorless_deploy.decisions.checks import Check
from tensorless_deploy.gguf.sizing import Sizings
from tensorless_deploy.hostplan.plan import HostPlan, SurveyedHost, plan_host, readiness
from tensorless_deploy.recipe.catalog import Catalog


@dataclass(frozen=True)
class HostReport:
    host: str
    error: str | None
    plans: tuple[HostPlan, ...]
    gpus: tuple[dict[str, Any], ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None and all(_ready(p) for p in self.plans)


def _ready(p: HostPlan) -> bool:
    """Readiness has no instances to lay out, but a recipe of the catalog must fit the host
    (else it is ready for nothing: "ready" beside "no recipe fits" would say otherwise); a
    model's plan must have its instances."""
    if p.model is None:
        return p.verdict.ok and p.problem is None and bool(p.verdict.servable)
    return p.verdict.ok and p.problem is None and bool(p.instances)


def host_report(
    surveyed: SurveyedHost, catalog: Catalog, models: Sequence[str], sizing: Sizings
) -> HostReport:
    """The same host plans deploy computes, for the models asked (readiness without any);
    sizing: the models' recipes sized from their headers (the memory verdict)."""
    if surveyed.facts is None:
        return HostReport(surveyed.name, surveyed.error, ())
    facts = surveyed.facts
    gpus = tuple(g.model_dump(mode="json") for g in facts.gpus.gpus)
    if not models:
        return HostReport(
            surveyed.name, None, (readiness(surveyed.name, facts, catalog, surveyed.options),), gpus
        )
    plans = tuple(
        plan_host(surveyed.name, facts, catalog.find(model), surveyed.options, sizing=sizing)
        for model in models
    )
    return HostReport(surveyed.name, None, plans, gpus)


def check_json(c: Check) -> dict[str, Any]:
    return {"id": c.id, "status": c.status, "evidence": c.evidence, "fix": c.fix}


def plan_json(p: HostPlan) -> dict[str, Any]:
    v = p.verdict
    uuids = [u for i in p.instances for u in i.spec.gpu_uuids]
    return {
        "model": p.model,
        "card": p.card,
        "recipe": p.entry.path if p.entry else None,
        "ok": _ready(p),
        "engine": v.engine,
        "gpu_uuids": uuids,
        "instances": [
            {"name": i.name, "address": i.spec.address, "gpu_uuids": list(i.spec.gpu_uuids)}
            for i in p.instances
        ],
        "servable": list(v.servable),
        "problem": p.problem,
        "checks": [check_json(c) for c in v.checks],
    }


def report_json(reports: Sequence[HostReport]) -> dict[str, Any]:
    """The documented --json shape (docs/doctor.md)."""
    hosts = [
        {
            "host": r.host,
            "ok": r.ok,
            "error": r.error,
            "gpus": list(r.gpus),
            "results": [plan_json(p) for p in r.plans],
        }
        for r in reports
    ]
    return {"ok": all(r.ok for r in reports), "hosts": hosts}
