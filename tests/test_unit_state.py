"""The @@systemd line of facts/scripts/deployed-units.sh: systemd prints NRestarts, Result and
SubState in its own order (``success 0 running`` on systemd 252 and 257, captured in
tests/pyinfra_facts/DeployedUnits), so a crash loop is only seen when each value is told by its
form (found by the docs test: status --json never gave ``restarts`` a number)."""

from __future__ import annotations

import pytest

from tensorless_deploy.facts.parsers import parse_deployed_units

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

UNIT = "@@unit tensorless-x-p100 service /etc/systemd/system/tensorless-x-p100.service"


@pytest.mark.parametrize(
    "line",
    [
        "@@systemd start-limit-hit 5 failed ",
        "@@systemd 5 start-limit-hit failed",
        "@@systemd failed 5 start-limit-hit",
    ],
)
def test_the_systemd_line_in_any_order(line: str) -> None:
    text = f"{UNIT}\n@@active failed\n{line}\n"
    (u,) = parse_deployed_units(text)
    assert (u.restarts, u.result, u.sub_state) == (5, "start-limit-hit", "failed")


def test_a_running_unit_as_systemd_prints_it() -> None:
    text = f"{UNIT}\n@@systemd success 0 running \n"
    (u,) = parse_deployed_units(text)
    assert (u.restarts, u.result, u.sub_state) == (0, "success", "running")
