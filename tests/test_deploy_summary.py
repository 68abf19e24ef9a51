"""deploy's last line counts what serves after the run (cli/deploy.py), from each host's result
and, where a result cannot say, a survey after the run. The same cases on real hosts are in
tests/test_docs_hosts.py."""

from __future__ import annotations

import pytest

from tensorless_deploy.cli.deploy import RESTORED, after_run, serving_after, summary
from tensorless_deploy.fleet.runner import HostResult, Outcome, StepResult

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

DIGEST = "sha256:" + "ab" * 32


def ok(host: str, outcome: Outcome = "changed") -> HostResult:
    return HostResult(host, outcome, recipe="o/r/p100.toml", recipe_digest=DIGEST, card="p100")


def restored(host: str) -> HostResult:
    steps = (StepResult("restart", "failed", ("x not healthy within 9 s", RESTORED)),)
    return HostResult(host, "failed", "restart failed", "o/r/p100.toml", DIGEST, steps=steps)


def test_dry_run_would_serve_and_counts_nothing_as_serving() -> None:
    results = [ok("a", "would change"), ok("b", "no change"), HostResult("c", "skipped", "no card")]
    after = serving_after(results, True, lambda names: {n: DIGEST for n in names})
    assert after == {"a": "new", "b": "new", "c": None}  # never surveyed in a dry run
    assert summary(results, after, True) == "2 of 3 host(s) would serve; failed or skipped: c"


def test_a_restored_unit_serves_without_a_survey() -> None:
    def survey(names: list[str]) -> dict[str, str | None]:
        raise AssertionError(f"surveyed {names}: the step output says it")

    results = [restored("a")]
    after = serving_after(results, False, survey)
    assert after == {"a": "previous"}
    assert summary(results, after, False) == (
        "1 of 1 host(s) serving (a on the unit it had before); failed or skipped: a"
    )


def test_skipped_and_untouched_hosts_are_surveyed_unreachable_ones_not() -> None:
    asked: list[list[str]] = []

    def survey(names: list[str]) -> dict[str, str | None]:
        asked.append(names)
        return {"b": DIGEST, "c": None, "d": DIGEST}

    results = [
        ok("a"),
        HostResult("b", "skipped", "no card", "o/r/p100.toml", DIGEST),
        HostResult("c", "skipped", "no card", "o/r/p100.toml", DIGEST),
        HostResult("d", "untouched", "the roll stopped at x"),
        HostResult("e", "failed", "cannot connect: timed out"),
    ]
    after = serving_after(results, False, survey)
    assert asked == [["b", "c", "d"]]
    assert after == {"a": "new", "b": "previous", "c": None, "d": "previous", "e": None}
    assert summary(results, after, False) == (
        "3 of 5 host(s) serving (b, d on the units they had before); failed or skipped: b, c, d, e"
    )


def test_a_new_unit_removed_or_not_restored_serves_nothing() -> None:
    for line in (
        "removed the new unit: nothing served here before it",
        "restored the previous unit, but it is not healthy either: HTTP 503",
    ):
        r = HostResult(
            "a", "failed", "restart failed", steps=(StepResult("restart", "failed", (line,)),)
        )
        assert after_run(r, False) is None
