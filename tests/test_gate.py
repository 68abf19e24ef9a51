"""gate check against real git repositories of recipes (git init, commits), through the CLI as
a recipes repository's CI runs it: each rule both ways, the usage errors, --json. And the pure
parts of gate run: the receipt written into a recipe file with its comments and layout kept,
the promotion rule, the scratch instance's card and port."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.decisions.options import Options
from tensorless_deploy.facts.values import Access, DeployedUnit, GpuApp, HostFacts, Listener
from tensorless_deploy.hostplan.gate import SCRATCH_PORTS, scratch_plan
from tensorless_deploy.launch.render import render_quadlet
from tensorless_deploy.launch.spec import SCRATCH_PREFIX, build_launch_spec, scratch_name
from tensorless_deploy.recipe.catalog import Entry, load_catalog, parse_recipe
from tensorless_deploy.recipe.gate import (
    Measured,
    Receipt,
    RunFacts,
    judge,
    promotion_refusals,
    tables,
    write_receipt,
)
from tests.hosts.fleet import cli
from tests.test_plan import survey_facts

REPO = Path(__file__).resolve().parent.parent
BUILTIN = REPO / "recipes" / "iamMrDuncan" / "Qwen3.8-27B-PN3-GGUF" / "p100.toml"
REL = "recipes/iamMrDuncan/Qwen3.8-27B-PN3-GGUF/p100.toml"
IMAGE_DIGEST = "sha256:35409ff97c2f518e468790c28bd19206ae777a945fcffe5775585e28fd9939a7"
OTHER_DIGEST = "sha256:" + "b" * 64
MEASURED = (
    'source      = "tensorless-deploy gate run 2026-12-01: engine-v0.1.0, '
    f"ghcr.io/iammrduncan/tensorless-engine@{IMAGE_DIGEST}, p100 (Tesla P100-PCIE-16GB), "
    'driver 580.95.05"\n'
)
OLD_SOURCE = (
    'source      = "tensorless bench, engine-v0.1.0 sm60 image, Tesla P100 16 GB (public v0.1.0 '
    'receipt)"\n'
)
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


class Repo:
    """A git repository of recipes: the built-in one committed as the base."""

    def __init__(self, root: Path, rel: str = REL) -> None:
        self.root = root
        root.mkdir(parents=True)
        self.git("init", "-q", "-b", "main")
        self.write(rel, BUILTIN.read_text(encoding="utf-8"))
        self.commit("base")
        self.base = self.git("rev-parse", "HEAD").strip()

    def git(self, *args: str) -> str:
        proc = subprocess.run(
            ["git", "-C", str(self.root), *args],
            capture_output=True,
            text=True,
            env={**os.environ, **GIT_ENV},
            check=True,
        )
        return proc.stdout

    def path(self, rel: str = REL) -> Path:
        return self.root / rel

    def text(self, rel: str = REL) -> str:
        return self.path(rel).read_text(encoding="utf-8")

    def write(self, rel: str, text: str) -> None:
        p = self.path(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")

    def edit(self, *pairs: tuple[str, str], rel: str = REL) -> None:
        text = self.text(rel)
        for old, new in pairs:
            assert old in text, old
            text = text.replace(old, new, 1)
        self.write(rel, text)

    def commit(self, message: str) -> None:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)

    def check(self, *extra: str, code: int, recipes: str = "recipes") -> list[str]:
        """gate check --base <the base commit>, run in the repository as CI runs it."""
        proc = cli(
            "gate", "check", "--base", self.base, "--recipes", str(self.root / recipes), *extra
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode == code, (proc.stdout, proc.stderr)
        return proc.stdout.splitlines()


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    if shutil.which("git") is None:  # pragma: no cover
        pytest.skip("git is not installed")
    return Repo(tmp_path / "recipes-repo")


def test_nothing_changed_passes(repo: Repo) -> None:
    (line,) = repo.check(code=0)
    assert line.startswith("gate check: 1 recipe(s) in recipes/ against ")
    assert line.endswith("0 new, 0 changed, 0 deleted; all hold"), line


def test_comments_notes_titles_and_summary_change_freely(repo: Repo) -> None:
    repo.edit(
        ("schema = 1\n", "# reviewed again\nschema = 1  # the only schema\n"),
        ('title      = "Qwen3.8', 'title      = "Qwen 3.8'),
        ('title              = "NVIDIA Tesla P100 16 GB"', 'title = "Tesla P100"'),
        ('license    = "Apache-2.0', 'license    = "Apache 2.0'),
        ('summary     = "Decode about 30', 'summary     = "Decode about 30.06'),
        ('notes       = ["Median', 'notes       = ["One more note.", "Median'),
        ("[run]\n", "[run]  # as measured\n"),
        ("context     = 65536", "context     = 65_536"),  # the same value, spelled otherwise
    )
    repo.commit("prose")
    (line,) = repo.check(code=0)
    assert "0 new, 1 changed, 0 deleted; all hold" in line


def test_a_run_change_needs_a_new_receipt(repo: Repo) -> None:
    repo.edit(("context     = 65536", "context     = 32768"))
    repo.commit("shorter context")
    lines = repo.check(code=1)
    assert lines[0] == (
        f"{REL}: [receipt]: [run] changed since {repo.base}, but the receipt's measurement "
        "(source, decode_tps, prefill_tps) did not: measure it (tensorless-deploy gate run) or "
        'set status = "draft"'
    )
    assert lines[-1].endswith("1 violation(s)")
    # notes and a summary are no new measurement
    repo.edit(
        ('summary     = "Decode', 'summary     = "Now decode'),
        ("notes       = [", 'notes = ["x", '),
    )
    assert repo.check(code=1)[0].startswith(f"{REL}: [receipt]: [run] changed since")
    # a new measurement on the recipe's image: passes
    repo.edit((OLD_SOURCE, MEASURED), ("short = 30.06", "short = 28.5"))
    repo.check(code=0)


def test_an_engine_change_needs_a_receipt_of_the_new_image(repo: Repo) -> None:
    repo.edit((IMAGE_DIGEST, OTHER_DIGEST))
    lines = repo.check(code=1)
    assert "[engine] changed since" in lines[0]
    # a receipt re-measured, but its source names the old image: measured on another image
    repo.edit((OLD_SOURCE, MEASURED), ("short = 30.06", "short = 31.0"))
    lines = repo.check(code=1)
    assert lines[0] == (
        f"{REL}: [receipt]: source names {IMAGE_DIGEST}, not engine.image's {OTHER_DIGEST}: "
        "the receipt was measured on another image; measure this one (gate run)"
    )
    repo.edit((IMAGE_DIGEST, OTHER_DIGEST))  # the source's digest: the new image
    repo.check(code=0)
    # figures changed, the source left as it was (no digest): a released change is unproven
    repo.write(REL, BUILTIN.read_text(encoding="utf-8"))
    repo.edit(('arch    = "sm60"', 'arch    = "sm61"'), ("short = 30.06", "short = 31.0"))
    lines = repo.check(code=1)
    assert lines[0].startswith(f"{REL}: [receipt]: source names no image digest: it must name")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("c701b6690ec360b16d40f85df1cb76062e30cd38", "d" * 40),  # revision
        ("15ce2d4469673f1f1753c55de3780cfe04311dd6f05cb41633d73df128e91476", "e" * 64),  # sha256
        ("size_bytes = 12954114496", "size_bytes = 12954114497"),
        ('file       = "Qwen3.8-27B-PN3-P0k19.gguf"', 'file       = "Qwen3.8-27B-PN3-P0k18.gguf"'),
    ],
)
def test_a_model_pin_change_is_an_engine_change(repo: Repo, old: str, new: str) -> None:
    repo.edit((old, new))
    lines = repo.check(code=1)
    assert "[model] changed since" in lines[0], lines
    repo.edit((OLD_SOURCE, MEASURED), ("short = 30.06", "short = 29.9"))
    repo.check(code=0)


def test_a_draft_is_exempt(repo: Repo) -> None:
    repo.edit(
        ('status = "released"', 'status = "draft"'),
        ("context     = 65536", "context     = 32768"),
        (IMAGE_DIGEST, OTHER_DIGEST),
        ("c701b6690ec360b16d40f85df1cb76062e30cd38", "d" * 40),
    )
    repo.commit("work in progress")
    repo.check(code=0)


def test_a_release_needs_its_decode_and_a_source_naming_the_image(repo: Repo) -> None:
    # the base holds a draft; this change releases it
    repo.edit(('status = "released"', 'status = "draft"'))
    repo.commit("draft")
    repo.base = repo.git("rev-parse", "HEAD").strip()
    repo.edit(('status = "draft"', 'status = "released"'))
    lines = repo.check(code=1)
    assert lines[0] == (
        f"{REL}: [receipt]: source names no image digest: it must name {IMAGE_DIGEST} "
        "(engine.image's), the image the numbers were measured on"
    )
    repo.edit((OLD_SOURCE, ""))
    assert repo.check(code=1)[0].startswith(f"{REL}: [receipt]: source is missing: a released")
    repo.edit(("decode_tps  = { short = 30.06 }\n", MEASURED))
    lines = repo.check(code=1)
    assert lines[0] == (
        f"{REL}: [receipt]: decode_tps.short is missing: a released recipe needs its measured "
        "decode speed (tensorless-deploy gate run writes it)"
    )
    repo.edit(("prefill_tps", "decode_tps  = { short = 30.06 }\nprefill_tps"))
    repo.check(code=0)


def test_new_recipes_deleted_and_renamed(repo: Repo) -> None:
    other = "recipes/org/tiny-GGUF/p100.toml"
    text = BUILTIN.read_text(encoding="utf-8").replace(
        "iamMrDuncan/Qwen3.8-27B-PN3-GGUF", "org/tiny-GGUF"
    )
    repo.write(other, text.replace('name       = "pn3"\n', ""))  # released, no digest named
    lines = repo.check(code=1)
    assert lines[0].startswith(f"{other}: [receipt]: source names no image digest")
    repo.write(other, text.replace('name       = "pn3"\n', "").replace(OLD_SOURCE, MEASURED))
    (line,) = repo.check(code=0)
    assert "1 new, 0 changed, 0 deleted; all hold" in line
    draft = text.replace('name       = "pn3"\n', "").replace(
        'status = "released"', 'status = "draft"'
    )
    repo.write(other, draft.replace("decode_tps  = { short = 30.06 }\n", ""))
    repo.check(code=0)  # a new draft needs nothing
    # the built-in recipe deleted (it leaves the catalog), and a file moved (a rename is a new
    # recipe at its new path: model and card are the path)
    repo.path().unlink()
    doc = json.loads(
        cli(
            "gate", "check", "--base", repo.base, "--recipes", str(repo.root / "recipes"), "--json"
        ).stdout
    )
    assert doc["ok"] is True and doc["base_commit"] == repo.base
    assert {f["file"]: f["change"] for f in doc["files"]} == {REL: "deleted", other: "new"}


def test_an_invalid_file_is_a_violation(repo: Repo) -> None:
    repo.edit(("[run]", "[run"))
    (first, _last) = repo.check(code=1)
    assert (
        first.startswith(f"{REL}: [file]: invalid TOML: ")
        and "run: tensorless-deploy check" in first
    )


def test_json_names_each_violation(repo: Repo) -> None:
    repo.edit(("context     = 65536", "context     = 32768"), ('"-np", "1"', '"-np", "2"'))
    proc = cli("gate", "check", "--base", "HEAD", "--recipes", str(repo.root / "recipes"), "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["base"] == "HEAD" and doc["recipes"] == "recipes/"
    assert doc["checked"] == 1 and doc["files"] == [{"file": REL, "change": "changed"}]
    (v,) = doc["violations"]
    assert v["file"] == REL and v["table"] == "receipt" and "[run] changed" in v["problem"]


def test_a_repository_of_recipes_at_its_top(tmp_path: Path) -> None:
    """A recipes repository holds <org>/<repo>/<card>.toml at its top: --recipes . there."""
    top = "iamMrDuncan/Qwen3.8-27B-PN3-GGUF/p100.toml"
    repo = Repo(tmp_path / "top", rel=top)
    repo.write(".github/workflows/x.toml", "not = [a recipe")  # dot-named: never a recipe
    repo.commit("ci")
    repo.edit(("context     = 65536", "context     = 1024"), rel=top)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensorless_deploy",
            "gate",
            "check",
            "--base",
            "HEAD^",
            "--recipes",
            ".",
        ],
        cwd=repo.root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith(f"{top}: [receipt]: [run] changed since HEAD^")


def test_usage_errors_exit_2(repo: Repo, tmp_path: Path) -> None:
    recipes = str(repo.root / "recipes")
    cases = [
        (["--base", "nosuchbranch", "--recipes", recipes], "--base nosuchbranch: names no commit"),
        (["--base=-x", "--recipes", recipes], "--base '-x': not a revision"),
        (["--base", "HEAD", "--recipes", str(tmp_path / "nowhere")], "no such recipes directory"),
        (["--base", "HEAD", "--recipes", str(tmp_path)], "not inside a git work tree"),
        (["--recipes", recipes], "the following arguments are required: --base"),
    ]
    for argv, said in cases:
        proc = cli("gate", "check", *argv)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        doc = json.loads(cli("gate", "check", *argv, "--json").stdout)
        assert doc["exit_code"] == 2
    # no git on PATH
    proc = cli("gate", "check", "--base", "HEAD", "--recipes", recipes, env={"PATH": str(tmp_path)})
    assert proc.returncode == 2 and "needs git" in proc.stderr, proc.stderr


def test_this_repositorys_recipes_pass_against_head() -> None:
    proc = cli("gate", "check", "--base", "HEAD")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("gate check: ") and "all hold" in proc.stdout


# --------------------------------------------------------------------------- the receipt

RECEIPT = Receipt(
    source=f"tensorless-deploy gate run 2026-12-01: engine-v0.1.0, x@{IMAGE_DIGEST}, p100 (Tesla"
    " P100-PCIE-16GB), driver 580.95.05",
    summary="Decode 31.20 tok/s at short context.",
    decode_tps={"short": 31.2},
    prefill_tps={"short": 800.0, "ctx_4k": 120.5},
    notes=("Median of 3 runs.", "Prefill at 4k."),
)


def test_the_receipt_is_written_in_place_keeping_comments_and_layout() -> None:
    before = (
        BUILTIN.read_text(encoding="utf-8")
        .replace(
            'status = "released"', '# the gate promotes it\nstatus = "draft"  # not yet measured'
        )
        .replace("[receipt]\n", "[receipt]  # the public receipt\n# measured by hand\n")
    )
    after = write_receipt(before, RECEIPT, promote=True)
    kept = [
        line
        for line in before.splitlines()
        if not line.startswith(
            ("status", "source", "summary", "decode_tps", "prefill_tps", "notes")
        )
    ]
    for line in kept:
        assert line in after.splitlines(), line
    assert 'status = "released"  # not yet measured' in after
    assert "decode_tps  = { short = 31.20 }" in after  # its alignment, the recipes' style
    assert "prefill_tps = { short = 800.00, ctx_4k = 120.50 }" in after
    data = tables(after)["receipt"]
    assert data["decode_tps"] == {"short": 31.2} and data["notes"] == list(RECEIPT.notes)
    assert data["source"] == RECEIPT.source and data["summary"] == RECEIPT.summary
    recipe, problems = parse_recipe(after, REL.removeprefix("recipes/"))
    assert recipe is not None and not problems and recipe.status == "released"
    # the change passes gate check's rules against the file before it
    assert judge(REL, before, after, "base") == ("changed", [])
    # without --promote the status stays
    assert 'status = "draft"' in write_receipt(before, RECEIPT)


def test_a_recipe_without_receipt_gets_one_and_an_inline_one_is_replaced() -> None:
    text = BUILTIN.read_text(encoding="utf-8")
    bare = text[: text.index("[receipt]")]
    after = write_receipt(bare, RECEIPT)
    assert after.startswith(bare) and tables(after)["receipt"]["decode_tps"] == {"short": 31.2}
    inline = bare.replace("schema = 1\n", 'schema = 1\nreceipt = { summary = "x" }\n')
    assert tables(write_receipt(inline, RECEIPT))["receipt"]["prefill_tps"]["ctx_4k"] == 120.5


def _run(**kw: Any) -> RunFacts:
    base: dict[str, Any] = dict(
        tuned=True,
        untuned_reasons=(),
        card="p100",
        card_seen="p100",
        image=f"x@{IMAGE_DIGEST}",
        image_seen=IMAGE_DIGEST,
        comparisons=(Measured("decode_tps.short", 28.0, 30.06, True),),
        tolerance=0.10,
    )
    return RunFacts(**{**base, **kw})


def test_promotion_names_each_failed_condition() -> None:
    assert promotion_refusals(_run()) == []
    assert promotion_refusals(_run(comparisons=())) == []  # no old receipt: nothing to miss
    (why,) = promotion_refusals(
        _run(tuned=False, untuned_reasons=("extra llama-server args: -n 5",))
    )
    assert why == "the run was untuned (extra llama-server args: -n 5)"
    (why,) = promotion_refusals(_run(card_seen=None))
    assert why.startswith("the run was not on the recipe's card p100")
    (why,) = promotion_refusals(_run(image_seen=OTHER_DIGEST))
    assert why == f"the container ran {OTHER_DIGEST}, not the recipe's {IMAGE_DIGEST}"
    (why,) = promotion_refusals(_run(comparisons=(Measured("decode_tps.short", 30.0, 1e6, False),)))
    assert why.startswith("decode_tps.short 30.00 is 0.00x the old receipt's 1e+06, below it")


# --------------------------------------------------------------------------- the scratch card


def _tiny_entry() -> Entry:
    catalog = load_catalog(REPO / "recipes")
    return catalog.entries[0]


def _unit_on(facts: HostFacts, gpu: int, port: int) -> DeployedUnit:
    entry = _tiny_entry()
    spec = build_launch_spec(
        entry.recipe,
        engine="podman",
        model_path="/m/blob",
        gpu_uuids=[facts.gpus.gpus[gpu].uuid or ""],
        cpus=8,
        port=port,
    )
    unit = render_quadlet(spec, digest=entry.digest, notify_healthy=True)
    return DeployedUnit(
        name=spec.name,
        kind="quadlet",
        active="active",
        unit_labels=dict(spec.labels),
        container_labels={},
        image=None,
        image_id=None,
        health=200,
        path=unit.path,
        text=unit.content,
    )


def test_the_scratch_instance_takes_an_idle_card_and_a_free_port() -> None:
    facts = survey_facts("mixed-p100-t4-podman5")  # P100 idle, P100 with 15,876 MiB used, T4
    entry = _tiny_entry()
    name = scratch_name(entry.recipe, "abc123")
    assert name == SCRATCH_PREFIX + "pn3-p100-abc123"
    sp = scratch_plan("h", facts, entry, Options(), (), name, None)
    assert sp.ok and sp.gpu is not None and sp.gpu.index == 0, sp.why()
    spec = sp.instance.spec
    assert spec.name == name and spec.port == SCRATCH_PORTS.start and spec.bind == "127.0.0.1"
    assert spec.gpu_uuids == (facts.gpus.gpus[0].uuid,) and spec.tuning.tuned
    # the port a listener holds, and the one a (stopped) unit owns, are skipped
    held = facts.model_copy(
        update={"listeners": (*(facts.listeners or ()), Listener(address="*", port=18080))}
    )
    sp = scratch_plan("h", held, entry, Options(), [_unit_on(facts, 2, 18081)], name, None)
    assert sp.instance.spec.port == 18082
    # GPU 0 serving, GPU 1 in use by something else: refused, never shared
    sp = scratch_plan("h", facts, entry, Options(), [_unit_on(facts, 0, 8080)], name, None)
    assert not sp.ok and sp.refusal == (
        "every p100 card here is busy (GPU 0 serves tensorless-pn3-p100; GPU 1 has 15876 MiB "
        "in use): gate run measures on an idle card and never shares a serving one (stop the "
        "unit, or pick another host with --limit)"
    )
    # a compute process of something else on GPU 0 (nvidia-smi --query-compute-apps)
    other = GpuApp(gpu_uuid=facts.gpus.gpus[0].uuid or "", pid=4242, used_mib=300)
    sp = scratch_plan("h", facts.model_copy(update={"gpu_apps": (other,)}), entry, Options(), (),
                      name, None)  # fmt: skip
    assert sp.refusal is not None and sp.refusal.startswith(
        "every p100 card here is busy (GPU 0 runs pid 4242; GPU 1 has 15876 MiB in use)"
    )
    unknown = facts.model_copy(update={"listeners": None})
    sp = scratch_plan("h", unknown, entry, Options(), (), name, None)
    assert sp.refusal == (
        "no port for the scratch instance: the survey could not list the listening ports"
    )


def test_a_host_whose_commands_do_not_run_as_root_is_refused_first() -> None:
    """The scratch instance is a transient unit of root's: a survey that ran as a plain user is
    refused with access.root and its fix, as deploy refuses it, before any card is chosen."""
    facts = survey_facts("mixed-p100-t4-podman5")
    entry = _tiny_entry()
    plain = facts.model_copy(update={"access": Access(uid=1000, user="operator")})
    sp = scratch_plan("h", plain, entry, Options(), (), scratch_name(entry.recipe, "a1"), None)
    assert not sp.ok and sp.plan is None and sp.refusal is not None
    assert sp.refusal.startswith(
        "access.root: commands run as operator (uid 1000), not root, and the inventory does "
        "not set _sudo (fix: give operator NOPASSWD sudo"
    ), sp.refusal
    root = facts.model_copy(update={"access": Access(uid=0, user="root", sudo_user="operator")})
    assert scratch_plan("h", root, entry, Options(), (), "n", None).ok
