"""Docs that cannot lie, the fast half (no test hosts): every page is covered or listed as not
yet covered; every shell block of a covered page is marked (run here, run on the test hosts by
tests/test_docs_hosts.py, run by another named test, or illustrative with a reason); the blocks
marked ``fast`` run here with their documented exit status and output; every documented flag
exists in the argparse tree, every documented exit status in the code, every documented JSON key
of ``plan --json`` in a real run's JSON (the hosts half checks deploy, status, doctor, prepare and
hosts.json). The markup is described in tests/doc_tests.py and CONTRIBUTING.md.

Each check is also run on a broken copy (a flag removed from the parser, an exit status or a JSON
key that does not exist): the check must fail there, or it cannot fail at all.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.cli import build_parser
from tests.doc_tests import (
    ROOT,
    SHELL_LANGS,
    TOOL,
    Block,
    blocks,
    command_codes,
    doc_env,
    exit_claims,
    exit_problems,
    flag_problems,
    flag_uses,
    groups,
    json_blocks,
    json_problems,
    output_matches,
    pages,
    parse_commands,
    rel,
    run_page,
    subparsers,
    synopsis_problems,
)

# Pages whose every block is marked and whose flags, exit statuses and JSON keys are checked.
COVERED = [
    "README.md",
    "docs/architecture.md",
    "docs/commands.md",
    "docs/day-two.md",
    "docs/design.md",
    "docs/doctor.md",
    "docs/field-notes.md",
    "docs/gateway.md",
    "docs/install.md",
    "docs/kubernetes.md",
    "docs/maintain.md",
    "docs/plan.md",
    "docs/prepare.md",
    "docs/pyinfra.md",
    "docs/recipe-gate.md",
    "docs/recipe-reference.md",
    "docs/security.md",
    "docs/test-hosts.md",
    "docs/tutorial.md",
]
# NOT YET COVERED: pages whose blocks are not marked yet (tests/doc_tests.py); a new page must
# be put in one list or the other.
NOT_YET_COVERED: dict[str, str] = {}
# JSON producers this file runs; tests/test_docs_hosts.py runs the others on the test hosts.
FAST_PRODUCERS = {"plan"}
HOST_PRODUCERS = {"deploy", "status", "doctor", "prepare", "hosts.json"}


def covered() -> list[Path]:
    return [ROOT / p for p in COVERED]


def test_every_page_is_covered_or_listed_as_not_yet() -> None:
    names = {rel(p) for p in pages()}
    both = set(COVERED) & set(NOT_YET_COVERED)
    assert not both, f"in both lists: {sorted(both)}"
    missing = sorted(names - set(COVERED) - set(NOT_YET_COVERED))
    assert not missing, f"pages in neither COVERED nor NOT_YET_COVERED: {missing}"
    gone = sorted(set(COVERED) - names)
    assert not gone, f"COVERED pages that do not exist: {gone}"


def unmarked(page: Path) -> list[str]:
    out = []
    for b in blocks(page):
        needs = b.is_shell() or b.lang == "json" or TOOL.search(b.body) is not None
        if needs and b.mark is None:
            out.append(f"{b.where}: ```{b.lang} block without doc-test or illustrative markup")
        if b.mark is not None and b.mark.kind == "json" and b.lang != "json":
            out.append(f"{b.where}: doc-test: json on a ```{b.lang} block")
        if b.mark is not None and b.mark.kind in {"fast", "hosts"} and not b.is_shell():
            out.append(f"{b.where}: doc-test: {b.mark.kind} on a block with no command")
    return out


@pytest.mark.parametrize("page", COVERED)
def test_every_command_block_is_marked(page: str) -> None:
    assert unmarked(ROOT / page) == []


def test_json_blocks_name_a_producer_and_by_blocks_a_test() -> None:
    problems = []
    for page in covered():
        for b in blocks(page):
            if b.mark is None:
                continue
            if b.mark.kind == "json" and b.mark.arg not in FAST_PRODUCERS | HOST_PRODUCERS:
                problems.append(f"{b.where}: unknown JSON producer {b.mark.arg!r}")
            if b.mark.kind == "by":
                test = ROOT / b.mark.arg
                if not test.is_file() or rel(page) not in test.read_text(encoding="utf-8"):
                    problems.append(
                        f"{b.where}: {b.mark.arg} does not exist or never reads {rel(page)}"
                    )
    assert problems == []


def doc_flag_problems(parser: argparse.ArgumentParser, docs: list[Path]) -> list[str]:
    commands = set(subparsers(parser))
    uses = [u for p in docs for u in flag_uses(p, commands)]
    return flag_problems(uses, parser) + [x for p in docs for x in synopsis_problems(p, parser)]


def test_every_documented_flag_exists() -> None:
    assert doc_flag_problems(build_parser(), covered()) == []


def row_gaps(parser: argparse.ArgumentParser, page: Path) -> list[str]:
    """docs/commands.md is the reference: every flag of a command is in its row (of the page's
    first table, before its first section: later tables are about exit codes, dry runs)."""
    subs = subparsers(parser)
    gaps = []
    lines = page.read_text(encoding="utf-8").splitlines()
    end = next((n for n, ln in enumerate(lines, 1) if ln.startswith("## ")), len(lines) + 1)
    rows = [
        u
        for u in flag_uses(page, set(subs))
        if u.text.startswith("|") and u.command and int(u.where.rsplit(":", 1)[1]) < end
    ]
    assert {u.command for u in rows} >= set(subs) - groups(parser), "a command has no row"
    for u in rows:
        assert u.command is not None
        for action in subs[u.command]._actions:
            names = set(action.option_strings)
            if names and not names & ({"-h", "--json", "-v"} | set(u.flags)):
                gaps.append(f"{u.where}: the {u.command} row lacks {'/'.join(sorted(names))}")
    return gaps


def test_the_command_reference_names_every_flag() -> None:
    assert row_gaps(build_parser(), ROOT / "docs/commands.md") == []


def test_the_reference_check_fails_on_a_new_flag() -> None:
    parser = build_parser()
    subparsers(parser)["prune"].add_argument("--older-than", metavar="DAYS")
    gaps = row_gaps(parser, ROOT / "docs/commands.md")
    assert len(gaps) == 1 and gaps[0].endswith("the prune row lacks --older-than"), gaps


def without(parser: argparse.ArgumentParser, command: str, flag: str) -> argparse.ArgumentParser:
    """A copy of the parser whose COMMAND has lost FLAG (what a refactor might do)."""
    broken = copy.deepcopy(parser)
    sub = subparsers(broken)[command]
    action = sub._option_string_actions[flag]
    for s in action.option_strings:
        del sub._option_string_actions[s]
    sub._actions.remove(action)
    return broken


@pytest.mark.parametrize(
    ("command", "flag"),
    [("deploy", "--serial"), ("stop", "--purge"), ("doctor", "--allow-draft"), ("logs", "-n")],
)
def test_flag_check_fails_when_a_documented_flag_is_removed(command: str, flag: str) -> None:
    problems = doc_flag_problems(without(build_parser(), command, flag), covered())
    assert any(f"has no flag {flag}" in p for p in problems), problems


def test_flag_check_fails_on_a_flag_no_command_has(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- illustrative: test -->\n```sh\ntensorless-deploy status --nosuch -i x\n```\n"
        "| `stop MODEL` | `--purge`, `--wipe` |\n|---|---|\n",
        encoding="utf-8",
    )
    commands = set(subparsers(build_parser()))
    problems = flag_problems(flag_uses(page, commands), build_parser())
    assert len(problems) == 2 and "--nosuch" in problems[0] and "--wipe" in problems[1]


def test_every_documented_exit_status_is_one_the_code_returns() -> None:
    parser = build_parser()
    commands = set(subparsers(parser))
    claims = [c for p in covered() for c in exit_claims(p, commands)]
    assert {c.command for c in claims} >= {"status", "doctor", "plan", "deploy", "check"}
    assert exit_problems(claims, command_codes(parser)) == []


def test_exit_check_fails_on_a_status_the_code_never_returns(tmp_path: Path) -> None:
    parser = build_parser()
    commands = set(subparsers(parser))
    page = tmp_path / "docs" / "commands.md"
    page.parent.mkdir()
    text = (ROOT / "docs/commands.md").read_text(encoding="utf-8")
    assert "3 all serving and something drifted" in text
    page.write_text(text.replace("3 all serving", "5 all serving"), encoding="utf-8")
    claims = exit_claims(page, commands)
    problems = exit_problems(claims, command_codes(parser))
    assert any("status never exits 5" in p for p in problems), problems
    # and a code the code returns that no page promises (status's 3, once the pages lose it)
    assert any("status can exit 3" in p for p in problems), problems


def test_status_exit_codes_come_from_the_code() -> None:
    codes = command_codes(build_parser())
    assert codes["status"] == {0, 1, 2, 3, 4, 130, 141}  # 130, 141: main's, for every command
    assert codes["deploy"] == {0, 1, 2, 130, 141}


@pytest.mark.parametrize("page", COVERED)
def test_console_examples_parse(page: str) -> None:
    """Every command of every shell block splits (quotes closed), and a console block's exit
    status, when it has output, is its last output line's business only through # exit N."""
    for b in blocks(ROOT / page):
        if b.lang in SHELL_LANGS or b.is_shell():
            for c in b.commands():
                assert c.text, f"{b.where}: empty command"
                for out in c.output or ():
                    assert not out.startswith("exit "), (
                        f"{b.where}: write the exit status as '# exit N' on the command line"
                    )


def test_markup_parses_what_it_says() -> None:
    body = (
        '$ tensorless-deploy doctor -i "$INV" \\\n  tiny  # exit 1: gpu2 cannot\ngpu1: ready\n'
        "...\n2 of 4 host(s) ready\n$ echo hi\n"
    )
    c1, c2 = parse_commands(body, 10, console=True)
    assert (c1.line, c1.text, c1.exit) == (10, 'tensorless-deploy doctor -i "$INV" tiny', 1)
    assert c1.output == ("gpu1: ready", "...", "2 of 4 host(s) ready")
    assert (c2.text, c2.exit, c2.output) == ("echo hi", 0, None)
    assert output_matches(["a", "...", "d ... e"], ["a", "b", "c", "d x y e"])
    assert output_matches(["a", "...", "b"], ["a", "b"])
    assert not output_matches(["a", "b"], ["a", "b", "c"])
    assert not output_matches(["a ... e"], ["a b", "e"])


def doctor_check_ids() -> set[str]:
    """The check IDs of docs/doctor.md's table of checks (its first column)."""
    text = (ROOT / "docs/doctor.md").read_text(encoding="utf-8")
    table = text.split("## Checks", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([a-z<>_]+\.[a-z0-9_]+)`", table, re.MULTILINE)}


def test_every_documented_check_id_is_in_the_code() -> None:
    """A check ID doctor.md documents is one the code can write (tests/test_docs_hosts.py checks
    the other way: every ID of a real doctor run is in the table)."""
    ids = doctor_check_ids()
    assert {"systemd.pid1", "card.match", "toolkit.cdi", "instances.cards"} <= ids
    src = "\n".join(
        p.read_text(encoding="utf-8") for p in (ROOT / "tensorless_deploy").rglob("*.py")
    )
    missing = [
        i
        for i in sorted(ids)
        if (f'"{i}"' not in src if not i.startswith("<") else '.read"' not in src)
    ]
    assert missing == []


# --------------------------------------------------------------------------- JSON keys


def test_json_check_fails_on_a_key_or_type_the_run_lacks() -> None:
    real = [{"ok": True, "hosts": [{"host": "a", "steps": []}, {"host": "b", "steps": [{"n": 1}]}]}]
    assert json_problems({"ok": False, "hosts": [{"host": "x", "steps": [{"n": 2}]}]}, real) == []
    assert json_problems({"ok": False, "hosts": [{"hostname": "x"}]}, real) == [
        ".hosts[].hostname: documented, in no run"
    ]
    assert json_problems({"ok": "yes"}, real) == [
        ".ok: documented string ('yes'), runs gave ['bool']"
    ]
    assert json_problems({"hosts": [{"steps": [{"m": 1}]}]}, real) == [
        ".hosts[].steps[].m: documented, in no run"
    ]
    assert json_problems({"hosts": [{"...": "...", "host": None}]}, real) == [
        ".hosts[].host: documented null (None), runs gave ['string']"
    ]


def tiny_plan_json(tmp_path: Path) -> dict[str, Any]:
    """A real `plan --offline --json` of the tiny test model: its header from a local Hugging
    Face compatible server, the GPU from the inventory's tensorless_gpus."""
    import hashlib

    from tests.gguf_tools import write_tiny_llama
    from tests.hosts.fleet import TINY_REPO, tiny_recipe, write_catalog
    from tests.hosts.hf_server import HFServer

    gguf = write_tiny_llama(tmp_path / "tiny.gguf")
    data = gguf.read_bytes()
    fake_hosts_json = {
        "tiny_gguf": {
            "hf_file": "tiny-llama.gguf",
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        },
        "image": {"ref": "registry.invalid/engine@sha256:" + "5e" * 32},
    }
    commit = "7c1d0f3a9e2b4d6c8a1f3e5b7d9c0a2e4f6b8d01"
    recipes = write_catalog(tmp_path / "recipes", tiny_recipe(fake_hosts_json, commit))
    p100 = {
        "name": "Tesla P100-PCIE-16GB",
        "compute_cap": "6.0",
        "memory_total_mib": 16384,
        "driver_version": "535.183.01",
        "uuid": "GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90",
        "memory_used_mib": 0,
    }
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"hosts = {[('gpu1', {'tensorless_gpus': [p100]})]!r}\n")
    with HFServer("127.0.0.1", 0) as hf:
        hf.publish(TINY_REPO, {"tiny-llama.gguf": gguf}, commit=commit)
        env = doc_env({"HF_ENDPOINT": hf.url, "XDG_CACHE_HOME": str(tmp_path / "cache")})
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "tensorless_deploy", "plan", "-i", str(inventory)),
                *("--offline", "tiny", "--recipes", str(recipes), "--json"),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_plan_json_keys_exist_in_a_real_run(tmp_path: Path) -> None:
    real = tiny_plan_json(tmp_path)
    found = [
        (b, doc) for p in covered() for b, doc in json_blocks(p) if b.mark and b.mark.arg == "plan"
    ]
    assert found, "no doc-test: json plan block"
    for b, doc in found:
        assert json_problems(doc, [real]) == [], b.where
    # the same check fails on a key the tool does not write
    broken = json.loads(json.dumps(found[0][1]))
    broken["models"][0]["placements"][0]["kv_bytes_per_tok"] = 1
    assert json_problems(broken, [real]) == [
        ".models[].placements[].kv_bytes_per_tok: documented, in no run"
    ]


# --------------------------------------------------------------------------- fast blocks


def fast_pages() -> list[str]:
    return [
        p
        for p in COVERED
        if any(b.mark is not None and b.mark.kind == "fast" for b in blocks(ROOT / p))
    ]


@pytest.mark.parametrize("page", fast_pages())
def test_fast_blocks_run_as_documented(page: str, tmp_path: Path) -> None:
    """The page's ``fast`` blocks, in order, in a fresh directory that holds a copy of this
    checkout as ./tensorless-deploy (what install.md starts from), with HOME there too."""
    checkout = tmp_path / "tensorless-deploy"
    needs_checkout = "./tensorless-deploy" in (ROOT / page).read_text(encoding="utf-8")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for f in filter(None, files if needs_checkout else []):
        src = ROOT / f.decode()
        if src.is_file():
            dst = checkout / f.decode()
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    env = doc_env({"HOME": str(tmp_path)})
    t0 = time.monotonic()
    result = run_page(ROOT / page, "fast", tmp_path, env)
    took = time.monotonic() - t0
    assert result.runs, f"{page}: no fast command ran"
    assert result.problems == [], "\n\n".join(result.problems)
    print(f"\n{page}: {len(result.runs)} command(s) in {took:.1f} s")
    for r in result.runs:
        print(f"  {r.seconds:6.1f} s  {r.command.text}")


def test_a_fast_block_that_stops_matching_fails(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- doc-test: fast -->\n```console\n$ tensorless-deploy models\nMODEL ... NAME ...\n"
        "iamMrDuncan/Qwen3.8-27B-PN3-GGUF ... pn4 ...\n```\n"
        "<!-- doc-test: fast -->\n```sh\ntensorless-deploy info nosuchmodel\n```\n",
        encoding="utf-8",
    )
    result = run_page(page, "fast", tmp_path, doc_env())
    assert len(result.problems) == 2, result.problems
    assert "output differs" in result.problems[0] and "exit 2, documented 0" in result.problems[1]


def test_blocks_of_a_page_keep_their_markup() -> None:
    b = blocks(ROOT / "docs/doctor.md")
    marked: list[Block] = [x for x in b if x.mark is not None]
    assert marked and all(x.mark is not None for x in b if x.is_shell())


def dry_run_rows(page: Path) -> list[str]:
    """The commands of docs/commands.md's "Dry runs" table (its first column), in order."""
    out: list[str] = []
    inside = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            inside = line.strip() == "### Dry runs"
            continue
        if inside and line.startswith("| `"):
            out.append(line.split("`")[1])
    return out


def test_every_dry_run_is_in_the_one_place_that_says_how_it_exits() -> None:
    """docs/commands.md's "Dry runs" names exactly the commands that take --dry-run (each
    exits as its real run would: tests/test_local.py and tests/test_access_hosts.py drive
    them), once each."""
    with_dry = {
        name
        for name, p in subparsers(build_parser()).items()
        if "--dry-run" in p._option_string_actions
    }
    rows = dry_run_rows(ROOT / "docs/commands.md")
    assert len(rows) == len(set(rows)), rows
    assert set(rows) == with_dry, (sorted(with_dry - set(rows)), sorted(set(rows) - with_dry))


# ----------------------------------------------------------- numbers the pages state, from the code


def _podman_minimums() -> list[tuple[str, str]]:
    """(a word that names what needs it, the version the code requires), most specific first."""
    from tensorless_deploy.facts.values import NOTIFY_HEALTHY_MIN_PODMAN, QUADLET_MIN_PODMAN
    from tensorless_deploy.launch.container import HEALTH_ON_FAILURE_MIN_PODMAN
    from tensorless_deploy.launch.kube import KUBE_PLAY_MIN_PODMAN

    def dotted(v: tuple[int, ...]) -> str:
        return ".".join(map(str, v))

    return [
        ("notify=healthy", dotted(NOTIFY_HEALTHY_MIN_PODMAN)),
        ("health-on-failure", dotted(HEALTH_ON_FAILURE_MIN_PODMAN)),
        ("kube", dotted(KUBE_PLAY_MIN_PODMAN)),
        ("quadlet", dotted(QUADLET_MIN_PODMAN)),
        ("plain", dotted(QUADLET_MIN_PODMAN)),  # the plain unit: podman without it
    ]


_PODMAN_CLAIM = re.compile(
    r"(?i)(?:(\d+\.\d+)(?:\+| or newer)|(?:older than|before|>=|needs) (?:podman )?(\d+\.\d+))"
)
_SENTENCE = re.compile(r"(?<=[.;!?])\s+")
_OTHER_TOOL = re.compile(
    r"(?i)\b(skopeo|docker|curl|systemd|openssl|driver|pyinfra)\b(?:(?!podman|quadlet)[^.;]){0,20}$"
)


def _prose(text: str) -> list[str]:
    """A page's prose as sentences, a table row as one, fenced blocks left out (their output
    is checked against real runs)."""
    out: list[str] = []
    para: list[str] = []
    fenced = False
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.lstrip().startswith("|") or not line.strip():
            out += _SENTENCE.split(" ".join(para))
            para = []
            if line.strip():
                out.append(line)
            continue
        para.append(line.strip())
    return [s for s in out if s]


def podman_version_claims(text: str) -> list[tuple[str, str, str | None]]:
    """Every podman version a page states as a requirement ("4.7 or newer", "older than 4.7",
    "needs 4.7+", ">= 5.0"), with the version the code requires for what the sentence is
    about (None: a claim the test cannot place)."""
    out = []
    for segment in _prose(text):
        low = segment.lower()
        if "podman" not in low and "quadlet" not in low:
            continue
        for m in _PODMAN_CLAIM.finditer(segment):
            if _OTHER_TOOL.search(segment[: m.start()]):
                continue  # "skopeo before 1.10": another tool's version
            said = m.group(1) or m.group(2)
            want = next((v for word, v in _podman_minimums() if word in low), None)
            out.append((said, segment[:160], want))
    return out


def test_podman_versions_the_pages_state_are_the_codes() -> None:
    """Three pages once said podman 4.4 is enough for quadlet while the code needs 4.7
    (decisions.checks.QUADLET_MIN): every such number is read against the code's."""
    problems = []
    for page in pages():
        for said, where, want in podman_version_claims(page.read_text(encoding="utf-8")):
            if want is None:
                problems.append(f"{rel(page)}: a podman version the test cannot place: {where}")
            elif said != want:
                problems.append(f"{rel(page)}: says podman {said}, the code needs {want}: {where}")
    assert problems == []


def test_the_version_check_fails_on_the_old_quadlet_claim() -> None:
    from tensorless_deploy.decisions.checks import QUADLET_MIN

    old = "| podman (4.4 or newer for quadlet units; older gets a plain `.service`) or docker |"
    ((said, _, want),) = podman_version_claims(old)
    assert (said, want) == ("4.4", QUADLET_MIN) and said != want
    assert podman_version_claims("Quadlet exists from podman 4.4.") == []  # a fact, no claim
