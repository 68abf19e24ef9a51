"""Every rule of recipe schema 1 (docs/design.md): a recipe that breaks it is refused, naming
the file and the key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.errors import RecipeError, UnknownModelError, UsageError
from tensorless_deploy.recipe import load_catalog, recipe_digest
from tensorless_deploy.recipe.flags import OWNED
from tests.recipe_tools import example, variant, write_recipe

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

REL = "iamMrDuncan/Qwen3.8-27B-PN3-GGUF/p100.toml"
DIGEST = "35409ff97c2f518e468790c28bd19206ae777a945fcffe5775585e28fd9939a7"


def problems(tmp_path: Path, data: dict[str, Any], rel: str | None = None) -> list[str]:
    write_recipe(tmp_path, data, rel)
    with pytest.raises(RecipeError) as info:
        load_catalog(tmp_path)
    return info.value.problems


def setter(dotted: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(data: dict[str, Any]) -> None:
        *path, last = dotted.split(".")
        node = data
        for part in path:
            node = node.setdefault(part, {})
        if value is DELETE:
            del node[last]
        else:
            node[last] = value

    return apply


DELETE = object()

# (the key it names, the mutation, a piece of the message)
CASES: list[tuple[str, str, Any, str]] = [
    ("schema", "schema", 2, "must be 1; this recipe uses schema 2"),
    ("schema", "schema", DELETE, "is required"),
    ("schema", "schema", "1", 'must be an integer, not a string ("1")'),
    ("status", "status", "beta", "must be 'draft' or 'released'"),
    ("status", "status", DELETE, "is required"),
    ("colour", "colour", "red", "unknown key (the schema has: schema, status, model"),
    ("model.foo", "model.foo", 1, "unknown key (the schema has: name, title, hf_repo"),
    ("run.extra", "run.extra", [], "unknown key (the schema has: alias, context"),
    ("model.name", "model.name", "PN3", "must be lowercase letters"),
    ("model.name", "model.name", "pn 3", "must be lowercase letters"),
    ("model.title", "model.title", "two\nlines", "control characters"),
    ("model.hf_repo", "model.hf_repo", "no-slash", "must be a Hugging Face repository id"),
    ("model.hf_repo", "model.hf_repo", "a/b/c", "must be a Hugging Face repository id"),
    ("model.hf_repo", "model.hf_repo", DELETE, "is required"),
    (
        "model.revision",
        "model.revision",
        "main",
        'must be a 40-character lowercase hex commit, not a branch or tag ("main")',
    ),
    (
        "model.revision",
        "model.revision",
        "C701B6690EC360B16D40F85DF1CB76062E30CD38",
        "40-character lowercase hex",
    ),
    ("model.revision", "model.revision", "v1.0", "not a branch or tag"),
    ("model.file", "model.file", "../x.gguf", "must be a clean relative path"),
    ("model.file", "model.file", "/abs/x.gguf", "must be a clean relative path"),
    ("model.file", "model.file", "dir//x.gguf", "must be a clean relative path"),
    ("model.file", "model.file", "dir\\x.gguf", "must be a clean relative path"),
    ("model.file", "model.file", "c:x.gguf", "must be a clean relative path"),
    ("model.file", "model.file", "a/./x.gguf", "must be a clean relative path"),
    ("model.file", "model.file", "x\n.gguf", "control characters"),
    ("model.file", "model.file", "", "must be a clean relative path"),
    ("model.sha256", "model.sha256", "abc", "must be 64 lowercase hex characters"),
    ("model.sha256", "model.sha256", "A" * 64, "must be 64 lowercase hex characters"),
    ("model.size_bytes", "model.size_bytes", -1, "must not be negative (-1)"),
    ("model.size_bytes", "model.size_bytes", "12", "must be an integer, not a string"),
    ("model.size_bytes", "model.size_bytes", 1.5, "must be an integer, not a float"),
    ("model.size_bytes", "model.size_bytes", True, "must be an integer, not a boolean"),
    ("model.license", "model.license", DELETE, "is required"),
    ("model.license", "model.license", " ", "must not be empty"),
    ("card.compute_capability", "card.compute_capability", 6.0, "must be a string, not a float"),
    ("card.compute_capability", "card.compute_capability", "sm60", "must be MAJOR.MINOR"),
    ("card.min_memory_mib", "card.min_memory_mib", 0, "must be positive (0)"),
    ("card.min_driver", "card.min_driver", "525", "must be a dotted version"),
    ("card.min_driver", "card.min_driver", "latest", "must be a dotted version"),
    ("card.title", "card.title", "P100\r", "control characters"),
    ("engine.release", "engine.release", "", "must not be empty"),
    ("engine.arch", "engine.arch", "SM60", 'must be lowercase letters, digits and "_"'),
    (
        "engine.image",
        "engine.image",
        "ghcr.io/iammrduncan/tensorless-engine:0.1.0-sm60",
        "must be pinned by digest",
    ),
    (
        "engine.image",
        "engine.image",
        f"ghcr.io/iammrduncan/tensorless-engine:0.1.0@sha256:{DIGEST}",
        "without a tag",
    ),
    ("engine.image", "engine.image", "ghcr.io/x/y@sha256:abc", '"@sha256:" and 64 lowercase hex'),
    ("engine.image", "engine.image", f"ghcr.io/x/y@sha512:{DIGEST}", '"@sha256:"'),
    ("engine.image", "engine.image", f"Bad Name@sha256:{DIGEST}", "invalid image name"),
    ("run.alias", "run.alias", "my model", 'must be letters, digits, ".", "_", "-" and "/"'),
    ("run.context", "run.context", 0, "must be positive (0)"),
    ("run.context", "run.context", "65536", "must be an integer, not a string"),
    ("run.threads_max", "run.threads_max", -2, "must be positive (-2)"),
    ("run.args", "run.args", "-fa on", "must be an array, not a string"),
    ("run.args[1]", "run.args", ["-np", 1], "must be a string, not an integer"),
    ("run.args", "run.args", ["--jinja", "x\ny"], "control characters"),
    ("run.env", "run.env", {"OMP_NUM_THREADS": "4"}, 'must not set "OMP_NUM_THREADS"'),
    ("run.env", "run.env", {"LLAMA_ARG_PORT": "9"}, 'must not set "LLAMA_ARG_PORT"'),
    ("run.env", "run.env", {"1BAD": "x"}, "not a valid variable name"),
    ("run.env", "run.env", {"A-B": "x"}, "not a valid variable name"),
    ("run.env.FOO", "run.env", {"FOO": 1}, "must be a string, not an integer"),
    ("run.env", "run.env", {"FOO": "a\nB=c"}, "control characters"),
    ("receipt.decode_tps", "receipt.decode_tps", {"short": -1.0}, "must be a finite number"),
    ("receipt.decode_tps", "receipt.decode_tps", {"short": float("nan")}, "finite number"),
    ("receipt.decode_tps", "receipt.decode_tps", {"ctx_4k": 1.0}, 'unknown key "ctx_4k"'),
    ("receipt.decode_tps.short", "receipt.decode_tps", {"short": "fast"}, "must be a number"),
    ("receipt.prefill_tps", "receipt.prefill_tps", {"ctx_4k": float("inf")}, "finite number"),
    ("receipt.prefill_tps", "receipt.prefill_tps", {"Ctx 4K": 1.0}, "lowercase letters"),
    ("receipt.notes", "receipt.notes", "one", "must be an array"),
    ("receipt.price", "receipt.price", 1, "unknown key"),
    ("model", "model", DELETE, "is required"),
    ("model", "model", "x", "must be a table, not a string"),
]


@pytest.mark.parametrize(("key", "dotted", "value", "message"), CASES)
def test_rule_broken_names_file_and_key(
    tmp_path: Path, key: str, dotted: str, value: Any, message: str
) -> None:
    data = example()
    setter(dotted, value)(data)
    found = problems(tmp_path, data, REL)
    prefix = f"{REL}: {key}: "
    assert any(p.startswith(prefix) and message in p for p in found), found


@pytest.mark.parametrize("flag", [s for f in OWNED for s in f.spellings])
def test_launcher_flags_refused_in_args(tmp_path: Path, flag: str) -> None:
    data = example()
    data["run"]["args"] = ["-fa", "on", flag, "1"]
    found = problems(tmp_path, data)
    (line,) = found
    assert line.startswith(f'{REL}: run.args: must not contain "{flag}": the launcher sets --')
    assert line.endswith("(remove it)")


def test_launcher_flag_with_equals_refused(tmp_path: Path) -> None:
    data = example()
    data["run"]["args"] = ["--port=8081"]
    assert 'must not contain "--port"' in problems(tmp_path, data)[0]


def test_flag_that_only_looks_like_a_launcher_flag_is_allowed(tmp_path: Path) -> None:
    data = example()
    data["run"]["args"] = ["-ctk", "q4_0", "--threads-http", "4", "-cb", "--mlock"]
    write_recipe(tmp_path, data)
    assert load_catalog(tmp_path).entries[0].recipe.run.args[-1] == "--mlock"


def test_all_problems_of_a_file_at_once(tmp_path: Path) -> None:
    data = example()
    data["model"]["revision"] = "main"
    data["model"]["sha256"] = "x"
    data["run"]["context"] = 0
    data["bogus"] = 1
    found = problems(tmp_path, data, REL)
    keys = sorted(p.split(": ")[1] for p in found)
    assert keys == ["bogus", "model.revision", "model.sha256", "run.context"]
    assert all(p.startswith(REL + ": ") for p in found)


def test_path_must_match_hf_repo(tmp_path: Path) -> None:
    found = problems(tmp_path, example(), "iamMrDuncan/Other-GGUF/p100.toml")
    assert found == [
        "iamMrDuncan/Other-GGUF/p100.toml: model.hf_repo: must equal the directory "
        '"iamMrDuncan/Other-GGUF" ("iamMrDuncan/Qwen3.8-27B-PN3-GGUF"); move the file or fix '
        "the key"
    ]


def test_path_case_must_match_hf_repo(tmp_path: Path) -> None:
    found = problems(tmp_path, example(), "iammrduncan/qwen3.8-27b-pn3-gguf/p100.toml")
    assert "model.hf_repo: must equal the directory" in found[0]


def test_path_must_match_card_id(tmp_path: Path) -> None:
    found = problems(tmp_path, example(), "iamMrDuncan/Qwen3.8-27B-PN3-GGUF/t4.toml")
    assert found == [
        'iamMrDuncan/Qwen3.8-27B-PN3-GGUF/t4.toml: card.id: must equal the file name "t4" '
        '("p100"); rename the file or fix the key'
    ]


@pytest.mark.parametrize("rel", ["p100.toml", "iamMrDuncan/p100.toml", "a/b/c/p100.toml"])
def test_recipe_at_wrong_depth_refused(tmp_path: Path, rel: str) -> None:
    assert problems(tmp_path, example(), rel) == [
        f"{rel}: recipe files must sit at <org>/<repo>/<card>.toml"
    ]


def test_invalid_toml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / REL
    path.parent.mkdir(parents=True)
    path.write_text('schema = 1\nstatus = "released\n', encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_catalog(tmp_path)
    (line,) = info.value.problems
    assert line.startswith(f"{REL}: invalid TOML: ") and "line 2" in line


def test_one_invalid_recipe_fails_the_whole_load(tmp_path: Path) -> None:
    write_recipe(tmp_path, example())
    bad = variant("org/Other-GGUF")
    bad["model"]["sha256"] = "nope"
    write_recipe(tmp_path, bad)
    with pytest.raises(RecipeError) as info:
        load_catalog(tmp_path)
    assert [p.split(": ")[0] for p in info.value.problems] == ["org/Other-GGUF/p100.toml"]


def test_dot_files_and_other_files_are_ignored(tmp_path: Path) -> None:
    write_recipe(tmp_path, example())
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "broken.toml").write_text("not = [valid", encoding="utf-8")
    (tmp_path / "org" / ".hidden").mkdir(parents=True)
    (tmp_path / "org" / ".hidden" / "x.toml").write_text("garbage ===", encoding="utf-8")
    (tmp_path / "iamMrDuncan" / "Qwen3.8-27B-PN3-GGUF" / ".p100.toml.swp").write_text("x")
    (tmp_path / "iamMrDuncan" / "Qwen3.8-27B-PN3-GGUF" / ".draft.toml").write_text("[[[")
    (tmp_path / "README.md").write_text("# recipes\n")
    (tmp_path / "iamMrDuncan" / "notes.txt").write_text("x = [")
    catalog = load_catalog(tmp_path)
    assert [e.path for e in catalog.entries] == [REL]


def test_repo_ids_differing_only_in_case_refused(tmp_path: Path) -> None:
    write_recipe(tmp_path, variant("Org/Model-GGUF", card="p100"))
    write_recipe(tmp_path, variant("org/model-gguf", card="t4"))
    with pytest.raises(RecipeError) as info:
        load_catalog(tmp_path)
    assert any(
        "model.hf_repo:" in p and "differs only in case" in p for p in info.value.problems
    ), info.value.problems


def test_short_name_unique_across_models(tmp_path: Path) -> None:
    write_recipe(tmp_path, variant("org/a-GGUF", name="same"))
    write_recipe(tmp_path, variant("org/b-GGUF", name="same"))
    with pytest.raises(RecipeError) as info:
        load_catalog(tmp_path)
    assert info.value.problems == [
        'org/b-GGUF/p100.toml: model.name: "same" is already the short name of org/a-GGUF '
        "(org/a-GGUF/p100.toml); short names are unique across models"
    ]


def test_short_name_shared_by_one_models_cards(tmp_path: Path) -> None:
    write_recipe(tmp_path, variant("org/a-GGUF", card="p100", name="a"))
    write_recipe(tmp_path, variant("org/a-GGUF", card="t4", name="a"))
    catalog = load_catalog(tmp_path)
    assert [e.recipe.card.id for e in catalog.find("a")] == ["p100", "t4"]


def test_cards_of_one_model_with_different_short_names_refused(tmp_path: Path) -> None:
    write_recipe(tmp_path, variant("org/a-GGUF", card="p100", name="a"))
    write_recipe(tmp_path, variant("org/a-GGUF", card="t4", name="b"))
    with pytest.raises(RecipeError) as info:
        load_catalog(tmp_path)
    assert all("must share one short name" in p for p in info.value.problems)
    assert len(info.value.problems) == 2


def test_lookup_without_case_and_by_short_name(tmp_path: Path) -> None:
    write_recipe(tmp_path, example())
    catalog = load_catalog(tmp_path)
    assert catalog.find("IAMMRDUNCAN/qwen3.8-27b-pn3-gguf")[0].path == REL
    assert catalog.find("pn3")[0].path == REL
    assert catalog.card("pn3", "p100").path == REL
    with pytest.raises(UsageError, match=r"no recipe for card 'h200' \(cards: p100\)"):
        catalog.card("pn3", "h200")


def test_unknown_model_suggests_closest(tmp_path: Path) -> None:
    write_recipe(tmp_path, example())
    with pytest.raises(UnknownModelError) as info:
        load_catalog(tmp_path).find("qwen3.8-27b")
    assert info.value.suggestions == ["iamMrDuncan/Qwen3.8-27B-PN3-GGUF"]
    with pytest.raises(UnknownModelError) as info:
        load_catalog(tmp_path).find("pn4")
    assert info.value.suggestions == ["pn3"]


@pytest.mark.parametrize(
    ("status", "dotted", "value", "state"),
    [
        ("released", None, None, "released"),
        ("draft", None, None, "draft"),
        ("draft", "model.revision", "0" * 40, "draft, unpublished"),
        ("released", "model.sha256", "0" * 64, "released, unpublished"),
        ("released", "model.size_bytes", 0, "released, unpublished"),
        ("draft", "engine.image", "ghcr.io/x/engine@sha256:" + "0" * 64, "draft, unpublished"),
    ],
)
def test_states(tmp_path: Path, status: str, dotted: str | None, value: Any, state: str) -> None:
    data = example()
    data["status"] = status
    if dotted:
        setter(dotted, value)(data)
    write_recipe(tmp_path, data)
    recipe = load_catalog(tmp_path).entries[0].recipe
    assert recipe.state == state
    assert recipe.unpublished == state.endswith("unpublished")


def test_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such recipes directory"):
        load_catalog(tmp_path / "nope")


def test_recipe_digest_is_canonical_and_content_sensitive(tmp_path: Path) -> None:
    data = example()
    write_recipe(tmp_path, data)
    first = load_catalog(tmp_path).entries[0].recipe
    # Same content written with keys in another order: same digest.
    reordered = {k: data[k] for k in reversed(list(data))}
    reordered["model"] = dict(reversed(list(data["model"].items())))
    write_recipe(tmp_path, reordered)
    again = load_catalog(tmp_path).entries[0].recipe
    assert recipe_digest(first) == recipe_digest(again)
    data["run"]["context"] = 4096
    write_recipe(tmp_path, data)
    changed = load_catalog(tmp_path).entries[0].recipe
    assert recipe_digest(changed) != recipe_digest(first)
    assert recipe_digest(first).startswith("sha256:") and len(recipe_digest(first)) == 71


def test_builtin_catalog_is_valid() -> None:
    catalog = load_catalog()
    assert catalog.find("pn3")[0].recipe.receipt.decode_tps == {"short": 30.06}


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (dict(repo="org/a-GGUF", name="co.ll"), dict(repo="org/b-GGUF", name="co-ll")),
        (dict(repo="advorg/x-y-GGUF"), dict(repo="advorg-x/y-GGUF")),
        (dict(repo="Org/Dot.Name"), dict(repo="org/dot-name-x", name="org-dot-name")),
    ],
)
def test_recipes_whose_units_share_a_name_are_refused_naming_both(
    tmp_path: Path, first: dict[str, Any], second: dict[str, Any]
) -> None:
    a = variant(first["repo"], name=first.get("name"))
    b = variant(second["repo"], name=second.get("name"))
    write_recipe(tmp_path, a)
    write_recipe(tmp_path, b)
    with pytest.raises(RecipeError) as info:
        load_catalog(tmp_path)
    unit = [p for p in info.value.problems if "unit name" in p]
    assert len(unit) == 1, info.value.problems
    paths = sorted(f"{r['model']['hf_repo']}/p100.toml" for r in (a, b))
    assert all(p in unit[0] for p in paths), unit
    assert "would replace the other's unit" in unit[0] and "model.name" in unit[0]


def test_a_unit_name_that_is_another_recipes_instance_is_refused(tmp_path: Path) -> None:
    # org/m-GGUF on p100 is tensorless-org-m-gguf-p100; its second instance ...-p100-1
    write_recipe(tmp_path, variant("org/m-GGUF"))
    write_recipe(tmp_path, variant("org/n-GGUF", card="p100-1", name="org-m-gguf"))
    with pytest.raises(RecipeError) as info:
        load_catalog(tmp_path)
    assert info.value.problems == [
        "org/n-GGUF/p100-1.toml: its unit name tensorless-org-m-gguf-p100-1 is the name of "
        "instance 1 of org/m-GGUF/p100.toml (tensorless-org-m-gguf-p100); give one of them a "
        "model.name of its own (units are named after it)"
    ]
