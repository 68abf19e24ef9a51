"""The llama-server flags a recipe or a run's extra args may not carry, in every spelling
llama-server reads: the one list that the schema, the extra-args check and the help-text tests
(tests/test_server_flags.py, against the engines' own ``llama-server --help``) all read. Its
``LAUNCHER`` table is also the one list of the flags the launcher writes: launch.spec derives
the argv from it, launch.read the read-back of a deployed unit.

How llama-server reads its command line (common/arg.cpp of the pinned trees): an argument that
starts with ``--`` has every ``_`` turned into ``-`` before lookup; a repeated flag keeps the
last value; every spelling of an option (``-c``, ``--ctx-size``) is the same option; most
options also read an environment twin (``LLAMA_ARG_CTX_SIZE``), and a negatable one a
``LLAMA_ARG_NO_*`` twin that only turns it off. ``--flag=value`` is not llama-server syntax, but
it is refused here all the same, so a later build that accepts it cannot be used to slip by.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from tensorless_deploy.recipe.text import has_control, quoted


@dataclass(frozen=True)
class ServerFlag:
    """One llama-server option: every spelling and environment twin, and why it is refused."""

    spellings: tuple[str, ...]  # the first is the name an error shows
    env: tuple[str, ...]
    why: str  # owned: completes "the launcher sets it ..."; forbidden: "it ..." (a verb first)
    option: str | None = None  # owned only: the operator option that sets it (Setting name)
    negations: tuple[str, ...] = ()  # spellings that only turn it off: allowed

    @property
    def name(self) -> str:
        return self.spellings[0]


# OMP_NUM_THREADS is not llama-server's, but the launcher sets it too (beside -t and -tb).
OWNED_ENV: Mapping[str, str] = {"OMP_NUM_THREADS": "from [run] threads_max"}

_WEIGHTS = "weights come only from [model] file, checked by its sha256"
_PRESET = (
    "is a preset that downloads a model from Hugging Face (and sets its own port and context); "
    + _WEIGHTS
)
_EXITS = "prints and exits: the server would never start"
_FILE_IN = "reads a file the recipe cannot ship (only the image and the model are mounted)"

# The operator's files the launcher names itself: refused as forbidden (a run's own would be
# the operator's secret in a recipe), written by the launcher from the operator's options.
_API_KEY_FILE = ServerFlag(
    ("--api-key-file",),
    ("LLAMA_ARG_API_KEY_FILE",),
    "names the API key file, which is the operator's (tensorless_api_key_file) and set by "
    "the launcher",
)
_SSL_KEY_FILE = ServerFlag(
    ("--ssl-key-file",),
    ("LLAMA_ARG_SSL_KEY_FILE",),
    "names a TLS file, which is the operator's, not a run's",
)
_SSL_CERT_FILE = ServerFlag(
    ("--ssl-cert-file",),
    ("LLAMA_ARG_SSL_CERT_FILE",),
    "names a TLS file, which is the operator's, not a run's",
)

# Flags no recipe and no run may pass, each with why; decided from the pinned builds' --help.
FORBIDDEN: tuple[ServerFlag, ...] = (
    # weights, adapters, projectors and drafts from anywhere but the verified file
    ServerFlag(
        ("--model-url", "-mu"),
        ("LLAMA_ARG_MODEL_URL",),
        "downloads a model from a URL; " + _WEIGHTS,
    ),
    ServerFlag(
        ("--docker-repo", "-dr"),
        ("LLAMA_ARG_DOCKER_REPO",),
        "pulls a model from Docker Hub; " + _WEIGHTS,
    ),
    ServerFlag(
        ("--hf-repo", "-hf", "-hfr"),
        ("LLAMA_ARG_HF_REPO",),
        "downloads a model from Hugging Face, unverified; " + _WEIGHTS,
    ),
    ServerFlag(
        ("--hf-file", "-hff"), ("LLAMA_ARG_HF_FILE",), "picks the file -hf downloads; " + _WEIGHTS
    ),
    ServerFlag(
        ("--hf-token", "-hft"),
        ("HF_TOKEN",),
        "carries a token for llama-server's own downloads, which are refused (the tool downloads "
        "with the operator's token)",
    ),
    ServerFlag(("--lora",), (), "loads a LoRA adapter that changes the weights; " + _WEIGHTS),
    ServerFlag(("--lora-scaled",), (), "loads LoRA adapters that change the weights; " + _WEIGHTS),
    ServerFlag(("--control-vector",), (), "loads a control vector that steers the model"),
    ServerFlag(("--control-vector-scaled",), (), "loads control vectors that steer the model"),
    ServerFlag(("--control-vector-layer-range",), (), "applies control vectors, which are refused"),
    ServerFlag(
        ("--mmproj", "-mm"), ("LLAMA_ARG_MMPROJ",), "loads a multimodal projector; " + _WEIGHTS
    ),
    ServerFlag(
        ("--mmproj-url", "-mmu"),
        ("LLAMA_ARG_MMPROJ_URL",),
        "downloads a multimodal projector; " + _WEIGHTS,
    ),
    ServerFlag(
        ("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"),
        ("LLAMA_ARG_SPEC_DRAFT_HF_REPO", "LLAMA_ARG_HFD_REPO"),  # the second: older builds
        "downloads a draft model from Hugging Face; " + _WEIGHTS,
    ),
    ServerFlag(
        ("--spec-draft-model", "-md", "--model-draft"),
        ("LLAMA_ARG_SPEC_DRAFT_MODEL", "LLAMA_ARG_MODEL_DRAFT"),  # the second: older builds
        "loads a draft model for speculative decoding; " + _WEIGHTS,
    ),
    # Older llama-server builds (not in the pinned ones' --help): the vocoder's sources.
    ServerFlag(("--model-vocoder", "-mv"), (), "loads a vocoder model; " + _WEIGHTS),
    ServerFlag(
        ("--hf-repo-v", "-hfv", "-hfrv"),
        ("LLAMA_ARG_HF_REPO_V",),
        "downloads a vocoder from Hugging Face; " + _WEIGHTS,
    ),
    ServerFlag(
        ("--hf-file-v", "-hffv"),
        ("LLAMA_ARG_HF_FILE_V",),
        "picks a vocoder file to download; " + _WEIGHTS,
    ),
    ServerFlag(("--embd-gemma-default",), (), _PRESET),
    ServerFlag(("--fim-qwen-1.5b-default",), (), _PRESET),
    ServerFlag(("--fim-qwen-3b-default",), (), _PRESET),
    ServerFlag(("--fim-qwen-7b-default",), (), _PRESET),
    ServerFlag(("--fim-qwen-7b-spec",), (), _PRESET),
    ServerFlag(("--fim-qwen-14b-spec",), (), _PRESET),
    ServerFlag(("--fim-qwen-30b-default",), (), _PRESET),
    ServerFlag(("--gpt-oss-20b-default",), (), _PRESET),
    ServerFlag(("--gpt-oss-120b-default",), (), _PRESET),
    ServerFlag(("--vision-gemma-4b-default",), (), _PRESET),
    ServerFlag(("--vision-gemma-12b-default",), (), _PRESET),
    ServerFlag(
        ("--models-dir",),
        ("LLAMA_ARG_MODELS_DIR",),
        "makes a router that serves other models from a directory; " + _WEIGHTS,
    ),
    ServerFlag(
        ("--models-preset",),
        ("LLAMA_ARG_MODELS_PRESET",),
        "makes a router that loads the models of a preset file; " + _WEIGHTS,
    ),
    ServerFlag(
        ("--rpc",),
        ("LLAMA_ARG_RPC",),
        "sends the model's layers to remote RPC servers that the tool neither deploys nor checks",
    ),
    # files, programs and tools opened to whoever calls the API
    ServerFlag(
        ("--path",), ("LLAMA_ARG_STATIC_PATH",), "serves the files of a directory to every caller"
    ),
    ServerFlag(("--media-path",), (), "lets callers read local files through file:// URLs"),
    ServerFlag(
        ("--slot-save-path",),
        ("LLAMA_ARG_SLOT_SAVE_PATH",),
        "lets callers write and read KV-cache files by name in a directory",
    ),
    ServerFlag(
        ("--tools",),
        ("LLAMA_ARG_TOOLS",),
        "gives callers built-in tools that read and write files and run shell commands",
    ),
    ServerFlag(
        ("--tools-runtime",),
        ("LLAMA_ARG_TOOLS_RUNTIME",),
        "runs callers' tools in another container or on another host over SSH",
    ),
    ServerFlag(
        ("--mcp-servers-config",),
        ("LLAMA_ARG_MCP_SERVERS_CONFIG",),
        "connects callers to the MCP servers of a file",
    ),
    ServerFlag(
        ("--mcp-servers-json",),
        ("LLAMA_ARG_MCP_SERVERS_JSON",),
        "connects callers to MCP servers",
    ),
    ServerFlag(
        ("--agent", "-ag"),
        ("LLAMA_ARG_AGENT",),
        "gives callers the CORS proxy and every built-in tool (files, shell)",
        negations=("-no-ag", "--no-agent"),
    ),
    ServerFlag(
        ("--ui-mcp-proxy", "--webui-mcp-proxy"),
        ("LLAMA_ARG_UI_MCP_PROXY",),
        "makes the server fetch URLs for callers (a CORS proxy)",
        negations=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"),
    ),
    ServerFlag(
        ("--props",),
        ("LLAMA_ARG_ENDPOINT_PROPS",),
        "lets any caller change the server's global settings through POST /props",
    ),
    ServerFlag(("--log-prompts-dir",), (), "writes every caller's prompt to disk"),
    ServerFlag(
        ("--log-disable",),
        (),
        "silences the start log that shows the server on its card (the deploy reads it)",
    ),
    ServerFlag(
        ("--video-ffmpeg-dir",),
        ("LLAMA_ARG_VIDEO_FFMPEG_DIR",),
        "runs ffmpeg and ffprobe from a directory it names",
    ),
    # the operator's: secrets, TLS, the listening socket and the URLs the tool polls
    ServerFlag(
        ("--api-key",),
        ("LLAMA_API_KEY",),
        "would put an API key in a recipe, an argv and a unit file; keys are the operator's, "
        "from a key file on the host",
    ),
    _API_KEY_FILE,
    _SSL_KEY_FILE,
    _SSL_CERT_FILE,
    ServerFlag(
        ("--reuse-port",),
        ("LLAMA_ARG_REUSE_PORT",),
        "would let another process bind the launcher's port and take part of its traffic",
    ),
    ServerFlag(
        ("--api-prefix",),
        ("LLAMA_ARG_API_PREFIX",),
        "moves /health and /v1 away from where the health check, status and bench look",
    ),
    # not a server at all
    ServerFlag(("--help", "-h", "--usage"), (), _EXITS),
    ServerFlag(("--version",), (), _EXITS),
    ServerFlag(("--cache-list", "-cl"), (), _EXITS),
    ServerFlag(("--completion-bash",), (), _EXITS),
    ServerFlag(("--list-devices",), (), _EXITS),
)

ReadBack = Literal["model", "address", "context", "access", "launcher"]


@dataclass(frozen=True)
class LaunchFlag:
    """One flag the launcher writes into every llama-server argv: the option it is (every
    spelling and twin, refused in a recipe, its env and after --), the spelling written, the
    launch value it carries (launch.spec.build_launch_spec names them) and how status reads it
    back from a deployed unit (launch.read): "model" through the model's mount, "address",
    "context" and "access" as drift fields of their own, "launcher" (derived from the recipe and
    the host) only kept out of the recipe's args."""

    flag: ServerFlag
    written: str  # the spelling in the argv: one of flag.spellings
    sets: str  # the launch value it carries
    read: ReadBack
    switch: bool = False  # no value: present (the value True) or absent


# The launcher's own flags, in the order of the argv (launch.spec.launcher_args). A second value
# from a recipe or after -- would win (the last value wins) while labels, plan and health check
# still believe the launcher's, so each is refused in every spelling: as the launcher's (OWNED),
# or, for the operator's files, as forbidden.
LAUNCHER: tuple[LaunchFlag, ...] = (
    LaunchFlag(
        ServerFlag(("--model", "-m"), ("LLAMA_ARG_MODEL",), "from [model] file, sha256-verified"),
        "-m",
        "model",
        "model",
    ),
    LaunchFlag(
        ServerFlag(("--host",), ("LLAMA_ARG_HOST",), "from the operator's bind address", "bind"),
        "--host",
        "bind",
        "address",
    ),
    LaunchFlag(
        ServerFlag(("--port",), ("LLAMA_ARG_PORT",), "from the operator's port", "port"),
        "--port",
        "port",
        "address",
    ),
    LaunchFlag(
        ServerFlag(("--ctx-size", "-c"), ("LLAMA_ARG_CTX_SIZE",), "from [run] context", "context"),
        "-c",
        "context",
        "context",
    ),
    LaunchFlag(
        ServerFlag(("--alias", "-a"), ("LLAMA_ARG_ALIAS",), "from [run] alias"),
        "--alias",
        "alias",
        "launcher",
    ),
    LaunchFlag(
        ServerFlag(("--threads", "-t"), ("LLAMA_ARG_THREADS",), "from [run] threads_max"),
        "-t",
        "threads",
        "launcher",
    ),
    # The pinned builds give -tb no environment twin; LLAMA_ARG_THREADS_BATCH is refused anyway,
    # for a build that adds it.
    LaunchFlag(
        ServerFlag(
            ("--threads-batch", "-tb"), ("LLAMA_ARG_THREADS_BATCH",), "from [run] threads_max"
        ),
        "-tb",
        "threads_batch",
        "launcher",
    ),
    # the start log's device lines (facts.device) need verbosity 4: deploy reads them to show the
    # server is on its card
    LaunchFlag(
        ServerFlag(
            ("--verbosity", "-lv", "--log-verbosity"),
            ("LLAMA_ARG_LOG_VERBOSITY",),
            "at 4, so the start log says which device the model went to (the deploy checks it)",
        ),
        "-lv",
        "verbosity",
        "launcher",
    ),
    LaunchFlag(_API_KEY_FILE, "--api-key-file", "api_key_file", "access"),
    LaunchFlag(_SSL_CERT_FILE, "--ssl-cert-file", "tls_cert_file", "access"),
    LaunchFlag(_SSL_KEY_FILE, "--ssl-key-file", "tls_key_file", "access"),
    # a second --metrics would serve /metrics while the unit's label says metrics: "false"
    LaunchFlag(
        ServerFlag(
            ("--metrics",),
            ("LLAMA_ARG_ENDPOINT_METRICS",),
            "from the operator's metrics switch (tensorless_metrics)",
            "metrics",
        ),
        "--metrics",
        "metrics",
        "access",
        switch=True,
    ),
    # llama-server's own default is * with credentials: any web page in a browser on a machine
    # that reaches a keyless server could drive it (docs/security.md)
    LaunchFlag(
        ServerFlag(
            ("--cors-origins",),
            ("LLAMA_ARG_CORS_ORIGINS",),
            "from the operator's browser origins (default: loopback origins only)",
            "cors_origins",
        ),
        "--cors-origins",
        "cors_origins",
        "access",
    ),
)
# The launcher's flags refused as its own ("the launcher sets ..."); the rest are in FORBIDDEN.
OWNED: tuple[ServerFlag, ...] = tuple(r.flag for r in LAUNCHER if r.flag not in FORBIDDEN)

# Options of the pinned builds that were reviewed and stay allowed, most because they name a
# file, a directory or the network (tests/test_server_flags.py makes every such option of the
# engines' --help be owned, forbidden or here), a few because they look like they might.
ALLOWED: Mapping[str, str] = {
    "--chat-template-file": _FILE_IN + "; the template itself is also given by --chat-template",
    "--grammar-file": _FILE_IN,
    "--json-schema-file": _FILE_IN,
    "--lookup-cache-static": _FILE_IN,
    "--lookup-cache-dynamic": _FILE_IN + "; writes only inside the container",
    "--log-file": "writes the server's own log inside the container",
    "--ui-config-file": _FILE_IN + "; Web UI defaults only",
    "--ui-config": "Web UI defaults as inline JSON; opens nothing",
    "--offline": "turns llama-server's own downloads off",
    "--mmproj-auto": "only takes the projector -hf downloads, and -hf is refused",
    "--mmproj-offload": "where a projector runs; none can be loaded",
    "--mmproj-device": "where a projector runs; none can be loaded",
    "--lora-init-without-apply": "only acts on adapters, and --lora is refused",
    "--ui": "the Web UI is built into the binary and calls the same API",
    "--slots": "the slots monitor endpoint (default on); opens no file or tool",
}

_BY_SPELLING: dict[str, ServerFlag] = {s: f for f in (*OWNED, *FORBIDDEN) for s in f.spellings}
_BY_ENV: dict[str, ServerFlag] = {e: f for f in (*OWNED, *FORBIDDEN) for e in f.env}


def spelling(arg: str) -> str:
    """The flag an argument is, as llama-server looks it up: ``--`` forms with ``_`` as ``-``,
    and without any ``=value``."""
    if not arg.startswith("-"):
        return arg
    flag = arg.split("=", 1)[0]
    return flag.replace("_", "-") if flag.startswith("--") else flag


def flag_of(arg: str) -> ServerFlag | None:
    """The owned or forbidden option an argument spells, if any."""
    return _BY_SPELLING.get(spelling(arg))


def is_owned(flag: ServerFlag) -> bool:
    return flag in OWNED


def _as_read(arg: str, flag: ServerFlag) -> str:
    spelled = spelling(arg)
    return "" if spelled == arg or spelled == flag.name else f" (llama-server reads {spelled})"


def arg_problem(arg: str) -> str | None:
    """Why a recipe's run.args may not hold this argument, or None."""
    if has_control(arg):
        return f"must not contain newlines or other control characters ({quoted(arg)})"
    flag = flag_of(arg)
    if flag is None:
        return None
    shown = quoted(arg.split("=", 1)[0]) + _as_read(arg, flag)
    if is_owned(flag):
        return f"must not contain {shown}: the launcher sets {flag.name} {flag.why} (remove it)"
    return f"must not contain {shown}: {flag.name} {flag.why} (remove it)"


def env_problem(name: str) -> str | None:
    """Why a recipe's run.env may not set this variable, or None."""
    if name in OWNED_ENV:
        return f"must not set {quoted(name)}: the launcher sets it {OWNED_ENV[name]}"
    flag = _BY_ENV.get(name)
    if flag is None:
        return None
    if is_owned(flag):
        return (
            f"must not set {quoted(name)}: llama-server reads it as {flag.name}, which the "
            f"launcher sets {flag.why}"
        )
    return f"must not set {quoted(name)}: llama-server reads it as {flag.name}, which {flag.why}"


def extra_args_problem(args: Iterable[str], options: Mapping[str, str]) -> str | None:
    """Why extra llama-server args (after ``--``) are refused, or None. ``options``: the
    command's own spelling of each operator option (port, bind, context), for the fix."""
    for arg in args:
        if has_control(arg):
            return f"-- {quoted(arg)}: extra llama-server args must not contain control characters"
        flag = flag_of(arg)
        if flag is None:
            continue
        shown = f"-- {quoted(arg.split('=', 1)[0])}{_as_read(arg, flag)}"
        if not is_owned(flag):
            return f"{shown}: refused: {flag.name} {flag.why}"
        if flag.option is not None and flag.option in options:
            return (
                f"{shown}: the launcher sets {flag.name} itself; use {options[flag.option]} "
                "(before the --) instead"
            )
        return f"{shown}: the launcher sets {flag.name} {flag.why}; a run cannot change it"
    return None
