"""Progress on a terminal: the local download bar and the fleet's transfer lines, drawn only on a
terminal and never with --json, with rate and time left from the bytes really moved."""

from __future__ import annotations

import io
import re
import sys

import pytest

from tensorless_deploy.cli import common
from tensorless_deploy.cli.common import Bar, FleetProgress, rate_eta

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def terminal(monkeypatch: pytest.MonkeyPatch) -> Terminal:
    """stderr as a terminal, set in the test itself (pytest's capture resets sys.stderr
    between a fixture's setup and the test's call)."""
    t = Terminal()
    monkeypatch.setattr(sys, "stderr", t)
    monkeypatch.setenv("NO_COLOR", "1")
    return t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(common.time, "monotonic", c)
    return c


def lines(t: Terminal) -> list[str]:
    """What the terminal shows: each carriage return redraws the line."""
    return [seg.split("\r")[-1].rstrip() for seg in t.getvalue().split("\n") if seg]


def test_rate_and_time_left() -> None:
    assert rate_eta(50, 100, 0, 10.0) == ""  # nothing moved yet: no rate to tell
    assert rate_eta(50, 100, 50, 0.1) == ""  # too soon to tell
    assert rate_eta(40_000_000, 100_000_000, 20_000_000, 2.0) == ", 10.0 MB/s, ETA 0:06"
    assert rate_eta(0, 6_000_000_000, 10_000_000, 1.0).endswith("ETA 10:00")


def test_fleet_lines_per_transfer_with_the_slowest_host(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    term = terminal(monkeypatch)
    p = FleetProgress()
    p("gpu1", "push model", 0, 100_000_000)
    p("gpu2", "push model", 0, 100_000_000)
    clock.now += 2
    p("gpu1", "push model", 60_000_000, 100_000_000)
    p("gpu2", "push model", 20_000_000, 100_000_000)  # within 0.25 s of the last draw: kept
    assert lines(term)[-1].endswith("(30%), 30.0 MB/s, ETA 0:04; slowest gpu2 0%")
    clock.now += 0.5  # 80 MB in 2.5 s: 32 MB/s, 120 MB to go
    p("gpu2", "push model", 20_000_000, 100_000_000)
    shown = lines(term)[-1]
    assert (
        shown == "push model: 2 host(s), 80.0/200.0 MB (40%), 32.0 MB/s, ETA 0:03; slowest gpu2 20%"
    )
    clock.now += 2
    p("gpu1", "push model", 100_000_000, 100_000_000)
    p("gpu2", "push model", 100_000_000, 100_000_000)
    p("gpu2", "push model", 100_000_000, 100_000_000)  # the final report again: no new line
    p("gpu1", "push image", 5_000_000, 10_000_000)
    p.close()
    out = lines(term)
    assert out[0].startswith("push model: 2 host(s), 200.0/200.0 MB (100%)"), out
    assert "slowest" not in out[0]
    assert out[1].startswith("push image: 1 host(s), 5.0/10.0 MB (50%)"), out
    assert len(out) == 2 and term.getvalue().endswith("\n")


def test_nothing_on_a_pipe_or_with_json(monkeypatch: pytest.MonkeyPatch) -> None:
    term = terminal(monkeypatch)
    quiet = FleetProgress(quiet=True)
    quiet("gpu1", "download model", 5, 10)
    quiet.close()
    Bar("tiny.gguf", 10, quiet=True)(10, 10)
    assert term.getvalue() == ""
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    p = FleetProgress()
    assert not p.tty
    p("gpu1", "download model", 10, 10)
    Bar("tiny.gguf", 10)(10, 10)
    assert pipe.getvalue() == ""


def test_the_local_bar_counts_only_bytes_moved_now(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    term = terminal(monkeypatch)
    bar = Bar("tiny.gguf", 100_000_000)
    bar(50_000_000, 100_000_000)  # resumed: half was already here
    clock.now += 5
    bar(100_000_000, 100_000_000)
    (shown,) = lines(term)
    assert re.search(r"100\.0% 100\.0/100\.0 MB, 10\.0 MB/s, ETA 0:00$", shown), shown


def test_a_later_batch_of_a_roll_gets_a_line_of_its_own(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    term = terminal(monkeypatch)
    p = FleetProgress()
    p("gpu1", "download model", 0, 10_000_000)
    clock.now += 1
    p("gpu1", "download model", 10_000_000, 10_000_000)
    clock.now += 60  # the batch starts its server, the next batch begins
    p("gpu2", "download model", 0, 10_000_000)
    clock.now += 2
    p("gpu2", "download model", 10_000_000, 10_000_000)
    p.close()
    first, second = lines(term)
    assert first.startswith("download model: 1 host(s), 10.0/10.0 MB (100%), 10.0 MB/s")
    assert second.startswith("download model: 1 host(s), 10.0/10.0 MB (100%), 5.0 MB/s"), second
