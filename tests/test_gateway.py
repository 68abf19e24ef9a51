"""The front door's pure parts (hostplan.gateway): the HAProxy configuration and unit rendered
from a door plan, where the door reaches each instance, its refusals, the HAProxy version it
needs, and the stats CSV drain reads. HAProxy's own `haproxy -c` on the test hosts is the real
validator of the text (tests/test_gateway_hosts.py); these pin what the text must say."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from tensorless_deploy import shell
from tensorless_deploy.decisions.options import Flags, resolve
from tensorless_deploy.facts.values import LABEL_PORT, DeployedUnit
from tensorless_deploy.fleet.deploy import take_out_units
from tensorless_deploy.hostplan.gateway import (
    CHECK_INTER_MS,
    Backend,
    DoorPlan,
    DoorSpec,
    Pool,
    ServerState,
    backend_address,
    ca_path,
    door_refusal,
    door_word,
    error_body,
    marker_text,
    models_body,
    parse_marker,
    parse_stats_csv,
    render_config,
    render_unit,
    specs_of,
    version_problem,
)
from tensorless_deploy.hostplan.targets import Skipped, Target, door_target, jobs

FIXTURES = Path(__file__).parent / "fixtures" / "secrets"
KEY_A = "a" * 32
KEY_B = "b" * 32
DOOR_KEY = "d" * 32


def _plan(key: str | None = DOOR_KEY, tls: bool = False, **flags: object) -> DoorPlan:
    extra: dict[str, object] = {}
    if tls:
        extra = {
            "tls_cert_file": str(FIXTURES / "tls.crt"),
            "tls_key_file": str(FIXTURES / "tls.key"),
        }
    options = resolve(Flags(port=8000, **{**extra, **flags}))  # type: ignore[arg-type]
    pools = (
        Pool(
            "org/model-a",
            (
                Backend("gpu1", 8080, "127.0.0.1:8080", KEY_A, False),
                Backend("gpu2", 8081, "10.0.0.2:8081", KEY_B, True, ca_path("gpu2", 8081), "PEM"),
            ),
        ),
        Pool("org/model-b", (Backend("gpu3", 8080, "10.0.0.3:8080", None, False),)),
    )
    return DoorPlan("gpu1", options, pools, key)


def _section(text: str, head: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(head)
    out = []
    for line in lines[start + 1 :]:
        if not line.startswith("    "):
            break
        out.append(line.strip())
    return out


def test_each_model_is_a_pool_balanced_by_health_and_load() -> None:
    text = render_config(_plan())
    pool = _section(text, "backend pool_0")
    assert "balance leastconn" in pool
    assert "option httpchk GET /health" in pool
    assert f"default-server check inter {CHECK_INTER_MS} fall 2 rise 2" in pool
    assert "retry-on conn-failure empty-response 503" in pool and "option redispatch 1" in pool
    servers = [s for s in pool if s.startswith("server ")]
    assert [s.split()[1] for s in servers] == ["gpu1_8080", "gpu2_8081"]
    assert [s.split()[1] for s in _section(text, "backend pool_1") if s.startswith("server ")] == [
        "gpu3_8080"
    ]
    door = _section(text, "frontend door")
    assert "option http-buffer-request" in door
    assert "use_backend pool_0 if { var(txn.model) -m str 'org/model-a' }" in door
    assert "use_backend pool_1 if { var(txn.model) -m str 'org/model-b' }" in door
    assert "default_backend no_model" in door


def test_every_instance_gets_its_own_key_and_only_its_own() -> None:
    text = render_config(_plan())
    a = _section(text, "listen i_gpu1_8080")
    b = _section(text, "listen i_gpu2_8081")
    c = _section(text, "listen i_gpu3_8080")
    assert f"http-request set-header Authorization 'Bearer {KEY_A}'" in a
    assert KEY_B not in "\n".join(a) and KEY_A not in "\n".join(b)
    assert "http-request del-header Authorization" in c  # the door's key never goes on
    # TLS to that instance, verified by its own certificate, never "verify none"
    ca = "/etc/tensorless-gateway/ca/gpu2_8081.pem"
    assert any(s.endswith(f"10.0.0.2:8081 ssl verify required ca-file {ca}") for s in b)
    assert "verify none" not in text
    unverified = Pool("org/x", (Backend("gpu4", 8080, "10.0.0.4:8080", None, True),))
    with pytest.raises(ValueError, match="no certificate to verify it by"):
        render_config(dataclasses.replace(_plan(), pools=(unverified,)))
    assert "retries 0" in a  # a refused connection is the pool's to retry elsewhere
    # each listener on its own unix socket, which only HAProxy's workers may use
    assert any(s.startswith("bind unix@") and "mode 600" in s for s in a)


def test_the_door_asks_its_key_and_answers_401_and_404_in_openai_shape() -> None:
    text = render_config(_plan())
    door = "\n".join(_section(text, "frontend door"))
    assert f"'Bearer {DOOR_KEY}'" in door
    assert "status 401" in door and '"invalid_api_key"' in door
    no_model = "\n".join(_section(text, "backend no_model"))
    body = json.loads(no_model.split("string '", 1)[1].rsplit("'", 1)[0])
    assert body["error"]["code"] == "model_not_found"
    assert "org/model-a, org/model-b" in body["error"]["message"]
    # /health, /metrics and the model list answered by the door itself; /health before the key
    assert door.index("path /health") < door.index("door_key")
    assert "prometheus-exporter" in door
    keyless = render_config(_plan(key=None, insecure_open=True, bind="0.0.0.0"))
    assert "door_key" not in keyless and "status 401" not in keyless


def test_models_and_errors_are_openai_shaped() -> None:
    models = json.loads(models_body(["a/b", "c"]))
    assert models["object"] == "list"
    assert [(m["id"], m["object"]) for m in models["data"]] == [("a/b", "model"), ("c", "model")]
    err = json.loads(error_body("m", "t", "c"))
    assert err == {"error": {"message": "m", "type": "t", "code": "c"}}


def test_tls_at_the_door() -> None:
    plan = _plan(tls=True)
    assert plan.url == "https://127.0.0.1:8000"
    door = _section(render_config(plan), "frontend door")
    assert "bind 127.0.0.1:8000 ssl crt /etc/tensorless-gateway/door.pem" in door
    assert " ssl " not in _section(render_config(_plan()), "frontend door")[0]


def test_text_that_would_break_the_configuration_is_refused() -> None:
    plan = _plan()
    bad = DoorPlan(plan.host, plan.options, (Pool("it's", plan.pools[0].backends),), plan.key)
    with pytest.raises(ValueError, match="cannot be written"):
        render_config(bad)


def test_the_unit_is_our_own_master_worker_with_a_checked_hitless_reload() -> None:
    unit = render_unit(_plan())
    assert "ExecStart=/usr/sbin/haproxy -Ws -f $CONFIG" in unit
    assert unit.index("ExecReload=/usr/sbin/haproxy -q -c -f $CONFIG") < unit.index(
        "ExecReload=/bin/kill -USR2 $MAINPID"
    )
    assert "Type=notify" in unit and "KillMode=mixed" in unit


def test_where_the_door_reaches_an_instance() -> None:
    assert backend_address("gpu1", "gpu1", "0.0.0.0", 8080, "10.0.0.1") == ("127.0.0.1:8080", None)
    assert backend_address("gpu1", "gpu2", "0.0.0.0", 8080, "10.0.0.2") == ("10.0.0.2:8080", None)
    assert backend_address("gpu1", "gpu2", "::", 8080, "fd00::2") == ("[fd00::2]:8080", None)
    assert backend_address("gpu1", "gpu2", "10.9.0.2", 8080, "h2") == ("10.9.0.2:8080", None)
    where, problem = backend_address("gpu1", "gpu2", "127.0.0.1", 8080, "10.0.0.2")
    assert where is None and problem is not None
    assert "--bind 0.0.0.0" in problem and "door on gpu2" in problem


def test_the_door_is_refused_as_deploy_refuses_a_keyless_wide_bind() -> None:
    problem = door_refusal(resolve(Flags(bind="0.0.0.0", port=8000)))
    assert problem is not None and "api-key" in problem.replace("_", "-")
    assert door_refusal(resolve(Flags(bind="0.0.0.0", port=8000, insecure_open=True))) is None
    key = str(FIXTURES / "api.key")
    assert door_refusal(resolve(Flags(bind="0.0.0.0", port=8000, api_key_file=key))) is None
    assert door_refusal(resolve(Flags(port=8000))) is None  # loopback keyless


@pytest.mark.parametrize(
    ("banner", "ok"),
    [
        ("HAProxy version 3.0.11-1+deb13u4 2026/10/15 - https://haproxy.org/", True),
        ("HAProxy version 2.6.12-1+deb12u3 2025/10/03 - https://haproxy.org/", True),
        ("HAProxy version 2.4.22 2023/03/10", False),
        ("sh: haproxy: not found", False),
    ],
)
def test_haproxy_version(banner: str, ok: bool) -> None:
    assert (version_problem(banner) is None) is ok


@pytest.mark.parametrize(("version", "ok"), [("3.0.11", True), ("2.6.12", True), ("2.4.22", False)])
def test_the_host_side_version_check_agrees(tmp_path: Path, version: str, ok: bool) -> None:
    fake = tmp_path / "haproxy"
    fake.write_text(
        f"#!/bin/sh\necho 'HAProxy version {version} 2025/01/01 - https://haproxy.org/'\n"
    )
    fake.chmod(0o755)
    text = shell.program(
        "tensorless_deploy.operations", "gateway-check", haproxy=str(fake), major=2, minor=6
    )
    proc = subprocess.run(["sh", "-c", text], capture_output=True, text=True, check=False)
    assert (proc.returncode == 0) is ok, proc.stderr
    banner = f"HAProxy version {version} 2025/01/01"
    assert (version_problem(banner) is None) is ok


STATS = """\
# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,\
wredis,status,weight
door,FRONTEND,,,1,1,9983,0,0,0,0,0,0,,,,,OPEN,
pool_0,gpu1_8080,0,0,2,2,,0,0,0,,0,,0,0,0,0,UP,1
pool_0,legacy1_8080,0,0,0,0,,0,0,0,,0,,0,0,0,0,DRAIN,0
pool_0,BACKEND,0,0,2,2,999,0,0,0,0,0,,0,0,0,0,UP,1
i_gpu1_8080,gpu1_8080,0,0,2,2,,0,0,0,,0,,0,0,0,0,no check,1
"""


def test_the_stats_csv_gives_each_pool_server_and_its_requests_in_flight() -> None:
    rows = parse_stats_csv(STATS)
    assert [(r.pool, r.server, r.status, r.current) for r in rows] == [
        ("pool_0", "gpu1_8080", "UP", 2),
        ("pool_0", "legacy1_8080", "DRAIN", 0),
    ]
    assert parse_stats_csv("") == ()
    assert parse_stats_csv("curl: (7) Couldn't connect") == ()


def test_marker() -> None:
    assert parse_marker("door=gpu1\nurl=http://x:8000\n") == {
        "door": "gpu1",
        "url": "http://x:8000",
    }
    assert parse_marker("") == {}


SPEC = DoorSpec(
    models=("org/model-a", "org/model-b"),
    only=None,
    port=8000,
    bind="0.0.0.0",
    api_key_file="/etc/keys/door.key",
    tls_cert_file="/etc/keys/door.crt",
    tls_key_file="/etc/keys/door.pem",
)


def test_a_marker_records_the_run_that_made_the_door_and_whether_it_fronts_the_host() -> None:
    plan = _plan()
    fronted = parse_marker(marker_text(plan, SPEC, fronted=True))
    assert fronted["door"] == "gpu1" and fronted["fronted"] == "yes"
    assert DoorSpec.from_json(fronted["spec"]) == SPEC
    idle = parse_marker(marker_text(plan, SPEC, fronted=False))
    assert idle["fronted"] == "no"
    # a limited run keeps its hosts; a spec this version did not write is no spec
    limited = DoorSpec(("org/model-a",), only=("gpu1", "gpu2"))
    assert DoorSpec.from_json(limited.to_json()) == limited
    for bad in ("", "{}", "[1]", '{"models": 3, "port": "x"}'):
        assert DoorSpec.from_json(bad) is None, bad
    # the door's own marker gives the spec; one without a spec (an older run) gives None
    older = {"door": "gpu9", "url": "http://x", "fronted": "yes"}
    newer = DoorSpec(("org/model-a",), port=9000)
    markers = {
        "gpu2": parse_marker(marker_text(plan, SPEC)),
        "gpu1": parse_marker(marker_text(plan, newer)),
        "gpu3": older,
        "cpu1": {},
    }
    assert specs_of(markers) == {"gpu1": newer, "gpu9": None}


def test_status_says_each_instance_state_at_its_door() -> None:
    rows = (
        ServerState("pool_0", "gpu1_8080", "UP", 0),
        ServerState("pool_0", "gpu2_8080", "DRAIN", 2),
        ServerState("pool_0", "gpu2_8081", "DOWN", 0),
    )
    assert door_word("gpu1", rows, "gpu1", 8080) == "UP at gpu1"
    assert door_word("gpu1", rows, "gpu2", 8080) == "DRAIN at gpu1, 2 in flight"
    assert door_word("gpu1", rows, "gpu2", 8081) == "DOWN at gpu1"
    assert door_word("gpu1", rows, "gpu3", 8080) == "not at the door on gpu1"
    assert door_word("gpu1", rows, "gpu1", None) == "not at the door on gpu1"
    assert door_word("gpu1", None, "gpu1", 8080) == "gpu1: no answer"


def test_the_door_is_a_scrape_target_with_its_own_key_file_and_certificate() -> None:
    target = door_target("gpu1", "10.0.0.1", SPEC)
    assert isinstance(target, Target)
    assert (target.address, target.scheme, target.unit) == (
        "10.0.0.1:8000",
        "https",
        "tensorless-gateway",
    )
    assert target.key_file == SPEC.api_key_file and target.ca_file == SPEC.tls_cert_file
    made, skipped = jobs([], [target])
    assert skipped == [] and len(made) == 1
    config = made[0].scrape_config("door.json")
    assert config["authorization"]["credentials_file"] == "/etc/keys/door.key"
    assert config["tls_config"]["ca_file"] == "/etc/keys/door.crt"
    assert "/etc/keys/door.key" not in json.dumps(made[0].file_sd())
    # a loopback door cannot be scraped from elsewhere; an older marker says to run it again
    local = door_target("gpu1", "10.0.0.1", DoorSpec(("org/model-a",)))
    assert isinstance(local, Skipped) and "127.0.0.1" in local.why
    made, skipped = jobs([], [local, door_target("gpu9", "x", None)])
    assert made == [] and [s.host for s in skipped] == ["gpu1", "gpu9"]


def test_the_door_logs_a_line_per_request_and_never_a_header() -> None:
    text = render_config(_plan())
    assert "log stdout format raw local0 info" in _section(text, "global")
    assert "option httplog" in _section(text, "defaults")
    assert "capture" not in text  # no header (the keys travel in headers) is ever logged
    # the per-instance listeners and the stats page log nothing of their own
    for head in ("listen i_gpu1_8080", "listen stats"):
        assert "no log" in _section(text, head), head


class _Door:
    """A door that fronts some hosts and answers every call (operations.deploy.Door)."""

    def __init__(self, fronted: set[str]) -> None:
        self.fronted = fronted
        self.calls: list[tuple[str, str, int]] = []

    def fronts(self, host_name: str) -> bool:
        return host_name in self.fronted

    def take_out(self, host_name: str, port: int, timeout_s: float) -> str | None:
        self.calls.append(("take_out", host_name, port))
        return None if port == 8080 else "1 request(s) still in flight at the door after 5 s"

    def put_back(self, host_name: str, port: int) -> str | None:
        self.calls.append(("put_back", host_name, port))
        return None


def _unit(name: str, port: str | None) -> DeployedUnit:
    labels = {LABEL_PORT: port} if port is not None else {}
    return DeployedUnit(name, "quadlet", "active", labels, {}, None, None, 200)


def test_a_host_no_door_fronts_is_neither_asked_nor_reported() -> None:
    door = _Door({"gpu1"})
    units = [_unit("a", "8080"), _unit("b", "8081"), _unit("c", None)]
    assert take_out_units(door, "gpu2", units, 5) == ()
    assert take_out_units(None, "gpu1", units, 5) == ()
    assert door.calls == []
    said = take_out_units(door, "gpu1", units, 5)
    assert said == (
        "a (8080): taken out",
        "b (8081): 1 request(s) still in flight at the door after 5 s",
        f"c: carries no {LABEL_PORT} label: not taken out of the door",
    )
    assert door.calls == [("take_out", "gpu1", 8080), ("take_out", "gpu1", 8081)]


def test_deploys_door_calls_say_what_the_door_answered_and_nothing_where_none() -> None:
    from tensorless_deploy.operations.deploy import _door_call

    door = _Door({"gpu1"})
    said: dict[str, list[str]] = {}
    for host in ("gpu1", "gpu2"):
        _door_call(door, said, host, 8081, 5.0)()
        _door_call(door, said, host, 8081, None)()
    assert said == {
        "gpu1": ["8081: 1 request(s) still in flight at the door after 5 s", "8081: put back"]
    }
    assert door.calls == [("take_out", "gpu1", 8081), ("put_back", "gpu1", 8081)]


def test_a_dry_run_asks_no_door() -> None:
    from tensorless_deploy.fleet.deploy import door_of

    with door_of([], dry=True) as door:
        assert door is None


def test_a_swap_on_a_host_no_door_fronts_gets_no_door_steps() -> None:
    # rollback's swap: the door's take-out and put-back steps only where the door fronts the
    # host; a pyinfra call reports "changed" whatever it did, so an unfronted host would show
    # door steps that never happened (seen in day-two.md's rollback after a door existed)
    from tensorless_deploy.decisions.options import Options
    from tensorless_deploy.fleet.runner import Step
    from tensorless_deploy.fleet.status import door_around

    door = _Door({"gpu1"})
    swap = Step("rollback a", lambda: None, {})
    said: dict[str, list[str]] = {}
    unit = _unit("a", "8080")
    assert door_around(door, "gpu2", unit, Options(), swap, said) == [swap]
    assert door_around(None, "gpu1", unit, Options(), swap, said) == [swap]
    assert door_around(door, "gpu1", _unit("c", None), Options(), swap, said) == [swap]
    steps = door_around(door, "gpu1", unit, Options(), swap, said)
    assert [s.name for s in steps] == ["door: take out a", "rollback a", "door: put back a"]
    for s in (steps[0], steps[2]):
        s.kwargs["function"]()
    assert said == {"gpu1": ["a (8080): taken out", "a (8080): put back"]}
    assert door.calls == [("take_out", "gpu1", 8080), ("put_back", "gpu1", 8080)]
