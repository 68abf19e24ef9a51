"""The operator's options for one host, resolved in one place for every command.

Precedence, the same everywhere: a value given on the command line wins over the host's
inventory data, which wins over the default. Every value is validated here, once: a bad flag is
a usage error naming the flag, bad host data an inventory error naming the host and the key.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar

from tensorless_deploy.errors import InventoryError, UsageError
from tensorless_deploy.hub import DEFAULT_MODELS_DIR
from tensorless_deploy.recipe.flags import extra_args_problem
from tensorless_deploy.recipe.schema import INT32_MAX

EngineChoice = Literal["auto", "podman", "docker"]
ENGINE_CHOICES: tuple[EngineChoice, ...] = ("auto", "podman", "docker")
DEFAULT_PORT = 8080
DEFAULT_BIND = "127.0.0.1"

# Inventory host data keys this tool reads beside the settings' own (SETTINGS; all of them:
# DATA_KEYS, documented in inventories/example.py); everything else in host data belongs to
# pyinfra and its connectors.
DATA_GPUS = "tensorless_gpus"  # offline planning: the GPUs as nvidia-smi would list them
# prepare: the NVIDIA Container Toolkit's version pin, repository and signing key (resolved and
# validated by hostplan.prepare.toolkit_source)
DATA_TOOLKIT_VERSION = "tensorless_toolkit_version"
DATA_TOOLKIT_REPO = "tensorless_toolkit_repo"
DATA_TOOLKIT_KEY = "tensorless_toolkit_key"
# llama-server's special value: it reflects an Origin only when its host is localhost,
# 127.0.0.1 or [::1] (seen on the test hosts with both pinned builds' --cors-origins).
CORS_LOOPBACK = "localhost"
CORS_ANY = "*"
_ORIGIN = re.compile(
    r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)(:[0-9]{1,5})?"
)
# Every key above starts so; any other host data key with this prefix is a typo to refuse
# (pyinfra would carry it silently, and the default would apply).
DATA_PREFIX = "tensorless_"
# Threads of one llama-server: -t, the HTTP pool (up to one per CPU) and the backend's own; a
# fork bomb or a runaway thread pool stops here, far above what a server uses.
DEFAULT_PIDS_LIMIT = 4096
# Seconds of silence from a host (no answer to SSH keepalives, no SSH session within it) after
# which it is unreachable: long enough for a congested link or a host under load to answer,
# short enough that an operator sees a cut link in a minute, not at TCP's ~15 minutes
DEFAULT_HOST_TIMEOUT_S = 60
HOST_TIMEOUT_MAX_S = 86400
# Seconds a command waits for another run's lock on a host before refusing: 0, refuse at once
DEFAULT_LOCK_WAIT_S = 0
# Seconds a restart, rollback, stop or maintenance window waits for a serving instance's
# requests in flight to finish (llama-server's /slots idle) before it goes on regardless, and
# says so in the report; 0: no wait
DEFAULT_DRAIN_TIMEOUT_S = 60
DRAIN_TIMEOUT_MAX_S = 3600
# A secret file the controller reads (an API key, a TLS certificate or key): small, text.
SECRET_MAX_BYTES = 64 * 1024
API_KEY_MIN_CHARS = 16
_API_KEY = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no space: one HTTP header token
# Which matching cards a host serves on, one llama-server each: "all" of them, the first N,
# or exactly these (GPU index as nvidia-smi numbers them, or "GPU-<uuid>").
Instances = str | int | tuple[int | str, ...]

_MODELS_DIR = re.compile(r"/[A-Za-z0-9._/+-]*")


def is_ip_address(text: str) -> bool:
    """An IP literal without a %zone (it lands raw in unit files and URLs)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return "%" not in text


def address(bind: str, port: int) -> str:
    """host:port as a URL writes it (an IPv6 literal in brackets)."""
    return f"[{bind}]:{port}" if ":" in bind else f"{bind}:{port}"


def reach_host(bind: str) -> str:
    """Where a client on the same host reaches a server bound to ``bind``: the loopback of the
    same family for a wildcard bind, else the bind address itself."""
    if bind == "0.0.0.0":
        return "127.0.0.1"
    if bind == "::":
        return "::1"
    return bind


def _port(v: object) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 65536:
        return None
    return "must be a port number 1-65535"


def _bind(v: object) -> str | None:
    if isinstance(v, str) and is_ip_address(v):
        return None
    return "must be an IP address such as 127.0.0.1 or 0.0.0.0"


def _models_dir(v: object) -> str | None:
    ok = (
        isinstance(v, str)
        and _MODELS_DIR.fullmatch(v) is not None
        and v != "/"
        and posixpath.normpath(v) == v
        and ".." not in v.split("/")
    )
    return None if ok else "must be a clean absolute path of letters, digits and . _ / + -"


def _engine(v: object) -> str | None:
    return None if v in ENGINE_CHOICES else "must be podman, docker or auto"


_GPU_UUID = re.compile(r"GPU-[0-9a-fA-F-]{8,}")


def _instances(v: object) -> str | None:
    if v == "all" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        return None
    if isinstance(v, (list, tuple)) and v:
        ok = all(
            (isinstance(g, int) and not isinstance(g, bool) and g >= 0)
            or (isinstance(g, str) and _GPU_UUID.fullmatch(g) is not None)
            for g in v
        )
        if ok and len(set(v)) == len(v):
            return None
    return (
        'must be "all", a number of instances (1 or more), or a list of distinct GPU indices '
        'or "GPU-<uuid>"s'
    )


def _ports(v: object) -> str | None:
    if isinstance(v, (list, tuple)) and v and all(_port(p) is None for p in v):
        return None if len(set(v)) == len(v) else "must not list a port twice"
    return "must be a list of port numbers 1-65535, one per instance"


def parse_instances(text: str) -> Instances:
    """--instances / --gpu as typed: "all", "2", "0,1" or "GPU-...,GPU-..."."""
    if text == "all":
        return text
    if text.isdigit():
        return int(text)
    parts = [p.strip() for p in text.split(",")]
    return tuple(int(p) if p.isdigit() else p for p in parts)


def _context(v: object) -> str | None:
    # the recipe schema's own bound on run.context: llama-server reads -c as an int
    if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= INT32_MAX:
        return None
    return f"must be a positive number of tokens, at most {INT32_MAX:,}"


def _flag(v: object) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def _cors_origins(v: object) -> str | None:
    """localhost (loopback origins only), * (any origin: only with an API key), or origins
    as a browser sends them (scheme://host[:port], comma-separated or a list)."""
    parts = cors_parts(v)
    if parts is not None and (
        parts in ([CORS_LOOPBACK], [CORS_ANY]) or all(_ORIGIN.fullmatch(p) for p in parts)
    ):
        return None
    return (
        f'must be "{CORS_LOOPBACK}" (loopback origins only), origins such as '
        f'"https://ui.example.net,http://localhost:3000", or "{CORS_ANY}" (any, with an API key)'
    )


def cors_parts(v: object) -> list[str] | None:
    """The origins of a tensorless_cors_origins / --cors-origins value; None: not a value."""
    if isinstance(v, str):
        parts = v.split(",")
    elif isinstance(v, (list, tuple)) and all(isinstance(p, str) for p in v):
        parts = list(v)
    else:
        return None
    parts = [p.strip() for p in parts]
    return parts if parts and all(parts) else None


def _pids_limit(v: object) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 4_194_304:
        return None
    return "must be a number of processes (0: no limit set by tensorless-deploy)"


def _host_timeout(v: object) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= HOST_TIMEOUT_MAX_S:
        return None
    return f"must be a number of seconds, 1-{HOST_TIMEOUT_MAX_S}"


def _wait_lock(v: object) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= HOST_TIMEOUT_MAX_S:
        return None
    return f"must be a number of seconds, 0-{HOST_TIMEOUT_MAX_S} (0: refuse at once)"


def _drain_timeout(v: object) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= DRAIN_TIMEOUT_MAX_S:
        return None
    return f"must be a number of seconds, 0-{DRAIN_TIMEOUT_MAX_S} (0: no wait)"


def read_secret_file(path: str, what: str) -> str:
    """The text of a secret file on this machine (the controller), as it will be installed: a
    UnicodeError or OSError becomes ValueError with one line saying why. Never logged."""
    full = os.path.expanduser(path)
    try:
        # a FIFO, a device or a directory would block or mislead the read: regular files only,
        # opened without blocking and checked on the descriptor (no race with a swap)
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ValueError(f"{path} is not a regular file: not {what}")
            data = f.read(SECRET_MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > SECRET_MAX_BYTES:
        raise ValueError(f"{path} is larger than {SECRET_MAX_BYTES} bytes: not {what}")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not ASCII text: not {what}") from None
    return text if text.endswith("\n") else text + "\n"


def api_key_text(path: str) -> str:
    """The API key file's one key (a trailing newline allowed), checked: what llama-server reads
    with --api-key-file and what bench and status send as ``Authorization: Bearer``."""
    text = read_secret_file(path, "an API key file")
    lines = text.splitlines()
    key = lines[0].strip() if lines else ""
    if len(lines) != 1 or not key:
        raise ValueError(f"{path} must hold exactly one key on one line")
    if not _API_KEY.fullmatch(key):
        raise ValueError(f"{path}: the key may hold only printable ASCII, no spaces")
    if key.startswith("#"):
        raise ValueError(f"{path}: the key starts with #, which llama-server reads as a comment")
    if len(key) < API_KEY_MIN_CHARS:
        raise ValueError(
            f"{path}: the key has {len(key)} characters, fewer than {API_KEY_MIN_CHARS} "
            "(make one: openssl rand -hex 32)"
        )
    return key + "\n"


def api_key(path: str) -> str:
    """The key itself, for a client's ``Authorization: Bearer`` header."""
    return api_key_text(path).strip()


def pem_text(path: str, kind: str) -> str:
    """A PEM file's text, checked to hold a ``-----BEGIN ...`` block of the kind asked."""
    text = read_secret_file(path, f"a PEM {kind}")
    if "-----BEGIN " not in text or (kind == "certificate" and "CERTIFICATE-----" not in text):
        raise ValueError(f"{path} holds no PEM {kind} (-----BEGIN ...)")
    if kind == "private key" and "PRIVATE KEY-----" not in text:
        raise ValueError(f"{path} holds no PEM private key (-----BEGIN ... PRIVATE KEY-----)")
    return text


def _path(v: object) -> str | None:
    """A path on the controller; the file itself is read and checked where it is used (the
    api.key_file and api.tls_files checks, run, bench), so that status, stop or an offline plan
    on a machine without it still work."""
    if isinstance(v, str) and v and not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in v):
        return None
    return "must be the path of a file on this machine"


Rule = Callable[[object], "str | None"]
T = TypeVar("T")


@dataclass(frozen=True)
class Setting:
    """One operator option: where the inventory says it, the flag that overrides it, its rule.
    Declared once, as a field of Options (``setting``): its name, type and default are that
    field's."""

    name: str
    data_key: str | None  # None: command line only
    flag: str | None  # None: inventory data only
    rule: Rule
    default: Any
    access: bool = False  # who may call the API: cli.common.access_flags (read by access_from)


def setting(
    default: T, data_key: str | None, flag: str | None, rule: Rule, *, access: bool = False
) -> T:
    """An Options field that is an operator setting (its row of SETTINGS)."""
    row = {"data_key": data_key, "flag": flag, "rule": rule, "access": access}
    return field(default=default, metadata={_ROW: row})


_ROW = "tensorless.setting"


@dataclass(frozen=True)
class Options:
    """What the operator chose for one host, resolved and validated. Each ``setting`` field is
    one row of the settings table: its inventory key, its flag, its rule and its default."""

    port: int = setting(DEFAULT_PORT, "tensorless_port", "--port", _port)
    bind: str = setting(DEFAULT_BIND, "tensorless_bind", "--bind", _bind)
    models_dir: str = setting(DEFAULT_MODELS_DIR, "tensorless_models_dir", None, _models_dir)
    # (RUF009: every default is immutable, but ruff cannot see through the alias)
    engine: EngineChoice = setting("auto", "tensorless_engine", "--engine", _engine)  # noqa: RUF009
    # None: the recipe's own (tuned)
    context: int | None = setting(None, None, "--context", _context)
    # "all", a count, or a list of GPU indices/UUIDs
    instances: Instances = setting(  # noqa: RUF009
        "all", "tensorless_instances", "--instances", _instances
    )
    # one port per instance, instead of tensorless_port + ordinal; None: port + ordinal
    ports: tuple[int, ...] | None = setting(None, "tensorless_ports", None, _ports)
    # Who may call the API, and how (docs/security.md): paths on the CONTROLLER, never the
    # secret. One key, installed on the host root-only; None: no key (loopback only).
    api_key_file: str | None = setting(
        None, "tensorless_api_key_file", "--api-key-file", _path, access=True
    )
    # true: a non-loopback bind may go keyless, on purpose
    insecure_open: bool = setting(
        False, "tensorless_insecure_open", "--insecure-open", _flag, access=True
    )
    # PEM certificate (chain) for llama-server and its private key: both or neither
    tls_cert_file: str | None = setting(
        None, "tensorless_tls_cert_file", "--tls-cert-file", _path, access=True
    )
    tls_key_file: str | None = setting(
        None, "tensorless_tls_key_file", "--tls-key-file", _path, access=True
    )
    # true: llama-server's /metrics (with the key, if set)
    metrics: bool = setting(False, "tensorless_metrics", "--metrics", _flag, access=True)
    # the container's pids limit; 0: none set by the tool
    pids_limit: int = setting(DEFAULT_PIDS_LIMIT, "tensorless_pids_limit", None, _pids_limit)
    # How long a host may stay silent over SSH (connect, any command, any transfer) before the
    # run calls it unreachable and goes on without it (docs/design.md#deadlines-locks-and-
    # interrupts)
    host_timeout: int = setting(
        DEFAULT_HOST_TIMEOUT_S, "tensorless_host_timeout", "--host-timeout", _host_timeout
    )
    # seconds to wait for another run's lock on a host
    wait_lock: int = setting(DEFAULT_LOCK_WAIT_S, None, "--wait-lock", _wait_lock)
    # Which browser origins may read the API's answers (llama-server --cors-origins,
    # comma-separated): its own default is "*" with credentials, so any web page open on the
    # operator's machine could drive a keyless loopback server; the launcher's default is
    # loopback origins only.
    cors_origins: str = setting(
        CORS_LOOPBACK, "tensorless_cors_origins", "--cors-origins", _cors_origins, access=True
    )
    # how long a change waits for a serving instance to finish its requests in flight
    drain_timeout: int = setting(
        DEFAULT_DRAIN_TIMEOUT_S, "tensorless_drain_timeout", "--drain-timeout", _drain_timeout
    )
    # true: a push to this host comes from a host that holds the bytes verified (another
    # host's cache, or one the push reached first), the controller sending only while none
    # does (fleet.relay)
    relay: bool = setting(False, "tensorless_relay", "--relay", _flag)
    extra_args: tuple[str, ...] = ()
    allow_draft: bool = False
    local: bool = False  # this machine: `run` needs no systemd

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None and self.tls_key_file is not None


# The settings table, in Options' order: every flag, option and inventory key below comes from it.
SETTINGS: tuple[Setting, ...] = tuple(
    Setting(f.name, default=f.default, **f.metadata[_ROW])
    for f in fields(Options)
    if _ROW in f.metadata
)
_BY_NAME: Mapping[str, Setting] = {s.name: s for s in SETTINGS}


def _data_key(name: str) -> str:
    key = _BY_NAME[name].data_key
    if key is None:
        raise KeyError(f"{name}: a setting without an inventory key")
    return key


DATA_PORT = _data_key("port")
DATA_BIND = _data_key("bind")
DATA_MODELS_DIR = _data_key("models_dir")
DATA_ENGINE = _data_key("engine")
DATA_INSTANCES = _data_key("instances")
DATA_PORTS = _data_key("ports")
DATA_API_KEY_FILE = _data_key("api_key_file")
DATA_INSECURE_OPEN = _data_key("insecure_open")
DATA_TLS_CERT_FILE = _data_key("tls_cert_file")
DATA_TLS_KEY_FILE = _data_key("tls_key_file")
DATA_METRICS = _data_key("metrics")
DATA_CORS_ORIGINS = _data_key("cors_origins")
DATA_PIDS_LIMIT = _data_key("pids_limit")
DATA_HOST_TIMEOUT = _data_key("host_timeout")
DATA_DRAIN_TIMEOUT = _data_key("drain_timeout")
DATA_RELAY = _data_key("relay")
DATA_KEYS: tuple[str, ...] = (
    *(s.data_key for s in SETTINGS if s.data_key is not None),
    DATA_GPUS,
    DATA_TOOLKIT_VERSION,
    DATA_TOOLKIT_REPO,
    DATA_TOOLKIT_KEY,
)


@dataclass(frozen=True)
class Flags:
    """What the command line said; None: not given. Its setting fields are Options' own (the
    import fails when the two disagree: ``bound_to_settings``)."""

    port: int | None = None
    bind: str | None = None
    models_dir: str | None = None
    engine: str | None = None
    context: int | None = None
    instances: Instances | None = None
    ports: tuple[int, ...] | None = None  # never on a command line: inventory data only
    api_key_file: str | None = None
    insecure_open: bool | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    metrics: bool | None = None
    pids_limit: int | None = None  # never on a command line: inventory data only
    host_timeout: int | None = None
    wait_lock: int | None = None
    cors_origins: str | None = None
    drain_timeout: int | None = None
    relay: bool | None = None
    extra_args: tuple[str, ...] = ()
    allow_draft: bool = False
    flag_names: Mapping[str, str] | None = None  # a command's own spelling (run: --host)
    # the settings this command line can set (None: not known, e.g. an operator's deploy
    # file): an error offers a flag only where the command has it
    offered: frozenset[str] | None = None

    def spelled(self, setting: Setting) -> str:
        return (self.flag_names or {}).get(setting.name, setting.flag or setting.data_key or "")

    def offers(self, setting: Setting) -> bool:
        if self.offered is not None:
            return setting.name in self.offered
        return setting.flag is not None


# Options' and Flags' fields that are not settings: the same in both but for each one's own.
_NOT_SETTINGS = frozenset({"extra_args", "allow_draft", "local", "flag_names", "offered"})


def bound_to_settings(cls: type, optional: bool) -> None:
    """Refuse a class whose setting fields are not exactly the settings table's, in its order
    (optional: each defaults to None, as Flags' do): a setting added in one place only."""
    mine = [f for f in fields(cls) if f.name not in _NOT_SETTINGS]
    names = [f.name for f in mine]
    if names != [s.name for s in SETTINGS]:
        raise TypeError(f"{cls.__name__}'s settings {names} are not the table's")
    if optional and any(f.default is not None for f in mine):
        raise TypeError(f"{cls.__name__}: a setting not given must be None")


bound_to_settings(Options, optional=False)
bound_to_settings(Flags, optional=True)


def _show(value: object) -> str:
    return repr(value) if not isinstance(value, str) else f'"{value}"'


def check_flags(flags: Flags) -> Flags:
    """Refuse a bad command-line value before any host is touched (usage error, exit 2)."""
    for s in SETTINGS:
        value = getattr(flags, s.name)
        if value is None:
            continue
        why = s.rule(value)
        if why is not None:
            shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
            raise UsageError(f"{flags.spelled(s)} {shown}: {why}")
    # extra llama-server args may not set what the launcher sets, nor fetch or open anything
    why = extra_args_problem(flags.extra_args, {s.name: flags.spelled(s) for s in SETTINGS})
    if why is not None:
        raise UsageError(why)
    # the command line's own TLS files pair up by themselves (no command takes one of them from
    # the flags and the other from inventory data; export resolves no host at all)
    _tls_pair(
        flags, {"tls_cert_file": flags.tls_cert_file, "tls_key_file": flags.tls_key_file}, None
    )
    # --cors-origins * takes the key from the same command line (run, serve, export: the
    # commands with the flag read no inventory data for it)
    if flags.cors_origins is not None:
        _cors_any(
            flags,
            {
                "cors_origins": flags.cors_origins,
                "api_key_file": flags.api_key_file,
                "insecure_open": flags.insecure_open,
            },
            None,
        )
    return flags


def resolve(
    flags: Flags = Flags(),
    data: Mapping[str, object] | None = None,
    host: str | None = None,
    *,
    local: bool = False,
) -> Options:
    """One host's options: flag, else host data, else default; each validated."""
    check_flags(flags)
    if data is not None:
        check_data_keys(data, host)
    values = {s.name: _value(s, flags, data, host) for s in SETTINGS}
    _tls_pair(flags, values, host)
    _cors_any(flags, values, host)
    values["cors_origins"] = ",".join(cors_parts(values["cors_origins"]) or [CORS_LOOPBACK])
    given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return Options(
        **given,
        extra_args=tuple(flags.extra_args),
        allow_draft=flags.allow_draft,
        local=local,
    )


def _value(s: Setting, flags: Flags, data: Mapping[str, object] | None, host: str | None) -> Any:
    """One setting for one host: the flag, else the host's data (validated), else the default."""
    value = getattr(flags, s.name)
    if value is None and s.data_key is not None and data is not None:
        given = data.get(s.data_key)
        if given is not None:
            if isinstance(given, list):
                given = tuple(given)
            why = s.rule(given)
            if why is not None:
                override = f", or override with {flags.spelled(s)}" if flags.offers(s) else ""
                raise InventoryError(
                    f"{host or 'host data'}: {s.data_key}: {why} (got {_show(given)})",
                    fix=f"correct {s.data_key} in the inventory{override}",
                )
            value = given
    return s.default if value is None else value


def resolve_one(
    name: str, flags: Flags, data: Mapping[str, object] | None, host: str | None = None
) -> Any:
    """One setting of one host, resolved as ``resolve`` resolves it (for a command that needs
    only that one, e.g. the SSH deadline of a read-only command)."""
    check_flags(flags)
    return _value(_BY_NAME[name], flags, data, host)


def check_data_keys(data: Mapping[str, object], host: str | None) -> None:
    """Refuse a host data key that starts like this tool's but is none of DATA_KEYS (a typo:
    `tensorless_prot: 9000` would otherwise serve on the default port without a word), naming
    the nearest key the tool reads."""
    import difflib

    for key in data:
        if not key.startswith(DATA_PREFIX) or key in DATA_KEYS:
            continue
        near = difflib.get_close_matches(key, DATA_KEYS, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else ""
        raise InventoryError(
            f"{host or 'host data'}: {key}: not a key tensorless-deploy reads{hint}",
            fix=f"correct {key} in the inventory (every {DATA_PREFIX}* key: "
            "inventories/example.py)",
        )


def _cors_any(flags: Flags, values: Mapping[str, Any], host: str | None) -> None:
    """Any origin (*) only where callers need a key, or where the operator opened the server
    on purpose (insecure_open): without a key, every web page in a browser on a machine that
    reaches the server could drive it."""
    if CORS_ANY not in (cors_parts(values["cors_origins"]) or []):
        return
    if values["api_key_file"] is not None or values["insecure_open"]:
        return
    by_name = _BY_NAME
    why = (
        "any web page in a browser that reaches the server could drive it: allow * only with "
        "an API key"
    )
    if flags.cors_origins is not None:
        key = flags.spelled(by_name["api_key_file"])
        raise UsageError(
            f"{flags.spelled(by_name['cors_origins'])} {CORS_ANY}: {why}",
            fix=f"name the origins that may call it, or give {key}",
        )
    raise InventoryError(
        f"{host or 'host data'}: {DATA_CORS_ORIGINS} {CORS_ANY}: {why}",
        fix=f"name the origins in {DATA_CORS_ORIGINS}, or set {DATA_API_KEY_FILE}",
    )


def _tls_pair(flags: Flags, values: Mapping[str, Any], host: str | None) -> None:
    """TLS takes a certificate and its key together: one without the other is refused."""
    cert, key = values["tls_cert_file"], values["tls_key_file"]
    if (cert is None) == (key is None):
        return
    have, lack = (
        ("tls_cert_file", "tls_key_file") if key is None else ("tls_key_file", "tls_cert_file")
    )
    by_name = _BY_NAME
    if getattr(flags, have) is not None:
        raise UsageError(
            f"{flags.spelled(by_name[have])} without {flags.spelled(by_name[lack])}: "
            "TLS needs the certificate and its key"
        )
    raise InventoryError(
        f"{host or 'host data'}: {by_name[have].data_key} without {by_name[lack].data_key}: "
        "TLS needs the certificate and its key",
        fix=f"set {by_name[lack].data_key} in the inventory too, or remove "
        f"{by_name[have].data_key}",
    )
