"""Who may call the API, the secrets that say so, and the container's hardening, pure: options
refuse bad key and TLS files with one line, the key reaches a unit only as a path, a key or TLS
leaves the run tuned, the heal and start-limit keys are in every unit kind that can have them,
and a secret is written through stdin (tests/test_security_hosts.py runs all of it for real)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tensorless_deploy.decisions.checks import api_check, secret_file_checks
from tensorless_deploy.decisions.options import (
    DEFAULT_PIDS_LIMIT,
    Flags,
    Options,
    api_key,
    resolve,
)
from tensorless_deploy.errors import InventoryError, UsageError
from tensorless_deploy.launch.container import container_options, run_argv
from tensorless_deploy.launch.render import render_quadlet, render_service
from tensorless_deploy.launch.spec import LABEL_AUTH, LABEL_METRICS, LABEL_TLS, build_launch_spec
from tensorless_deploy.operations.secrets import secret_command
from tests.render_cases import recipe_for

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

FIXTURES = Path(__file__).parent / "fixtures" / "secrets"
KEY = str(FIXTURES / "api.key")
CERT = str(FIXTURES / "tls.crt")
TLS_KEY = str(FIXTURES / "tls.key")
BLOB = "/var/lib/tensorless/models/models--o--r/blobs/" + "a" * 64


def _write(tmp_path: Path, text: str | bytes, name: str = "k") -> str:
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(p)


def test_key_tls_metrics_and_pids_resolve_like_every_option() -> None:
    assert Options().pids_limit == DEFAULT_PIDS_LIMIT and not Options().tls
    data = {
        "tensorless_api_key_file": KEY,
        "tensorless_tls_cert_file": CERT,
        "tensorless_tls_key_file": TLS_KEY,
        "tensorless_metrics": True,
        "tensorless_insecure_open": False,
        "tensorless_pids_limit": 0,
    }
    o = resolve(Flags(), data, "gpu1")
    assert (o.api_key_file, o.tls, o.metrics, o.pids_limit) == (KEY, True, True, 0)
    # the flag wins over host data, as for --port
    assert resolve(Flags(api_key_file=CERT.replace("tls.crt", "api.key")), data, "gpu1").tls
    assert api_key(KEY) == (FIXTURES / "api.key").read_text().strip()


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("", "exactly one key on one line"),
        ("a" * 20 + "\n" + "b" * 20 + "\n", "exactly one key on one line"),
        ("short\n", "fewer than 16"),
        ("has a space in it, long enough\n", "printable ASCII, no spaces"),
        ("#commented-out-key-0123456789\n", "comment"),
        (b"\xff\xfe" + b"k" * 20, "not ASCII text"),
    ],
)
def test_a_bad_key_file_fails_its_check_naming_the_file_and_why(
    tmp_path: Path, content: str | bytes, why: str
) -> None:
    path = _write(tmp_path, content)
    (c,) = secret_file_checks(Options(api_key_file=path))
    assert (c.id, c.status) == ("api.key_file", "fail") and c.evidence.startswith(path), c
    assert (
        why in c.evidence and "\n" not in c.evidence and "tensorless_api_key_file" in (c.fix or "")
    )
    if isinstance(content, str) and len(content) > 5:
        assert content.strip() not in c.evidence  # never the key itself


def test_paths_are_checked_where_used_and_half_a_tls_pair_is_refused(tmp_path: Path) -> None:
    # resolve takes a path as given (status, stop, an offline plan need no key file here)
    assert resolve(Flags(), {"tensorless_api_key_file": "/nonexistent/k"}, "h").api_key_file
    (c,) = secret_file_checks(Options(api_key_file="/nonexistent/k"))
    assert c.evidence == "cannot read /nonexistent/k: No such file or directory"
    (c,) = secret_file_checks(Options(tls_cert_file=KEY, tls_key_file=TLS_KEY))
    assert c.status == "fail" and "holds no PEM certificate" in c.evidence
    assert [
        c.status for c in secret_file_checks(Options(tls_cert_file=CERT, tls_key_file=TLS_KEY))
    ] == ["ok"]
    with pytest.raises(InventoryError, match="h: tensorless_tls_cert_file without tensorless_tls"):
        resolve(Flags(), {"tensorless_tls_cert_file": CERT}, "h")
    with pytest.raises(UsageError, match="--tls-key-file without --tls-cert-file"):
        resolve(Flags(tls_key_file=TLS_KEY))
    for key, bad in (
        ("tensorless_metrics", "yes"),
        ("tensorless_pids_limit", -1),
        ("tensorless_api_key_file", "a\nb"),
        ("tensorless_api_key_file", 7),
    ):
        with pytest.raises(InventoryError, match=f"h: {key}: must be"):
            resolve(Flags(), {key: bad}, "h")
    with pytest.raises(UsageError, match="--api-key-file : must be the path"):
        resolve(Flags(api_key_file=""))


def test_a_wide_bind_needs_a_key_or_the_operators_explicit_yes() -> None:
    assert api_check(Options()) == []  # loopback, no key: nothing to say
    (c,) = api_check(Options(bind="0.0.0.0"))
    assert c.status == "fail" and "tensorless_insecure_open" in (c.fix or "")
    assert "tensorless_api_key_file" in (c.fix or "") and "--api-key-file" in (c.fix or "")
    (c,) = api_check(Options(bind="::", insecure_open=True))
    assert c.status == "warn"
    (c,) = api_check(
        Options(bind="10.0.0.5", api_key_file=KEY, tls_cert_file=CERT, tls_key_file=TLS_KEY)
    )
    assert c.status == "ok" and c.evidence.startswith("https://10.0.0.5:8080 asks")
    (c,) = api_check(Options(api_key_file=KEY))  # a key on loopback is said too
    assert c.status == "ok"


def test_the_key_reaches_a_unit_only_as_a_mounted_path_and_changes_no_tuning() -> None:
    plain = build_launch_spec(
        recipe_for({"spec": {}}), engine="podman", model_path=BLOB, gpu_uuids=["GPU-1"], cpus=8
    )
    spec = build_launch_spec(
        recipe_for({"spec": {}}),
        engine="podman",
        model_path=BLOB,
        gpu_uuids=["GPU-1"],
        cpus=8,
        bind="0.0.0.0",
        api_key=True,
        tls=True,
        metrics=True,
    )
    assert spec.tuning == plain.tuning and spec.tuning.tuned  # nothing measured changed
    args = list(spec.server_args)
    assert args[args.index("--api-key-file") + 1] == "/run/tensorless/api-key"
    assert args[args.index("--ssl-cert-file") + 1] == "/run/tensorless/tls.crt"
    assert "--metrics" in args and "--api-key" not in args
    assert spec.url == "https://0.0.0.0:8080" and spec.health_url == "https://127.0.0.1:8080/health"
    labels = dict(spec.labels)
    assert (labels[LABEL_AUTH], labels[LABEL_TLS], labels[LABEL_METRICS]) == (
        "api-key",
        "true",
        "true",
    )
    secret = (FIXTURES / "api.key").read_text().strip()
    for unit in (
        render_quadlet(spec, digest="d", notify_healthy=True).content,
        render_service(spec, digest="d", engine_bin="/usr/bin/podman").content,
    ):
        assert secret not in unit
        assert (
            "/etc/tensorless-deploy/secrets/tensorless-pn3-p100/api-key:/run/tensorless/api-key:ro"
            in unit
        )
        assert "curl -fsS --max-time 5 -k https://127.0.0.1:8080/health" in unit


def test_heal_and_always_restart_in_every_unit_kind_that_can() -> None:
    spec = build_launch_spec(
        recipe_for({"spec": {}}), engine="podman", model_path=BLOB, gpu_uuids=["GPU-1"], cpus=8
    )
    quadlet = render_quadlet(spec, digest="d", notify_healthy=True).content
    assert "\nHealthOnFailure=kill\n" in quadlet
    service = render_service(spec, digest="d", engine_bin="/usr/bin/podman").content
    for unit in (quadlet, service):
        # an always-on server: a clean exit (podman stop) restarts too; no start limit ends it
        assert "\nRestart=always\nRestartSec=10\n" in unit
        assert "\nStartLimitIntervalSec=0\n" in unit and "StartLimitBurst" not in unit
        assert "RestartSteps" not in unit  # only where the host's systemd has it
    for unit in (
        render_quadlet(spec, digest="d", notify_healthy=True, restart_backoff=True).content,
        render_service(
            spec, digest="d", engine_bin="/usr/bin/podman", restart_backoff=True
        ).content,
    ):
        assert "\nRestartSec=10\nRestartSteps=5\nRestartMaxDelaySec=300\n" in unit
    assert (
        '"--health-on-failure" "kill"'
        in render_service(spec, digest="d", engine_bin="/usr/bin/podman").content
    )
    # podman older than 4.2 and docker have no --health-on-failure: crashes restart, hangs not
    old = dataclasses.replace(spec, heal=False)
    assert "--health-on-failure" not in run_argv(old, "/usr/bin/podman", health=True)
    docker = dataclasses.replace(spec, engine="docker", gpu_uuids=("GPU-1",))
    assert "--health-on-failure" not in run_argv(docker, "/usr/bin/docker", health=True)
    # the foreground run has none of the health options (it polls /health itself)
    kinds = {o.kind for o in container_options(spec, health=False)}
    assert not {k for k in kinds if k.startswith("health")}
    assert {"user", "read_only", "tmpfs", "pids_limit", "cap_drop", "no_new_privileges"} <= kinds


def test_pids_limit_zero_leaves_it_to_the_engine() -> None:
    spec = build_launch_spec(
        recipe_for({"spec": {}}),
        engine="podman",
        model_path=BLOB,
        gpu_uuids=["GPU-1"],
        cpus=8,
        pids_limit=0,
    )
    assert "--pids-limit" not in run_argv(spec, "podman", health=False)


def test_secret_command_carries_the_secret_on_stdin_only() -> None:
    token = "hf_TheTokenItself0123456789"
    cmd = secret_command("/run/tensorless/hf-auth-x", f"Authorization: Bearer {token}")
    assert token not in cmd.get_raw_value()  # not in argv: sh -c 'the bound script'
    assert cmd.connector_arguments["_stdin"] == f"Authorization: Bearer {token}\n"
    text = cmd.get_raw_value()
    assert "umask 077" in text and 'mktemp "$dir/.secret.XXXXXXXX"' in text


def test_plan_for_a_host_with_a_key_mounts_it_per_unit() -> None:
    from tensorless_deploy.hostplan.plan import secret_sources

    spec = build_launch_spec(
        recipe_for({"spec": {}}),
        engine="podman",
        model_path=BLOB,
        gpu_uuids=["GPU-1"],
        cpus=8,
        api_key=True,
        name="tensorless-pn3-p100-1",
        secrets_root="/run/x",
    )
    (s,) = spec.secrets
    assert s.host_path == "/run/x/tensorless-pn3-p100-1/api-key"
    assert secret_sources(Options(api_key_file=KEY), spec) == (("api-key", KEY),)
    with pytest.raises(ValueError):
        secret_sources(Options(), spec)
