"""bench's arithmetic and receipt table (pure), and its refusals against no server."""

from __future__ import annotations

import json
import sys

import pytest

from tensorless_deploy.local.bench import (
    BenchError,
    Sample,
    compare,
    parse_timings,
    receipt_toml,
    summarise,
)
from tensorless_deploy.recipe import Recipe
from tests.hosts.fleet import cli
from tests.recipe_tools import example

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def samples(*decode: float) -> list[Sample]:
    return [Sample(429, 100.0 + i, 256, d) for i, d in enumerate(decode)]


def test_median_and_spread() -> None:
    s = summarise(samples(30.0, 10.0, 20.0))
    assert (s.decode_median, s.decode_min, s.decode_max) == (20.0, 10.0, 30.0)
    assert s.prefill_median == 101.0 and s.runs == 3
    assert summarise(samples(1.0, 3.0)).decode_median == 2.0
    with pytest.raises(BenchError):
        summarise([])


def test_compare_with_receipt_and_tolerance() -> None:
    recipe = Recipe.model_validate(example())  # decode_tps.short = 30.06, prefill ctx_4k only
    (c,) = compare(summarise(samples(27.1, 27.2, 27.3)), recipe, tolerance=0.10)
    assert c.key == "decode_tps.short" and c.receipt == 30.06
    assert c.ratio == pytest.approx(27.2 / 30.06) and c.meets  # 0.905 >= 0.90
    (c,) = compare(summarise(samples(27.0, 26.9, 27.0)), recipe, tolerance=0.10)
    assert not c.meets  # 0.898 < 0.90


def test_parse_timings_from_llama_server_answer() -> None:
    body = json.dumps(
        {
            "content": "x",
            "timings": {
                "prompt_n": 429,
                "prompt_per_second": 812.5,
                "predicted_n": 256,
                "predicted_per_second": 30.1,
            },
        }
    ).encode()
    assert parse_timings(body) == Sample(429, 812.5, 256, 30.1)
    with pytest.raises(BenchError, match="no usable timings"):
        parse_timings(b'{"content": "x"}')
    with pytest.raises(BenchError):
        parse_timings(b"not json")


def test_receipt_table_is_a_valid_recipe_receipt() -> None:
    s = summarise(samples(30.0, 31.0, 29.0))
    text = receipt_toml(s, "ghcr.io/x/engine@sha256:" + "a" * 64, "p100", "2026-11-30", True)
    receipt = tomllib.loads(text)["receipt"]
    data = example()
    data["receipt"] = receipt
    recipe = Recipe.model_validate(data)
    assert recipe.receipt.decode_tps == {"short": 30.0}
    assert "sha256:" + "a" * 64 in (recipe.receipt.source or "") and "p100" in recipe.receipt.source
    untuned = receipt_toml(s, "x@sha256:" + "a" * 64, "p100", "2026-11-30", False)
    assert "UNTUNED" in untuned


def test_unreachable_server_fails_clearly() -> None:
    proc = cli("bench", "pn3", "--url", "http://127.0.0.1:9")
    assert proc.returncode == 1
    assert "not answering" in proc.stderr and "Traceback" not in proc.stderr
