"""The refused-flag list (recipe/flags.py) against llama-server's own --help, and how the
schema and the extra-args check apply it to every spelling.

Fixtures, captured, not typed (tests/fixtures/llama-server/README.md): ``help.txt`` is the
test engine image's ``llama-server --help`` (Debian's llama.cpp-tools 1:0.7.0, build 11669),
``help-engine-sm60.txt`` the pinned production engine's (llama.cpp 0.5.0-dev from the
llama-cpp-python 0.3.36 tree). tests/test_server_flags_hosts.py reads the image's help live.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tensorless_deploy.errors import UsageError
from tensorless_deploy.recipe.flags import (
    ALLOWED,
    FORBIDDEN,
    OWNED,
    OWNED_ENV,
    ServerFlag,
    arg_problem,
    env_problem,
    extra_args_problem,
)
from tests.llama_help import HelpOption, parse_help

FIXTURES = Path(__file__).parent / "fixtures" / "llama-server"
HELP_FILES = ("help.txt", "help-engine-sm60.txt")
LISTED = (*OWNED, *FORBIDDEN)
# An option must be decided (owned, forbidden or reviewed-allowed) when its value names a file,
# a directory, a URL, servers or a token, or its text speaks of downloads, tools or proxies.
_NAMES_A_PLACE = re.compile(
    r"\b(FNAME|FILE|PATH|DIR|URL|SERVERS|TOKEN|JSON|OPTION)\b|<user>|<repo>"
)
_REACHES_OUT = re.compile(
    r"download|hugging face|docker hub|internet|tools|mcp|proxy|rpc|url", re.I
)


def help_options(name: str) -> list[HelpOption]:
    return parse_help((FIXTURES / name).read_text(encoding="utf-8"))


def missing_from_list(options: list[HelpOption]) -> list[str]:
    """Every spelling or environment twin the help gives an owned or forbidden option that the
    list does not have; empty when the list is complete for this build."""
    out = []
    for opt in options:
        entries = {
            f for f in LISTED for s in opt.spellings if s in (*f.spellings, *f.negations)
        } | {f for f in LISTED for e in opt.env if e in f.env}
        for flag in entries:
            for s in opt.spellings:
                if s not in (*flag.spellings, *flag.negations):
                    out.append(f"{flag.name}: spelling {s} (help: {', '.join(opt.spellings)})")
            for e in opt.env:
                negated = e.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")
                if e not in flag.env and (not flag.negations or negated not in flag.env):
                    out.append(f"{flag.name}: environment twin {e}")
    return out


def undecided(options: list[HelpOption]) -> list[str]:
    """Options that name a place or reach out, yet are neither listed nor reviewed-allowed."""
    known = {s for f in LISTED for s in (*f.spellings, *f.negations)} | set(ALLOWED)
    return [
        ", ".join(o.spellings)
        for o in options
        if (_NAMES_A_PLACE.search(o.metavar) or _REACHES_OUT.search(o.text))
        and not known.intersection(o.spellings)
    ]


@pytest.mark.parametrize("name", HELP_FILES)
def test_help_fixture_parses_into_options(name: str) -> None:
    options = help_options(name)
    assert len(options) > 200
    by = {s: o for o in options for s in o.spellings}
    assert by["-c"].spellings == ("-c", "--ctx-size") and by["-c"].env == ["LLAMA_ARG_CTX_SIZE"]
    assert by["-hfr"].spellings == ("-hf", "-hfr", "--hf-repo")
    assert by["-hft"].env == ["HF_TOKEN"]
    assert by["--no-webui"].spellings == ("--ui", "--webui", "--no-ui", "--no-webui")
    assert len({s for o in options for s in o.spellings}) == sum(len(o.spellings) for o in options)


@pytest.mark.parametrize("name", HELP_FILES)
def test_every_spelling_and_twin_of_a_listed_option_is_listed(name: str) -> None:
    assert missing_from_list(help_options(name)) == []


@pytest.mark.parametrize("name", HELP_FILES)
def test_every_option_that_names_a_file_or_reaches_out_is_decided(name: str) -> None:
    assert undecided(help_options(name)) == []


def test_the_check_fails_when_the_list_misses_a_spelling() -> None:
    fake = parse_help(
        "-hf,   -hfr, --hf-repo, --hf-repository <user>/<model>\n"
        "                                        Hugging Face model repository\n"
        "                                        (env: LLAMA_ARG_HF_REPO_NEW)\n"
        "--pull-weights URL                      download weights from a URL\n"
    )
    assert missing_from_list(fake) == [
        "--hf-repo: spelling --hf-repository (help: -hf, -hfr, --hf-repo, --hf-repository)",
        "--hf-repo: environment twin LLAMA_ARG_HF_REPO_NEW",
    ]
    assert undecided(fake) == ["--pull-weights"]


def test_every_listed_option_exists_in_a_pinned_help_or_says_why() -> None:
    spelled = {s for name in HELP_FILES for o in help_options(name) for s in o.spellings}
    older = {"--model-vocoder", "--hf-repo-v", "--hf-file-v"}  # older builds, commented so
    for flag in LISTED:
        assert flag.name in spelled or flag.name in older, flag.name
    for s in ALLOWED:
        assert s in spelled, s


def test_the_list_has_each_spelling_once() -> None:
    seen: dict[str, ServerFlag] = {}
    for flag in LISTED:
        for s in (*flag.spellings, *flag.negations, *flag.env):
            assert s not in seen, s
            seen[s] = flag
    assert not set(ALLOWED) & set(seen)


def variants(spelling: str) -> list[str]:
    """The ways llama-server (or a later build) reads one spelling."""
    out = [spelling, spelling + "=1"]
    if spelling.startswith("--") and "-" in spelling[2:]:
        out += [
            "--" + spelling[2:].replace("-", "_"),
            "--" + spelling[2:].replace("-", "_", 1) + "=x",
        ]
    return out


ALL_SPELLINGS = [(f, v) for f in LISTED for s in f.spellings for v in variants(s)]


@pytest.mark.parametrize(("flag", "arg"), ALL_SPELLINGS, ids=[a for _, a in ALL_SPELLINGS])
def test_every_spelling_refused_in_recipe_args_and_after_the_double_dash(
    flag: ServerFlag, arg: str
) -> None:
    why = arg_problem(arg)
    assert why is not None and flag.name in why and why.endswith("(remove it)"), why
    extra = extra_args_problem(["-fa", "on", arg, "1"], {"port": "--port"})
    assert extra is not None and extra.startswith("-- ") and flag.name in extra, extra
    assert "\n" not in why and "\n" not in extra


@pytest.mark.parametrize("name", [e for f in LISTED for e in f.env] + list(OWNED_ENV))
def test_every_environment_twin_refused(name: str) -> None:
    why = env_problem(name)
    assert why is not None and name in why


def test_negations_and_look_alikes_stay_allowed() -> None:
    for arg in ("--no-agent", "-no-ag", "--no-webui-mcp-proxy", "-ctk", "-cb", "--threads-http"):
        assert arg_problem(arg) is None, arg
    for arg in ("-mlock", "-hfx", "--model-urls", "---port", "-C", "--cache-type-k", "q4_0"):
        assert arg_problem(arg) is None, arg
    assert env_problem("LLAMA_ARG_NO_AGENT") is None
    assert env_problem("GGML_CUDA_FATTN_SM60") is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0"], '-- "--host": the launcher sets --host itself; use --bind'),
        (["--port", "1"], '-- "--port": the launcher sets --port itself; use --port'),
        (
            ["--ctx_size", "9"],
            '-- "--ctx_size": the launcher sets --ctx-size itself; use --context',
        ),
        (["-c", "9"], '-- "-c": the launcher sets --ctx-size itself; use --context'),
        (["-m", "/etc/x"], '-- "-m": the launcher sets --model from [model] file'),
        (["--threads-batch=64"], '-- "--threads-batch": the launcher sets --threads-batch from'),
        (["-hf", "a/b"], '-- "-hf": refused: --hf-repo downloads a model from Hugging Face'),
        (["--tools", "all"], '-- "--tools": refused: --tools gives callers built-in tools'),
        (["--x", "\x1b[2J"], '-- "\\u001b[2J": extra llama-server args must not contain control'),
    ],
)
def test_extra_args_name_the_option_to_use_instead(args: list[str], message: str) -> None:
    options = {"port": "--port", "bind": "--bind", "context": "--context"}
    why = extra_args_problem(args, options)
    assert why is not None and why.startswith(message), why


def test_extra_args_through_the_options_resolver_are_a_usage_error() -> None:
    from tensorless_deploy.decisions.options import Flags, check_flags

    with pytest.raises(UsageError) as info:
        check_flags(Flags(extra_args=("--host", "0.0.0.0"), flag_names={"bind": "--host"}))
    assert info.value.exit_code == 2
    assert "use --host (before the --) instead" in info.value.message
    assert check_flags(Flags(extra_args=("-fa", "on"))).extra_args == ("-fa", "on")


def test_metrics_is_the_launchers_so_no_unit_serves_what_its_label_denies() -> None:
    """`export pn3 --format podman-kube -- --metrics` once gave llama-server /metrics while the
    pod's label said metrics "false": --metrics (and its environment twin) are the launcher's,
    set from tensorless_metrics / --metrics, refused in a recipe and after --."""
    from tensorless_deploy.recipe.flags import arg_problem, env_problem
    from tests.hosts.fleet import cli

    proc = cli("export", "pn3", "--format", "podman-kube", "--", "--metrics")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert "the launcher sets --metrics itself; use --metrics (before the --)" in proc.stderr
    assert "launcher sets" in (arg_problem("--metrics") or "")
    assert "launcher sets" in (env_problem("LLAMA_ARG_ENDPOINT_METRICS") or "")
    proc = cli("export", "pn3", "--format", "podman-kube", "--metrics")
    assert proc.returncode == 0 and 'io.tensorless.metrics: "true"' in proc.stdout, proc.stderr
    assert proc.stdout.count("--metrics") == 1  # the launcher's one, labelled as such
