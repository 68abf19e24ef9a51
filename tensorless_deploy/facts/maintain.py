"""The maintenance window on a host: the record ``maintain begin`` writes (what the host served
and which driver it ran), read back by the survey and by ``maintain end``, and the systemd
drop-in that keeps each of the host's units from starting while the record is there (at boot,
by a restart policy, by hand)."""

from __future__ import annotations

import json

from pydantic import ValidationError

from tensorless_deploy.shell import SYSTEMD_DIR

from .errors import FactError
from .values import MaintenanceRecord

MAINTENANCE_RECORD = "/var/lib/tensorless-deploy/maintenance.json"
HOLD_DROPIN = "50-tensorless-maintenance.conf"
HOLD_TEXT = (
    "# Written by tensorless-deploy maintain begin: this unit does not start while the host is\n"
    f"# in a maintenance window ({MAINTENANCE_RECORD} exists). maintain end removes this file.\n"
    "[Unit]\n"
    f"ConditionPathExists=!{MAINTENANCE_RECORD}\n"
)


def hold_dropin(service: str) -> str:
    """The drop-in of a unit's service (``NAME.service``): /etc/systemd/system wins over the
    quadlet generator's and over the unit's own file, for both kinds of unit."""
    return f"{SYSTEMD_DIR}/{service}.d/{HOLD_DROPIN}"


def parse_maintenance(output: str, exit_code: int) -> MaintenanceRecord | None:
    """The survey's ``maintenance`` section: the record's JSON, or nothing (no window open)."""
    if exit_code != 0:
        raise FactError(f"maintenance record: exit {exit_code}: {output.strip()[:200]}")
    if not output.strip():
        return None
    try:
        return MaintenanceRecord.model_validate(json.loads(output))
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise FactError(f"{MAINTENANCE_RECORD} is not a maintenance record: {first}") from None
