"""The maintenance window's decisions (pure): the record ``maintain begin`` leaves on a host,
what the operator is told to do meanwhile, and what ``maintain end`` found: the driver before
and after, and whether the host may serve again."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tensorless_deploy.decisions.cards import branch_of
from tensorless_deploy.decisions.checks import MAINTENANCE, Check
from tensorless_deploy.decisions.guard import loaded_driver
from tensorless_deploy.facts.values import (
    LABEL_CARD,
    LABEL_HEALTH,
    LABEL_MODEL,
    LABEL_RECIPE_DIGEST,
    DeployedUnit,
    HeldUnit,
    HostFacts,
    MaintenanceRecord,
)


def held_units(units: Sequence[DeployedUnit]) -> tuple[HeldUnit, ...]:
    """The host's units of this tool, as the record keeps them."""
    out = []
    for u in units:
        labels = u.container_labels or u.unit_labels
        out.append(
            HeldUnit(
                name=u.name,
                path=u.path,
                active=u.active,
                health_url=labels.get(LABEL_HEALTH) or u.unit_labels.get(LABEL_HEALTH),
                model=u.unit_labels.get(LABEL_MODEL),
                card=u.unit_labels.get(LABEL_CARD),
                recipe_digest=u.unit_labels.get(LABEL_RECIPE_DIGEST),
            )
        )
    return tuple(out)


def new_record(
    facts: HostFacts, units: Sequence[DeployedUnit], began: str, by: str
) -> MaintenanceRecord:
    module = facts.module
    return MaintenanceRecord(
        began=began,
        by=by,
        driver=loaded_driver(facts),
        flavour=module.flavour if module is not None and module.loaded else None,
        units=held_units(units),
    )


def record_text(record: MaintenanceRecord) -> str:
    return json.dumps(record.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def to_start(record: MaintenanceRecord) -> tuple[HeldUnit, ...]:
    """The units maintain end starts again: those that were running when the window began
    (one already stopped stays stopped)."""
    return tuple(u for u in record.units if u.active in ("active", "activating", "reloading"))


def update_hint(facts: HostFacts, branch: int | None) -> str:
    """What the operator does in the window: the tool never runs the package manager on the
    driver."""
    where = f"within branch {branch}" if branch is not None else "within its branch"
    pk = facts.driver_packages
    version = loaded_driver(facts)
    names = pk.of_driver(version) if pk is not None and version is not None else ()
    if pk is not None and pk.manager == "apt" and names:
        how = f"sudo apt-get install --only-upgrade {' '.join(names)}"
    elif pk is not None and pk.manager == "dnf" and names:
        how = (
            f"sudo dnf versionlock delete {' '.join(names)} && sudo dnf upgrade "
            f"{' '.join(names)}, then tensorless-deploy prepare locks it again"
        )
    else:
        return f"update the driver {where} with its installer (no package of it here), reboot"
    return f"update the driver {where} ({how}), reboot"


@dataclass(frozen=True)
class Ending:
    """What maintain end found on a host, before it starts anything."""

    driver_before: str | None
    driver_after: str | None
    branch_before: int | None
    branch_after: int | None
    blocking: tuple[Check, ...]  # doctor's failed checks: the units stay stopped

    @property
    def branch_changed(self) -> bool:
        return (
            self.branch_before is not None
            and self.branch_after is not None
            and self.branch_before != self.branch_after
        )

    def driver_line(self) -> str:
        before, after = self.driver_before or "unknown", self.driver_after or "unknown"
        if before == after:
            return f"{after} (unchanged)"
        note = ""
        if self.branch_changed:
            note = (
                f"; the branch changed ({self.branch_before} -> {self.branch_after}): "
                "tensorless-deploy prepare locks the new one (driver.lock)"
            )
        return f"{before} -> {after}{note}"


# Not the host's to pass at the window's end: the window itself, and whether a recipe may be
# deployed anew (its units are deployed already; a draft deployed with --allow-draft serves on).
NOT_BLOCKING = (MAINTENANCE, "recipe.state")


def ending(record: MaintenanceRecord, facts: HostFacts, checks: Sequence[Check]) -> Ending:
    """The window's end on one host: doctor's failed checks (NOT_BLOCKING left out) keep its
    units stopped."""
    after = loaded_driver(facts)
    blocking = tuple(c for c in checks if c.status == "fail" and c.id not in NOT_BLOCKING)
    return Ending(
        record.driver,
        after,
        branch_of(record.driver) if record.driver else None,
        branch_of(after) if after else None,
        tuple(dict.fromkeys(blocking)),
    )
