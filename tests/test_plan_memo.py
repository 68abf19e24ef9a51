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


def test_hosts_sharing_facts_and_options_objects_are_found_by_identity(
    tiny_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An offline inventory shares one facts and one options object among equal hosts: they are
    planned once without comparing or hashing the facts again; the same facts under other
    options (another port) are planned on their own and say so in their rows."""
    entry = make_entry(tiny_path)
    headers = headers_for(entry, tiny_path)
    a = inv_host("a")
    other = dataclasses.replace(a.options, port=9000)
    hosts = [
        a,
        dataclasses.replace(a, name="b"),
        dataclasses.replace(a, name="c", options=other),
        dataclasses.replace(a, name="d"),
        dataclasses.replace(a, name="e", options=other),
    ]
    hashed: list[int] = []
    facts_type = type(a.facts)
    hash_of = facts_type.__hash__

    def counted(self: object) -> int:
        hashed.append(1)
        return hash_of(self)

    monkeypatch.setattr(facts_type, "__hash__", counted)
    mp = plan_model("tiny", [entry], hosts, headers)
    # twice per distinct (facts, options), a then c (its lookup and its store), never for b, d, e
    assert len(hashed) == 4
    ports = {p.host: p.address for p in mp.placements}
    assert ports == {
        "a": "127.0.0.1:8080",
        "b": "127.0.0.1:8080",
        "c": "127.0.0.1:9000",
        "d": "127.0.0.1:8080",
        "e": "127.0.0.1:9000",
    }
    monkeypatch.setattr(facts_type, "__hash__", hash_of)
    for h in hosts:
        assert tuple(p for p in mp.placements if p.host == h.name) == (
            plan_model("tiny", [entry], [h], headers).placements
        )


def test_an_instance_spec_is_made_once_per_distinct_input(tiny_path: Path) -> None:
    """instance_spec keeps each spec it made: the same inputs give the same object, equal to
    what build_launch_spec makes; any input that differs (a port, a card) gives its own."""
    from tensorless_deploy.facts.values import Gpu
    from tensorless_deploy.hostplan.plan import instance_spec
    from tensorless_deploy.launch.spec import build_launch_spec

    recipe = make_entry(tiny_path).recipe
    options = inv_host("a").options
    card = Gpu(
        index=0,
        uuid="GPU-aaaa",
        name="Tesla P100-PCIE-16GB",
        compute_cap="6.0",
        memory_total_mib=16384,
        memory_used_mib=0,
        driver_version="535.183.01",
    )

    def spec(port: int, gpu: Gpu = card) -> object:
        return instance_spec(
            recipe, options, engine="podman", model_path="/m/x", gpus=(gpu,), cpus=8,
            name="tensorless-tiny", port=port,
        )  # fmt: skip

    first = spec(8080)
    assert spec(8080) is first
    assert first == build_launch_spec(
        recipe,
        engine="podman",
        model_path="/m/x",
        gpu_uuids=["GPU-aaaa"],
        cpus=8,
        port=8080,
        bind=options.bind,
        context=options.context,
        extra_args=options.extra_args,
        name="tensorless-tiny",
        api_key=False,
        tls=options.tls,
        metrics=options.metrics,
        pids_limit=options.pids_limit,
        heal=True,
        device=first.device,  # type: ignore[attr-defined]
        cors_origins=options.cors_origins,
    )
    assert spec(8081) != first and spec(8081).port == 8081  # type: ignore[attr-defined]
    other = spec(8080, card.model_copy(update={"uuid": "GPU-bbbb"}))
    assert other.gpu_uuids == ("GPU-bbbb",)  # type: ignore[attr-defined]
