"""plan --json placements against docs/placement.schema.json, the schema written from the
placement-preview specification (docs/design.md#placement-preview): a small validator for exactly
the keywords the schema uses (tested on bad documents), the schema itself (every PlacementPreview
field, the specification's words), every row plan_json writes for passing and refused
placements, and every row the CLI prints for `plan --offline --json`."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.facts.values import LABEL_RECIPE_DIGEST
from tensorless_deploy.gguf.header import HeaderCache, read_header_file
from tensorless_deploy.hostplan.placement import (
    IDENTITY_MISMATCH,
    INFO_PENDING,
    NO_VALID_PLACEMENT,
    HeaderResult,
    ModelPlan,
    PlanOptions,
    card_digest_hex,
    header_key,
    placement_json,
    plan_json,
    plan_model,
)
from tensorless_deploy.launch.spec import LABEL_RECIPE_DIGEST as SPEC_LABEL
from tensorless_deploy.recipe.catalog import recipe_digest
from tests.gguf_tools import write_tiny_llama
from tests.recipe_tools import example, write_recipe
from tests.test_plan import (
    FREE_PORT,
    TINY_ARGS,
    TINY_KV_Q8,
    headers_for,
    inv_host,
    make_entry,
    one,
    plan_host_row,
    survey_facts,
)

REPO = Path(__file__).resolve().parents[1]
SCHEMA_PATH = REPO / "docs" / "placement.schema.json"
# The seed's own example of a PlacementPreview, in its order: every top-level field it has.
SEED_FIELDS = [
    "card_digest",
    "model_id",
    "sharding",
    "instance_meta",
    "instance",
    "memory_delta_by_node",
    "max_context_tokens",
    "default_context_tokens",
    "reserves_context_at_load",
    "kv_bytes_per_token",
    "error",
    "error_code",
    "trust_requirement",
    "compatibility_source",
    "support_claim_ids",
    "compatibility_detail",
    "alternative",
]
HEX64 = re.compile(r"^[a-f0-9]{64}$")


# --- a validator for exactly the keywords docs/placement.schema.json uses ------------------------

ANNOTATIONS = {"$schema", "title", "description", "$comment", "deprecated", "default"}
ASSERTIONS = {"type", "enum", "pattern", "required", "properties", "additionalProperties", "items"}
_TYPES: dict[str, Any] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return type(a) is type(b) and a == b
    return bool(a == b)


def validate(doc: Any, schema: dict[str, Any] | bool, at: str = "$") -> list[str]:
    """Every way doc breaks schema (draft 2020-12 semantics for the keywords above); a keyword
    outside them is an error in the schema, so the schema cannot use one this does not check."""
    if schema is True:
        return []
    if schema is False:
        return [f"{at}: not allowed"]
    assert isinstance(schema, dict)
    unknown = set(schema) - ANNOTATIONS - ASSERTIONS
    if unknown:
        raise ValueError(
            f"{at}: schema keyword(s) this validator does not check: {sorted(unknown)}"
        )
    out: list[str] = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](doc) for t in types):
            return [f"{at}: {doc!r} is not of type {' or '.join(types)}"]
    if "enum" in schema and not any(_json_equal(doc, e) for e in schema["enum"]):
        out.append(f"{at}: {doc!r} is not one of {schema['enum']}")
    if "pattern" in schema and isinstance(doc, str) and not re.search(schema["pattern"], doc):
        out.append(f"{at}: {doc!r} does not match {schema['pattern']}")
    if isinstance(doc, dict):
        out += [f"{at}: {k!r} is required" for k in schema.get("required", []) if k not in doc]
        props = schema.get("properties", {})
        for k, v in doc.items():
            if k in props:
                out += validate(v, props[k], f"{at}.{k}")
            elif "additionalProperties" in schema:
                out += validate(v, schema["additionalProperties"], f"{at}.{k}")
    if isinstance(doc, list) and "items" in schema:
        for i, v in enumerate(doc):
            out += validate(v, schema["items"], f"{at}[{i}]")
    return out


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return data


def valid_row() -> dict[str, Any]:
    return {
        "card_digest": "ab" * 32,
        "model_id": "org/m-GGUF",
        "sharding": None,
        "instance_meta": None,
        "instance": None,
        "memory_delta_by_node": {"h": 1},
        "max_context_tokens": 4096,
        "default_context_tokens": 512,
        "reserves_context_at_load": True,
        "kv_bytes_per_token": 136,
        "error": None,
        "error_code": None,
        "trust_requirement": None,
        "compatibility_source": "card",
        "support_claim_ids": [],
        "compatibility_detail": None,
        "alternative": False,
        "host": "h",  # the tool's own: allowed
    }


def test_validator_accepts_a_valid_row(schema: dict[str, Any]) -> None:
    assert validate(valid_row(), schema) == []


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("card_digest", "sha256:" + "ab" * 32, "does not match"),  # the prefixed form
        ("card_digest", "AB" * 32, "does not match"),  # upper-case hex
        ("card_digest", "ab" * 31, "does not match"),
        ("card_digest", 7, "not of type"),
        ("model_id", None, "not of type"),
        ("sharding", "Data", "is not one of"),
        ("instance_meta", "LlamaServer", "is not one of"),
        ("instance", "x", "not of type"),
        ("memory_delta_by_node", [], "not of type"),
        ("max_context_tokens", 4096.5, "not of type"),
        ("max_context_tokens", True, "not of type"),  # a bool is not an integer
        ("default_context_tokens", "512", "not of type"),
        ("reserves_context_at_load", 1, "not of type"),
        ("reserves_context_at_load", None, "not of type"),
        ("kv_bytes_per_token", False, "not of type"),
        ("error", 0, "not of type"),
        ("error_code", "out_of_memory", "is not one of"),
        ("error_code", "", "is not one of"),
        ("trust_requirement", 1, "not of type"),
        ("compatibility_source", "recipe", "is not one of"),
        ("support_claim_ids", None, "not of type"),
        ("support_claim_ids", ["a", 1], "support_claim_ids[1]"),
        ("compatibility_detail", ["gap"], "not of type"),
        ("alternative", None, "not of type"),
        ("alternative", 0, "not of type"),
    ],
)
def test_validator_rejects_a_bad_value(
    schema: dict[str, Any], field: str, value: Any, why: str
) -> None:
    row = {**valid_row(), field: value}
    problems = validate(row, schema)
    assert len(problems) == 1 and why in problems[0] and field in problems[0], problems


@pytest.mark.parametrize("field", SEED_FIELDS)
def test_validator_rejects_a_missing_seed_field(schema: dict[str, Any], field: str) -> None:
    row = valid_row()
    del row[field]
    assert validate(row, schema) == [f"$: {field!r} is required"]


def test_validator_semantics_and_unknown_keywords() -> None:
    assert validate([1], {"type": "object"}) == ["$: [1] is not of type object"]
    assert validate(1, {"enum": [True]}) != [] and validate(True, {"enum": [1]}) != []
    assert validate(1.0, {"enum": [1]}) == []
    assert validate(None, {"type": ["string", "null"], "pattern": "^a$"}) == []  # strings only
    assert validate({"x": 1}, {"additionalProperties": False}) == ["$.x: not allowed"]
    assert validate({"x": 1}, {"additionalProperties": {"type": "string"}}) != []
    assert validate({"x": 1}, {"properties": {"x": {"type": "integer"}}}) == []
    assert validate({}, {"required": ["a", "b"]}) == ["$: 'a' is required", "$: 'b' is required"]
    with pytest.raises(ValueError, match="minimum"):
        validate(1, {"minimum": 0})
    with pytest.raises(ValueError, match="anyOf"):
        validate({"a": 1}, {"properties": {"a": {"anyOf": []}}})


# --- the schema ----------------------------------------------------------------------------------


def test_schema_has_every_seed_field_typed_and_required(schema: dict[str, Any]) -> None:
    validate(None, schema)  # only keywords the validator checks (it raises on any other)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["type"] == "object" and schema["additionalProperties"] is True
    assert list(schema["properties"]) == SEED_FIELDS
    assert schema["required"] == SEED_FIELDS
    props = schema["properties"]
    assert all("type" in p for p in props.values())
    assert props["card_digest"]["pattern"] == "^[a-f0-9]{64}$"
    assert props["error_code"]["enum"] == [
        "no_valid_placement",
        "placement_info_pending",
        "model_code_approval_required",
        "model_card_identity_mismatch",
        None,
    ]
    assert props["compatibility_source"]["enum"] == ["card", "signed_engine_support", None]
    assert props["trust_requirement"]["deprecated"] is True
    for name in ("reserves_context_at_load", "alternative"):
        assert props[name] == {**props[name], "type": "boolean", "default": False}


DESIGN = Path(__file__).parent.parent / "docs" / "design.md"


def _design_section() -> str:
    """docs/design.md's placement-preview section: the specification's words, in this repo."""
    text = DESIGN.read_text(encoding="utf-8")
    start = text.index("## Placement preview")
    return text[start : text.index("\n## ", start + 1)]


def test_schema_descriptions_quote_the_specification(schema: dict[str, Any]) -> None:
    """Every description of the schema is the specification's text as docs/design.md quotes
    it, and the fields are the specification's, in its order."""
    section = _design_section()
    text = " ".join(section.split())
    for name, prop in schema["properties"].items():
        if "description" in prop and name != "model_id":  # model_id: the model card's words
            assert " ".join(prop["description"].split()) in text, name
    fields = [
        line.split("|")[1].strip().strip("`")
        for line in section.splitlines()
        if line.startswith("| `")
    ]
    assert fields == list(SEED_FIELDS)
    assert "`^[a-f0-9]{64}$`" in section and "`signed_engine_support`" in section


# --- plan_json rows ------------------------------------------------------------------------------


def rows_of(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for m in doc["models"]:
        yield from m["placements"]


def assert_seed_rules(row: dict[str, Any], schema: dict[str, Any]) -> None:
    """The schema, and what this tool's rows promise beyond it (docs/plan.md)."""
    assert validate(row, schema) == [], row
    ok = row["ok"]
    assert (row["error_code"] is None) is ok and (row["error"] is None) is ok
    assert row["sharding"] is None and row["instance_meta"] is None and row["instance"] is None
    assert row["reserves_context_at_load"] is True
    assert row["trust_requirement"] is None and row["support_claim_ids"] == []
    assert row["error_code"] != "model_code_approval_required"
    if ok:
        assert row["card_digest"] == row["recipe_digest"].removeprefix("sha256:")
        assert HEX64.match(row["card_digest"])
        assert row["memory_delta_by_node"] == {row["host"]: row["memory"]["need_bytes"]}
        assert row["max_context_tokens"] == row["largest_context_tokens"] > 0
        assert row["compatibility_source"] == "card" and row["compatibility_detail"] is None
    else:
        assert row["card_digest"] is None and row["memory_delta_by_node"] is None
        assert row["max_context_tokens"] is None and row["compatibility_source"] is None
        assert row["alternative"] is False
        detail = row["compatibility_detail"]
        assert isinstance(detail, str) and detail.endswith(row["error"])
        assert f" on {row['host']}" in detail
        if row["recipe"] is not None:
            assert detail.startswith(f"{row['recipe']} (card {row['card']})")
    if row["recipe_digest"] is not None:
        assert row["recipe_digest"].startswith("sha256:")
        assert HEX64.match(row["recipe_digest"].removeprefix("sha256:"))


def test_passing_and_refused_rows(tiny_path: Path, schema: dict[str, Any]) -> None:
    entry = make_entry(tiny_path)
    hosts = [
        plan_host_row("mixed", survey_facts("mixed-p100-t4-podman5"), port=FREE_PORT),
        inv_host("a"),
        inv_host("old", driver_version="470.57.02"),
        plan_host_row("h200", survey_facts("h200-real-bytes")),
        plan_host_row("ghost", None, "cannot connect: timed out"),
    ]
    mp = plan_model(entry.recipe.model.hf_repo, [entry], hosts, headers_for(entry, tiny_path))
    doc = plan_json([mp], PlanOptions(), offline=False)
    assert doc["schema"] == 2
    rows = list(rows_of(doc))
    for row in rows:
        assert_seed_rules(row, schema)
    by = {(r["host"], r["gpu"]["index"] if r["gpu"] else None): r for r in rows}
    digest = recipe_digest(entry.recipe)

    best = by[("a", 0)]  # an empty P100: 4096 tokens, the most free memory
    assert best["ok"] and best["alternative"] is False and doc["models"][0]["best"]["host"] == "a"
    assert best["card_digest"] == digest.removeprefix("sha256:") and best["recipe_digest"] == digest
    assert best["model_id"] == "tensorless-test/plan-GGUF"
    assert best["max_context_tokens"] == 4096 and best["default_context_tokens"] == 512
    assert best["context_tokens"] == 512 and best["kv_bytes_per_token"] == TINY_KV_Q8
    assert best["memory_delta_by_node"] == {"a": best["memory"]["need_bytes"]}
    assert by[("mixed", 0)]["ok"] and by[("mixed", 0)]["alternative"] is True

    full = by[("mixed", 1)]  # 15876 of 16384 MiB used: nothing fits
    assert full["error_code"] == NO_VALID_PLACEMENT and full["largest_context_tokens"] == 0
    assert full["max_context_tokens"] is None and full["recipe_digest"] == digest
    assert full["kv_bytes_per_token"] == TINY_KV_Q8  # the geometry is known: still shown
    assert full["compatibility_detail"].startswith(
        "tensorless-test/plan-GGUF/p100.toml (card p100) on mixed GPU 1 Tesla P100-PCIE-16GB"
    )
    old = by[("old", 0)]
    assert old["error_code"] == NO_VALID_PLACEMENT and "older than 525.60.13" in old["error"]
    h200 = by[("h200", None)]
    assert h200["error_code"] == NO_VALID_PLACEMENT and h200["recipe_digest"] is None
    assert h200["compatibility_detail"].startswith("tensorless-test/plan-GGUF on h200: no GPU")
    assert h200["kv_bytes_per_token"] is None and h200["default_context_tokens"] is None
    ghost = by[("ghost", None)]
    assert ghost["error_code"] == INFO_PENDING
    json.dumps(doc)


def test_pending_header_and_identity_mismatch_rows(tiny_path: Path, schema: dict[str, Any]) -> None:
    entry = make_entry(tiny_path)
    real = read_header_file(tiny_path)
    wrong = dataclasses.replace(real, file_size=(real.file_size or 0) + 1)
    cases = {
        INFO_PENDING: {header_key(entry.recipe): HeaderResult(None, "HTTP 503")},
        IDENTITY_MISMATCH: {header_key(entry.recipe): HeaderResult(wrong)},
    }
    for code, headers in cases.items():
        mp = plan_model("tensorless-test/plan-GGUF", [entry], [inv_host("a")], headers)
        (row,) = rows_of(plan_json([mp], PlanOptions(), offline=True))
        assert_seed_rules(row, schema)
        assert row["error_code"] == code and row["kv_bytes_per_token"] is None
        assert row["gpu"] is not None and row["recipe_digest"] == recipe_digest(entry.recipe)


def test_untuned_context_keeps_the_recipe_default(tiny_path: Path, schema: dict[str, Any]) -> None:
    """--context N: the row is planned at N (context_tokens); the window without a request is
    still the recipe's own (default_context_tokens), whatever N is."""
    entry = make_entry(tiny_path)
    h = headers_for(entry, tiny_path)
    for context, default in ((1024, 512), (512, 512)):
        mp = plan_model("m", [entry], [inv_host("a")], h, PlanOptions(context=context))
        (row,) = rows_of(plan_json([mp], PlanOptions(context=context), offline=True))
        assert_seed_rules(row, schema)
        assert row["ok"] and row["context_tokens"] == context
        assert row["default_context_tokens"] == default and row["tuned"] is (context == default)


def test_card_digest_is_the_label_digest_without_its_prefix(tiny_path: Path) -> None:
    entry = make_entry(tiny_path)
    mp = plan_model("m", [entry], [inv_host("a")], headers_for(entry, tiny_path))
    row = placement_json(one(mp, "a"))
    assert LABEL_RECIPE_DIGEST == SPEC_LABEL == "io.tensorless.recipe-digest"
    assert "sha256:" + row["card_digest"] == recipe_digest(entry.recipe) == row["recipe_digest"]
    assert card_digest_hex(None) is None
    for bad in ("sha256:" + "0" * 63, "md5:" + "0" * 64, "sha256:" + "G" * 64):
        with pytest.raises(ValueError):
            card_digest_hex(bad)


def test_model_plan_without_rows_is_valid() -> None:
    doc = plan_json([ModelPlan("m", ())], PlanOptions(), offline=True)
    assert doc["ok"] is False and doc["models"][0]["placements"] == []


# --- the CLI: plan --offline --json --------------------------------------------------------------


def _recipe(path: Path, name: str, revision: str, size: int | None = None) -> dict[str, Any]:
    data = example()
    repo = f"tensorless-test/{name}-GGUF"
    data["model"].update(
        name=name,
        hf_repo=repo,
        revision=revision,
        file=path.name,
        size_bytes=size or path.stat().st_size,
    )
    data["run"].update(alias=repo, args=TINY_ARGS, context=512)
    return data


def test_cli_offline_json_rows_validate(
    tmp_path: Path,
    tiny_path: Path,
    schema: dict[str, Any],
) -> None:
    """Every placement the CLI prints validates, passing and refused: a P100 that fits, one that
    loses the ranking, a full one, an old driver, an H200 (no card), a host without
    tensorless_gpus, a header contradicting its recipe, and one that cannot be fetched."""
    size = tiny_path.stat().st_size
    recipes = {
        "tinyok": _recipe(tiny_path, "tinyok", "1" * 40),
        "tinybad": _recipe(tiny_path, "tinybad", "2" * 40, size=size + 1),  # header says size
        "tinyfar": _recipe(tiny_path, "tinyfar", "3" * 40),  # header not cached, server down
    }
    catalog = tmp_path / "recipes"
    for data in recipes.values():
        write_recipe(catalog, data)
    cache = tmp_path / "cache"
    header = read_header_file(tiny_path)
    for name in ("tinyok", "tinybad"):
        m = recipes[name]["model"]
        HeaderCache(cache / "tensorless-deploy" / "headers").put(
            m["hf_repo"], m["revision"], m["file"], header
        )
    p100 = {
        "name": "Tesla P100-PCIE-16GB",
        "compute_cap": "6.0",
        "memory_total_mib": 16384,
        "driver_version": "535.183.01",
    }
    h200 = {
        "name": "NVIDIA H200",
        "compute_cap": "9.0",
        "memory_total_mib": 143771,
        "driver_version": "580.159.04",
    }
    hosts = [
        ("roomy", {"tensorless_gpus": [{**p100, "memory_used_mib": 0}]}),
        ("roomy2", {"tensorless_gpus": [{**p100, "memory_used_mib": 100}]}),
        ("full", {"tensorless_gpus": [{**p100, "memory_used_mib": 16000}]}),
        ("old", {"tensorless_gpus": [{**p100, "driver_version": "470.57.02"}]}),
        ("hopper", {"tensorless_gpus": [h200]}),
        ("nodata", {}),
    ]
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"hosts = {hosts!r}\n", encoding="utf-8")
    with socket.socket() as closed:  # bound, never listening: connections are refused at once
        closed.bind(("127.0.0.1", 0))
        env = {
            **os.environ,
            "HF_ENDPOINT": f"http://127.0.0.1:{closed.getsockname()[1]}",
            "XDG_CACHE_HOME": str(cache),
            "HF_TOKEN": "",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "NO_COLOR": "1",
        }
        argv = ["plan", "-i", str(inventory), "--offline", "--json", "--recipes", str(catalog)]
        # a subprocess, as an operator runs it (pyinfra patches the process it is imported in)
        proc = subprocess.run(
            [sys.executable, "-m", "tensorless_deploy", *argv, *recipes],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    assert proc.returncode == 1, proc.stderr  # tinybad and tinyfar have no placement
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == 2 and doc["offline"] is True
    rows = list(rows_of(doc))
    assert len(rows) == 3 * len(hosts)
    for row in rows:
        assert_seed_rules(row, schema)
    codes = {r["error_code"] for r in rows}
    assert codes == {None, NO_VALID_PLACEMENT, INFO_PENDING, IDENTITY_MISMATCH}
    ok = {r["host"]: r for r in doc["models"][0]["placements"]}
    assert doc["models"][0]["model"] == ok["roomy"]["model_id"] == "tensorless-test/tinyok-GGUF"
    assert ok["roomy"]["ok"] and ok["roomy"]["alternative"] is False
    assert ok["roomy2"]["ok"] and ok["roomy2"]["alternative"] is True
    assert [ok[h]["error_code"] for h in ("full", "old", "hopper", "nodata")] == [
        NO_VALID_PLACEMENT,
        NO_VALID_PLACEMENT,
        NO_VALID_PLACEMENT,
        INFO_PENDING,
    ]
    bad = {r["host"]: r for r in doc["models"][1]["placements"]}
    assert bad["roomy"]["error_code"] == IDENTITY_MISMATCH and "size_bytes" in bad["roomy"]["error"]
    far = {r["host"]: r for r in doc["models"][2]["placements"]}
    assert far["roomy"]["error_code"] == INFO_PENDING and "not readable" in far["roomy"]["error"]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("plan-json") / "tiny.gguf")


def test_a_streamed_plan_is_the_same_bytes_as_the_whole_document(tiny_path: Path) -> None:
    """plan --json above 2,000 rows writes the document row by row (cli.output.stream_json over
    plan_json(lazy=True)): byte for byte the compact json.dumps of the whole document, however
    the chunks fall, with the terminal's controls escaped as emit_json escapes them."""
    import io

    from tensorless_deploy.cli.output import compact, safe, stream_json

    entry = make_entry(tiny_path)
    hosts = [inv_host("a"), inv_host("old", driver_version="470.57.02"), inv_host("b\x1b[2J")]
    hosts.append(plan_host_row("ghost", None, "cannot connect: timed \u202e out"))
    # the same machines under other names (one a name JSON and the terminal guard escape): their
    # rows are the first ones renamed, written from one encoded text each
    hosts += [inv_host("a2"), inv_host("old2", driver_version="470.57.02"), inv_host('q"\\\u202e')]
    mp = plan_model(entry.recipe.model.hf_repo, [entry], hosts, headers_for(entry, tiny_path))
    renamed = {p.host: p.origin.host for p in mp.placements if p.origin is not None}
    assert renamed == {
        "b\x1b[2J": "a",
        "a2": "a",
        "old2": "old",
        'q"\\\u202e': "a",
    }
    whole = plan_json([mp, mp], PlanOptions(), offline=True)
    whole["timing"] = {"planning_s": 0.5}
    expected = safe(json.dumps(whole, ensure_ascii=False, separators=(",", ":"))) + "\n"
    assert "\\u001b" in expected and "\x1b" not in expected
    for chunk, encode in [(1, None), (7, None), (1 << 20, None), (7, compact), (1 << 20, compact)]:
        lazy = plan_json([mp, mp], PlanOptions(), offline=True, lazy=True, encode=encode)
        assert isinstance(lazy["models"][0]["placements"], Iterator)
        lazy["timing"] = {"planning_s": 0.5}
        out = io.StringIO()
        stream_json(lazy, out, chunk=chunk)
        assert out.getvalue() == expected


def test_a_renamed_row_whose_text_holds_a_nul_is_encoded_on_its_own(tiny_path: Path) -> None:
    """placements_text writes a renamed row from its first row's text with the name put in,
    unless that text holds a NUL outside the name's stand-in: then row by row, and either way
    each row's text is what encoding it alone gives."""
    from tensorless_deploy.cli.output import compact
    from tensorless_deploy.hostplan.placement import _renamed, placement_json, placements_text

    entry = make_entry(tiny_path)
    hosts = [inv_host("a"), inv_host("b")]
    mp = plan_model(entry.recipe.model.hf_repo, [entry], hosts, headers_for(entry, tiny_path))
    first = mp.placements[0]
    for notes in [first.notes, (*first.notes, "a GPU said \x00tensorless-host\x00 and \x00")]:
        row = dataclasses.replace(first, notes=notes)
        rows = (row, _renamed(row, "b"), _renamed(row, 'c"\\\x00'))
        shown = dataclasses.replace(mp, placements=rows, best=row)
        expected = [compact(placement_json(p, shown.alternative(p))) for p in rows]
        assert list(placements_text(shown, compact)) == expected
        assert '"host":"c\\"\\\\\\u0000"' in expected[2]
