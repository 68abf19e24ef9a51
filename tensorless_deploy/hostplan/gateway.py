"""The front door (pure): from the host plans of every instance of the models it fronts, the
HAProxy configuration and the systemd unit that run it on one host (docs/gateway.md).

One frontend on the door's address (TLS there when asked, HAProxy's own OpenSSL) asks every
caller for the door's key, answers ``/v1/models`` itself (every model it fronts, OpenAI's
shape) and routes a request by the ``model`` of its JSON body (``json_query``) to that model's
pool; a model it does not front is a 404 in OpenAI's error shape. A pool balances by fewest
connections (``leastconn``) over the instances whose ``/health`` answers (checked every
second), and retries a request that never reached an instance on another one. The door
presents each instance's own key: HAProxy sets headers before it picks a server, so each
instance has a small listener of its own on a root-only unix socket that sets that instance's
``Authorization`` (and speaks TLS to it where it serves TLS); the pool's servers are those
sockets. A root-only stats socket is the control path (drain, ready, CSV).

The configuration holds keys: it is written root-only (operations.gateway).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tensorless_deploy.decisions.checks import Check, api_check, is_loopback
from tensorless_deploy.decisions.options import Options, address, reach_host
from tensorless_deploy.shell import DOOR_UNIT, SYSTEMD_DIR

# HAProxy from the host's packages: json_query and the master-worker mode as used here need
# 2.6 (Debian 12's); Debian 13 ships 3.0.
MIN_HAPROXY = (2, 6)
HAPROXY_PACKAGE = "haproxy"
HAPROXY_BIN = "/usr/sbin/haproxy"
HAPROXY_USER = "haproxy"  # the user and group the distributions' packages make for it
DEFAULT_DOOR_PORT = 8000
SERVICE = f"{DOOR_UNIT}.service"
UNIT_PATH = f"{SYSTEMD_DIR}/{SERVICE}"
CONFIG_DIR = "/etc/tensorless-gateway"
CONFIG_PATH = f"{CONFIG_DIR}/haproxy.cfg"
DOOR_PEM = f"{CONFIG_DIR}/door.pem"  # the door's certificate and key, one file as HAProxy reads
# each TLS instance's own certificate (the inventory's tensorless_tls_cert_file), which the door
# verifies it by
CA_DIR = f"{CONFIG_DIR}/ca"
RUN_DIR = "/run/tensorless-gateway"  # systemd's RuntimeDirectory: root's, nobody may list it
# the per-instance listeners' sockets: a directory only root and HAProxy's group may enter
BACKEND_DIR = f"{RUN_DIR}/backends"
STATS_SOCKET = f"{RUN_DIR}/stats.sock"
# On each backend host: which door fronts its instances (read by fleet.gateway.door_of).
MARKER_PATH = "/etc/tensorless-deploy/gateway"
POOL_PREFIX = "pool_"
# How fast a dead instance leaves a pool: a check every CHECK_INTER_MS, out after CHECK_FALL
# failures in a row, back after CHECK_RISE successes.
CHECK_INTER_MS = 1000
CHECK_FALL = 2
CHECK_RISE = 2
# A generation may stream for minutes: the idle limits of a client and of a server are long
# (HAProxy's timeouts count silence, not the whole answer).
TIMEOUT_STREAM_S = 600
# The body is read whole before routing (json_query reads it from the buffer): requests up to
# this size route by their model.
BUFFER_BYTES = 1024 * 1024
_NAME = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class Backend:
    """One instance behind the door: where the door reaches it, and how it asks callers."""

    host: str  # the inventory's name of its host
    port: int
    address: str  # host:port as the door connects to it
    key: str | None  # the instance's own API key (None: it asks none)
    tls: bool  # it serves TLS
    ca_file: str | None = None  # on the door host: the instance's certificate, to verify it
    ca_pem: str | None = None  # that certificate's text (gateway writes it to ca_file)

    @property
    def server(self) -> str:
        """Its server name at the door (the stats page, drain): host and port, never a key."""
        return server_name(self.host, self.port)


@dataclass(frozen=True)
class Pool:
    """One model the door fronts: its id (the recipe's run.alias) and its instances."""

    model: str
    backends: tuple[Backend, ...]


@dataclass(frozen=True)
class DoorPlan:
    """Everything one door needs, decided before any command runs."""

    host: str
    options: Options  # --port, --bind, the door's key and TLS (the command line's)
    pools: tuple[Pool, ...]
    key: str | None  # the door's key text (None: no key, loopback or --insecure-open)
    checks: tuple[Check, ...] = ()

    @property
    def url(self) -> str:
        scheme = "https" if self.options.tls else "http"
        return f"{scheme}://{address(self.options.bind, self.options.port)}"

    @property
    def reach_url(self) -> str:
        """The door's URL as a client on its own host reaches it."""
        scheme = "https" if self.options.tls else "http"
        return f"{scheme}://{address(reach_host(self.options.bind), self.options.port)}"

    @property
    def backends(self) -> tuple[Backend, ...]:
        return tuple(b for p in self.pools for b in p.backends)


def server_name(host: str, port: int) -> str:
    return f"{_NAME.sub('_', host)}_{port}"


def ca_path(host: str, port: int) -> str:
    """Where the door host keeps a TLS instance's certificate."""
    return f"{CA_DIR}/{server_name(host, port)}.pem"


def backend_address(
    door: str, host: str, bind: str, port: int, host_address: str
) -> tuple[str | None, str | None]:
    """Where the door on ``door`` connects to an instance bound to bind:port on ``host``
    (reached at host_address from the controller), or why it cannot: (address, problem)."""
    if host == door:
        return address(reach_host(bind), port), None
    if is_loopback(bind):
        return None, (
            f"{host}: the instance on port {port} binds {bind}: a door on {door} cannot reach "
            f"it; deploy it with --bind 0.0.0.0 and an API key, or put the door on {host}"
        )
    if bind in ("0.0.0.0", "::"):
        return address(host_address, port), None
    return address(bind, port), None


def door_refusal(options: Options) -> str | None:
    """deploy's own api.key refusal, for the door's address: never beyond loopback keyless
    (unless --insecure-open)."""
    for c in api_check(options):
        if c.status == "fail":
            return f"the door at {c.evidence}" + (f" (fix: {c.fix})" if c.fix else "")
    return None


def _quote(text: str) -> str:
    """A HAProxy argument in single quotes (nothing inside is interpreted)."""
    if "'" in text or "\n" in text:
        raise ValueError(f"{text!r} cannot be written into the door's configuration")
    return f"'{text}'"


def error_body(message: str, kind: str, code: str) -> str:
    """OpenAI's error shape."""
    return json.dumps({"error": {"message": message, "type": kind, "code": code}})


def models_body(models: Sequence[str]) -> str:
    """/v1/models in OpenAI's shape: every model the door fronts."""
    data = [
        {"id": m, "object": "model", "created": 0, "owned_by": "tensorless-deploy"} for m in models
    ]
    return json.dumps({"object": "list", "data": data})


def _return(status: int, body: str, cond: str) -> str:
    return (
        f"    http-request return status {status} content-type application/json "
        f"string {_quote(body)} {cond}"
    )


def _socket(b: Backend) -> str:
    return f"{BACKEND_DIR}/{b.server}.sock"


def render_config(plan: DoorPlan) -> str:
    """haproxy.cfg for the door."""
    o = plan.options
    models = [p.model for p in plan.pools]
    bind = address(o.bind, o.port)
    ssl = f" ssl crt {DOOR_PEM}" if o.tls else ""
    out = [
        "# tensorless-deploy gateway: rendered from the host plans; do not edit (a run rewrites",
        "# it). Holds API keys: root only.",
        "global",
        "    master-worker",
        f"    user {HAPROXY_USER}",
        f"    group {HAPROXY_USER}",
        f"    tune.bufsize {BUFFER_BYTES}",
        f"    stats socket {RUN_DIR}/admin.sock mode 600 level admin expose-fd listeners",
        # a line per request to the journal (logs reads it): its path, status, pool, server
        # and times, never a header (the keys travel in headers only)
        "    log stdout format raw local0 info",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option dontlognull",
        "    timeout connect 3s",
        "    timeout http-request 30s",
        f"    timeout client {TIMEOUT_STREAM_S}s",
        f"    timeout server {TIMEOUT_STREAM_S}s",
        "    timeout check 2s",
        "",
        "frontend door",
        f"    bind {bind}{ssl}",
        "    option http-buffer-request",
        _return(200, json.dumps({"status": "ok"}), "if { path /health }"),
    ]
    if plan.key is not None:
        out.append(f"    acl door_key req.hdr(authorization) -m str {_quote('Bearer ' + plan.key)}")
        out.append(
            _return(
                401,
                error_body(
                    "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
                ),
                "if !door_key",
            )
        )
    out += [
        "    http-request use-service prometheus-exporter if { path /metrics }",
        _return(200, models_body(models), "if METH_GET { path /v1/models }"),
        "    http-request set-var(txn.model) req.body,json_query('$.model')",
    ]
    for i, p in enumerate(plan.pools):
        out.append(
            f"    use_backend {POOL_PREFIX}{i} if {{ var(txn.model) -m str {_quote(p.model)} }}"
        )
    served = ", ".join(models)
    unknown = error_body(
        f"The model does not exist here: this door serves {served}.",
        "invalid_request_error",
        "model_not_found",
    )
    out += ["    default_backend no_model", "", "backend no_model", _return(404, unknown, ""), ""]
    for i, p in enumerate(plan.pools):
        out += [
            f"backend {POOL_PREFIX}{i}",
            f"    # {p.model}",
            "    balance leastconn",
            "    option httpchk GET /health",
            "    http-check expect status 200",
            "    retries 2",
            "    option redispatch 1",
            "    retry-on conn-failure empty-response 503",
            f"    default-server check inter {CHECK_INTER_MS} fall {CHECK_FALL} rise {CHECK_RISE}",
        ]
        out += [f"    server {b.server} unix@{_socket(b)}" for b in p.backends]
        out.append("")
    for b in plan.backends:
        tls = ""
        if b.tls:  # verified by its own certificate, never "verify none"
            if b.ca_file is None:
                raise ValueError(f"{b.server} serves TLS, and no certificate to verify it by")
            tls = f" ssl verify required ca-file {b.ca_file}"
        # HAProxy's workers run as its package's user: only they (and root) may connect
        out += [
            f"listen i_{b.server}",
            f"    bind unix@{_socket(b)} mode 600 user {HAPROXY_USER} group {HAPROXY_USER}",
            "    no log",  # the door's frontend logged the request already
        ]
        if b.key is not None:
            out.append(f"    http-request set-header Authorization {_quote('Bearer ' + b.key)}")
        else:
            out.append("    http-request del-header Authorization")
        out += ["    retries 0", f"    server {b.server} {b.address}{tls}", ""]
    out += [
        "listen stats",
        f"    bind unix@{STATS_SOCKET} mode 600",
        "    no log",
        "    stats enable",
        "    stats uri /",
        "    stats admin if TRUE",
        "",
    ]
    return "\n".join(out)


def render_unit(plan: DoorPlan) -> str:
    """The door's own systemd unit: HAProxy in master-worker mode; a reload is hitless (a new
    worker takes the listeners, the old one finishes its connections)."""
    models = ", ".join(p.model for p in plan.pools)
    return f"""\
# tensorless-deploy gateway: rendered from the host plans; do not edit (a run rewrites it)
[Unit]
Description=tensorless-deploy gateway (HAProxy) for {models}
After=network-online.target
Wants=network-online.target

[Service]
Type=notify
Environment=CONFIG={CONFIG_PATH}
ExecStartPre=/usr/bin/install -d -o root -g {HAPROXY_USER} -m 0710 {BACKEND_DIR}
ExecStartPre={HAPROXY_BIN} -q -c -f $CONFIG
ExecStart={HAPROXY_BIN} -Ws -f $CONFIG
ExecReload={HAPROXY_BIN} -q -c -f $CONFIG
ExecReload=/bin/kill -USR2 $MAINPID
KillMode=mixed
Restart=always
RestartSec=2
RuntimeDirectory=tensorless-gateway
RuntimeDirectoryMode=0711
RuntimeDirectoryPreserve=yes

[Install]
WantedBy=multi-user.target
"""


_VERSION = re.compile(r"HAProxy version ([0-9]+)\.([0-9]+)")


def haproxy_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from ``haproxy -v``; None: not HAProxy's banner."""
    m = _VERSION.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def version_problem(text: str) -> str | None:
    """Why the host's HAProxy cannot run the door (None: it can)."""
    v = haproxy_version(text)
    if v is None:
        return "haproxy -v printed no version: is haproxy installed?"
    if v < MIN_HAPROXY:
        need = ".".join(map(str, MIN_HAPROXY))
        return f"HAProxy {v[0]}.{v[1]} is older than {need} (json_query): upgrade haproxy"
    return None


@dataclass(frozen=True)
class DoorSpec:
    """What a gateway run was asked (its models, --limit and the door's own flags, file paths
    absolute): recorded in the markers, so that a deploy or a stop that changes the instances
    renders the door again as that run would (fleet.gateway.refresh_doors)."""

    models: tuple[str, ...]
    only: tuple[str, ...] | None = None  # the hosts it fronts (--limit; None: every host)
    port: int = DEFAULT_DOOR_PORT
    bind: str | None = None
    api_key_file: str | None = None
    insecure_open: bool = False
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DoorSpec | None:
        """The spec a marker records (None: none, or not one this version wrote)."""
        try:
            raw = json.loads(text)
            only = raw.get("only")
            return cls(
                models=tuple(str(m) for m in raw["models"]),
                only=None if only is None else tuple(str(h) for h in only),
                port=int(raw["port"]),
                bind=raw.get("bind"),
                api_key_file=raw.get("api_key_file"),
                insecure_open=bool(raw.get("insecure_open")),
                tls_cert_file=raw.get("tls_cert_file"),
                tls_key_file=raw.get("tls_key_file"),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def specs_of(markers: dict[str, dict[str, str]]) -> dict[str, DoorSpec | None]:
    """Every door the hosts' markers name: door host -> the spec of the gateway run that made
    it, the door host's own marker's first (the newest run wrote it; None: markers without a
    spec, from an older run)."""
    out: dict[str, DoorSpec | None] = {}
    for _host, m in sorted(markers.items(), key=lambda kv: kv[1].get("door") != kv[0]):
        door = m.get("door")
        if door and out.get(door) is None:
            out[door] = DoorSpec.from_json(m["spec"]) if "spec" in m else None
    return out


def marker_text(plan: DoorPlan, spec: DoorSpec | None = None, fronted: bool = True) -> str:
    """What a host records about its door: the door's host and URL, whether the door fronts
    this host's instances now (a host with a card for its models that serves none of them is
    marked too, so that its next deploy joins the door), and the run's spec."""
    text = f"door={plan.host}\nurl={plan.url}\nfronted={'yes' if fronted else 'no'}\n"
    return text + (f"spec={spec.to_json()}\n" if spec is not None else "")


def parse_marker(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class ServerState:
    """One instance as the door sees it (the stats CSV): its pool, status, in-flight count."""

    pool: str
    server: str
    status: str  # UP, DOWN, DRAIN, MAINT, ...
    current: int  # sessions in flight (scur)


def parse_stats_csv(text: str) -> tuple[ServerState, ...]:
    """The pools' servers from HAProxy's stats CSV (``;csv``)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("# "):
        return ()
    head = lines[0][2:].split(",")
    col = {name: i for i, name in enumerate(head)}
    out = []
    for ln in lines[1:]:
        row = ln.split(",")
        if len(row) < len(head):
            continue
        px, sv = row[col["pxname"]], row[col["svname"]]
        if not px.startswith(POOL_PREFIX) or sv in ("FRONTEND", "BACKEND"):
            continue
        cur = row[col["scur"]]
        out.append(ServerState(px, sv, row[col["status"]], int(cur) if cur.isdigit() else 0))
    return tuple(out)


def door_word(door: str, rows: Sequence[ServerState] | None, host: str, port: int | None) -> str:
    """One instance's state at its door, as status shows it: the door's own status of it
    (UP, DOWN, DRAIN, MAINT) and its requests in flight there. rows None: the door did not
    answer."""
    if rows is None:
        return f"{door}: no answer"
    name = server_name(host, port) if port is not None else None
    row = next((r for r in rows if r.server == name), None)
    if row is None:
        return f"not at the door on {door}"
    busy = f", {row.current} in flight" if row.current else ""
    return f"{row.status} at {door}{busy}"
