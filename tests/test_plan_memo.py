"""plan over a fleet: hosts with equal facts and options are planned once and their rows reused
under each host's own name; the rows are exactly what planning each host alone gives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tensorless_deploy.hostplan import placement
from tensorless_deploy.hostplan.placement import plan_model
from tensorless_deploy.hostplan.plan import SurveyedHost
from tests.test_plan import headers_for, inv_host, make_entry, tiny_path

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

__all__ = ["tiny_path"]


def test_equal_hosts_get_equal_rows_but_their_names(
    tiny_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = make_entry(tiny_path)
    headers = headers_for(entry, tiny_path)
    hosts = [
        inv_host("a"),
        inv_host("b", memory_used_mib=15876),
        inv_host("c"),
        inv_host("d", memory_used_mib=15876),
        inv_host("e"),
    ]
    computed: list[str] = []
    rows_of = placement._rows_of

    def counted(
        model: str, host: SurveyedHost, rc: placement._Recipes
    ) -> list[placement.Placement]:
        computed.append(host.name)
        return rows_of(model, host, rc)

    monkeypatch.setattr(placement, "_rows_of", counted)
    mp = plan_model("tiny", [entry], hosts, headers)
    assert computed == ["a", "b"]  # c and e are a, d is b
    monkeypatch.setattr(placement, "_rows_of", rows_of)
    for h in hosts:  # each host planned alone gives the same rows
        alone = plan_model("tiny", [entry], [h], headers).placements
        mine = tuple(p for p in mp.placements if p.host == h.name)
        assert mine == alone
    assert [p.host for p in mp.placements] == ["a", "b", "c", "d", "e"]
    assert mp.best is not None and mp.best.host == "a"


def test_facts_that_cannot_be_hashed_are_planned_each(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    headers = headers_for(entry, tiny_path)
    a = inv_host("a")
    assert a.facts is not None
    # facts holding a list (as a surveyed host's unit labels hold a dict) cannot be a key
    odd = a.facts.model_copy(update={"problems": ["a section nobody could read"]})
    b = dataclasses.replace(a, name="b", facts=odd)
    with pytest.raises(TypeError):
        hash((odd, b.options))
    mp = plan_model("tiny", [entry], [a, b], headers)
    assert [p.host for p in mp.placements] == ["a", "b"]
    assert dataclasses.replace(mp.placements[1], host="a") == mp.placements[0]
