"""Unit files read back (launch.read): the quadlet and the plain unit of one spec read back to the
same container, and a change of the recipe shows as the field that changed, nothing else."""

from __future__ import annotations

import pytest

from tensorless_deploy.launch.read import drift, read_unit
from tensorless_deploy.launch.render import render_quadlet, render_service
from tests.render_cases import cases, recipe_for, spec_for

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

PODMAN = [c for c in cases() if c.data["spec"]["engine"] == "podman"]


@pytest.mark.parametrize("case", PODMAN, ids=[c.name for c in PODMAN])
def test_both_unit_kinds_read_back_to_the_same_container(case: object) -> None:
    data = case.data  # type: ignore[attr-defined]
    spec = spec_for(data, recipe_for(data))
    quadlet = render_quadlet(spec, digest="sha256:" + "0" * 64, notify_healthy=False)
    service = render_service(spec, digest="sha256:" + "0" * 64, engine_bin="/usr/bin/podman")
    q, s = read_unit(quadlet.path, quadlet.content), read_unit(service.path, service.content)
    assert q.image == s.image == spec.image
    assert q.server_args == s.server_args == spec.server_args
    assert sorted(q.options) == sorted(s.options)
    assert drift(q, s, "", "") == ()
    # podman 5's startup probe gates the health check: no start period is the one difference
    probed = render_quadlet(spec, digest="sha256:" + "0" * 64, notify_healthy=True)
    p = read_unit(probed.path, probed.content)
    assert set(p.options) ^ set(q.options) == {
        ("health_start_period", "0s"),
        ("health_start_period", f"{spec.start_timeout_s}s"),
    }


@pytest.mark.parametrize("kind", ["quadlet", "service"])
def test_a_recipe_change_is_named_field_by_field(kind: str) -> None:
    base = next(c for c in cases() if c.name == "quadlet-podman5").data
    changed = {**base, "run": {"context": 1024, "env": {"GGML_CUDA_FATTN_SM60": "0"}}}

    def unit(data: dict) -> tuple[str, str]:  # type: ignore[type-arg]
        spec = spec_for(data, recipe_for(data))
        if kind == "quadlet":
            u = render_quadlet(spec, digest="sha256:" + "0" * 64, notify_healthy=True)
        else:
            u = render_service(spec, digest="sha256:" + "0" * 64, engine_bin="/usr/bin/podman")
        return u.path, u.content

    (pa, a), (pb, b) = unit(base), unit(changed)
    found = {
        d.field: (d.deployed, d.wanted) for d in drift(read_unit(pa, a), read_unit(pb, b), a, b)
    }
    assert set(found) == {"context", "env"}, found
    assert found["context"] == ("65536", "1024")
    assert "GGML_CUDA_FATTN_SM60=0" in found["env"][1]


@pytest.mark.parametrize("kind", ["quadlet", "service"])
def test_the_operators_access_and_secrets_are_fields_of_their_own(kind: str) -> None:
    """A unit deployed with an API key, TLS and /metrics, compared with the same recipe without
    them: the key and TLS mounts are "secrets" (they were reported as "model"), the
    --api-key-file, --ssl-*-file and --metrics arguments "access" (they were not reported), and
    the model's own mount is no drift at all. The CORS origins are access too."""
    base = next(c for c in cases() if c.name == "quadlet-podman5").data

    def unit(**spec: object) -> tuple[str, str]:
        data = {**base, "spec": {**base["spec"], **spec}}
        s = spec_for(data, recipe_for(data))
        if kind == "quadlet":
            u = render_quadlet(s, digest="sha256:" + "0" * 64, notify_healthy=True)
        else:
            u = render_service(s, digest="sha256:" + "0" * 64, engine_bin="/usr/bin/podman")
        return u.path, u.content

    (pa, a), (pb, b) = unit(api_key=True, tls=True, metrics=True), unit()
    found = {
        d.field: (d.deployed, d.wanted) for d in drift(read_unit(pa, a), read_unit(pb, b), a, b)
    }
    assert set(found) == {"secrets", "access"}, found
    assert "/run/tensorless/api-key" in found["secrets"][0] and found["secrets"][1] == "-"
    deployed, wanted = found["access"]
    for arg in ("--api-key-file /run/tensorless/api-key", "--ssl-cert-file", "--metrics"):
        assert arg in deployed and arg not in wanted, found["access"]
    assert "--cors-origins localhost" in deployed and "--cors-origins localhost" in wanted
    pc, c = unit(cors_origins="https://ui.example.net")
    assert {d.field for d in drift(read_unit(pb, b), read_unit(pc, c), b, c)} == {"access"}
