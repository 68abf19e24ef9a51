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


@pytest.mark.parametrize(
    ("active", "sub", "health", "restarts", "state"),
    [
        ("active", "running", 200, 3, "serving"),
        ("active", "running", 0, 3, "crash loop"),  # between two starts of a loop
        ("active", "running", 503, 3, "loading"),
        ("active", "running", 0, 0, "unhealthy"),  # never restarted: not answering
        ("activating", "auto-restart", 0, 2, "crash loop"),
        ("failed", "failed", 0, 0, "failed"),
    ],
)
def test_a_unit_that_restarted_and_answers_nothing_is_a_crash_loop(
    active: str, sub: str, health: int, restarts: int, state: str
) -> None:
    from tensorless_deploy.facts.values import DeployedUnit
    from tensorless_deploy.hostplan.status import unit_status

    u = DeployedUnit(
        "tensorless-tiny-p100", "quadlet", active, {}, {}, None, None, health,
        restarts=restarts, sub_state=sub,
    )  # fmt: skip
    assert unit_status(u, None, False).state == state
