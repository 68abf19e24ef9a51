"""status: what each host serves, healthy or not, tuned or not, drift from the catalog (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tensorless_deploy.decisions.options import DEFAULT_BIND, address
from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.facts.values import LABEL_PREFIX, DeployedUnit
from tensorless_deploy.recipe.catalog import Catalog


@dataclass(frozen=True)
class UnitStatus:
    unit: str
    kind: str
    model: str | None
    card: str | None
    address: str | None
    active: str
    healthy: bool
    tuned: bool | None
    recipe_digest: str | None  # what the running container was started from
    image: str | None
    drift: tuple[str, ...]

    def json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "kind": self.kind,
            "model": self.model,
            "card": self.card,
            "address": self.address,
            "active": self.active,
            "healthy": self.healthy,
            "tuned": self.tuned,
            "recipe_digest": self.recipe_digest,
            "image": self.image,
            "drift": list(self.drift),
        }


def _label(labels: dict[str, str], key: str) -> str | None:
    return labels.get(f"{LABEL_PREFIX}.{key}")


def unit_status(u: DeployedUnit, catalog: Catalog) -> UnitStatus:
    labels = u.container_labels or u.unit_labels
    model, card = _label(u.unit_labels, "model"), _label(u.unit_labels, "card")
    bind, port = _label(labels, "bind"), _label(labels, "port")
    running = _label(u.container_labels, "recipe-digest")
    written = _label(u.unit_labels, "recipe-digest")
    tuned = _label(labels, "tuned")
    drift = []
    if running and written and running != written:
        drift.append("the unit file changed since the container started (restart pending)")
    entry = None
    if model and card:
        try:
            entry = catalog.card(model, card)
        except TensorlessError:  # an unknown model or card is drift, reported below
            entry = None
    if model and card and entry is None:
        drift.append(f"no recipe for {model} on {card} in the catalog any more")
    elif entry is not None:
        if (running or written) != entry.digest:
            drift.append(f"the catalog's recipe changed since deploy (now {entry.digest[:19]}...)")
        if u.image and u.image != entry.recipe.engine.image:
            drift.append(f"the container runs {u.image}, not the recipe's image")
    if u.container_labels == {} and u.active == "active":
        drift.append("the service is active but no container was found")
    where = address(bind or DEFAULT_BIND, int(port)) if port and port.isdigit() else None
    return UnitStatus(
        unit=u.name,
        kind=u.kind,
        model=model,
        card=card,
        address=where,
        active=u.active,
        healthy=u.health == 200,
        tuned=None if tuned is None else tuned == "true",
        recipe_digest=running or written,
        image=u.image,
        drift=tuple(drift),
    )
