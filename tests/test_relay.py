"""fleet.relay without hosts: the schedule (a binomial tree, the controller's one copy, a cut
hop tried again, a wrong sender dropped), the hop's authorized_keys line and its key."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import paramiko

from tensorless_deploy.fleet.relay import (
    ATTEMPTS,
    CONTROLLER,
    Copy,
    Hop,
    RelayReport,
    _schedule,
    authorized_line,
    new_key,
)


class Hosts:
    """The hops' far side: each hop's outcome from a table (default ok), every hop recorded."""

    def __init__(self, outcomes: dict[tuple[str, str], list[str]] | None = None) -> None:
        self.copy = Copy("model", Path("/dev/null"), "0" * 64, 10, {})
        self.outcomes = outcomes or {}
        self.lock = threading.Lock()

    def _hop(self, sender: str, receiver: str) -> Hop:
        with self.lock:
            left = self.outcomes.get((sender, receiver), [])
            kind = left.pop(0) if left else "ok"
        return Hop(sender, receiver, kind, sent=10, error="" if kind == "ok" else kind)

    def from_controller(self, receiver: str) -> Hop:
        return self._hop(CONTROLLER, receiver)

    def between(self, sender: str, receiver: str) -> Hop:
        return self._hop(sender, receiver)


def _run(hosts: Hosts, receivers: list[str], holders: list[str] | None = None) -> RelayReport:
    report = RelayReport()
    relay: Any = hosts
    _schedule(relay, report, receivers, holders or [], None)
    return report


def test_the_controller_sends_once_and_every_sender_held_verified_bytes() -> None:
    names = [f"h{i}" for i in range(16)]
    report = _run(Hosts(), names)
    assert sorted(report.done) == sorted(names) and not report.failed
    assert [h.sender for h in report.hops].count(CONTROLLER) == 1
    assert report.controller_bytes == 10
    held: set[str] = set()
    for hop in report.hops:  # in the order they ended: a sender had its own copy before
        assert hop.sender == CONTROLLER or hop.sender in held, hop
        held.add(hop.receiver)


def test_a_cut_hop_is_tried_again_and_then_the_receiver_fails_with_the_hop_named() -> None:
    report = _run(Hosts({(CONTROLLER, "a"): ["cut"]}), ["a", "b"])
    assert sorted(report.done) == ["a", "b"] and not report.failed
    cut_always = Hosts({("a", "b"): ["cut"] * ATTEMPTS})
    report = _run(cut_always, ["b"], holders=["a"])
    assert list(report.failed) == ["b"] and report.failed["b"].line == "relay a -> b: cut"
    assert len(report.hops) == ATTEMPTS


def test_a_sender_that_served_wrong_bytes_is_not_used_again() -> None:
    hosts = Hosts({("a", "b"): ["wrong"]})
    report = _run(hosts, ["b", "c"], holders=["a"])
    assert sorted(report.done) == ["b", "c"]
    assert all(h.sender != "a" for h in report.hops[1:]), report.hops
    assert report.done["b"].sender == CONTROLLER  # no trusted holder was left


def test_the_hop_key_is_one_command_from_one_address() -> None:
    private, public = new_key("abc-1")
    key = paramiko.Ed25519Key.from_private_key(io.StringIO(private.decode()))
    assert public == f"ssh-ed25519 {key.get_base64()} tensorless-relay-abc-1"
    line = authorized_line(public, "10.0.0.5", "sudo -H -n sh -c 'sh \"/run/x\"'")
    assert line.startswith(
        'restrict,from="10.0.0.5",command="sudo -H -n sh -c \'sh \\"/run/x\\"\'" '
    )
    assert line.endswith(public)


def test_with_a_host_that_held_it_before_the_controller_sends_nothing() -> None:
    report = _run(Hosts(), [f"h{i}" for i in range(6)], holders=["old"])
    assert sorted(report.done) == [f"h{i}" for i in range(6)] and not report.failed
    assert report.controller_bytes == 0
    assert CONTROLLER not in {h.sender for h in report.hops}
    assert report.hops[0].sender == "old"


def test_the_controller_fetches_its_copy_only_when_it_has_to_send() -> None:
    fetched: list[int] = []

    def fetch() -> Path:
        fetched.append(1)
        return Path("/dev/null")

    copy = Copy("model", fetch, "0" * 64, 10, {"a": "/p"}, held={"old": ("/b", "/s")})
    assert copy.source_of("old") == ("/b", "/s") and copy.source_of("a") == ("/p", "")
    assert fetched == []
    assert copy.controller_file() == copy.controller_file() == Path("/dev/null")
    assert fetched == [1]
