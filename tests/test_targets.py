"""status's load from llama-server's /metrics and the Prometheus scrape jobs of `targets`, from
units as the DeployedUnits fact reads them on a real test host (tests/pyinfra_facts): which
units are scraped, at which address, with which key file and CA, in which job, and why the
others are left out."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tensorless_deploy.facts.parsers import parse_deployed_units
from tensorless_deploy.facts.values import LABEL_BIND, DeployedUnit
from tensorless_deploy.hostplan.status import load, unit_status
from tensorless_deploy.hostplan.targets import (
    HostUnits,
    jobs,
    scrape_address,
    scrape_configs_yaml,
)
from tensorless_deploy.launch.spec import LABEL_AUTH, LABEL_METRICS, LABEL_TLS

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

SCENARIOS = Path(__file__).parent / "pyinfra_facts" / "DeployedUnits"
METRICS = Path(__file__).parent / "fixtures" / "llama-server" / "metrics.txt"


def scenario(name: str) -> DeployedUnit:
    case = json.loads((SCENARIOS / f"{name}.json").read_text())
    (unit,) = parse_deployed_units("\n".join(case["output"]))
    return unit


def relabel(u: DeployedUnit, **labels: str | None) -> DeployedUnit:
    new = {k: v for k, v in {**u.unit_labels, **labels}.items() if v is not None}
    return dataclasses.replace(u, unit_labels=new, name=labels.get("name") or u.name)


# ---------------------------------------------------------------------------------------- load


def test_status_load_from_the_metrics_a_real_server_answered() -> None:
    u = scenario("quadlet-metrics")
    assert u.metrics_status == 200
    now, why = load(u)
    assert why is None and now is not None
    m = u.metrics
    assert now.busy_slots == m["requests_processing"] and now.queued == m["requests_deferred"]
    # generation speed from the counters, not the gauge a read of /metrics resets
    assert now.tokens_per_second == round(
        m["tokens_predicted_total"] / m["tokens_predicted_seconds_total"], 2
    )
    assert now.tokens_predicted == 56 and now.prompt_tokens == 24
    status = unit_status(u, None, True)
    assert status.json()["metrics"]["tokens_per_second"] == now.tokens_per_second
    assert re.fullmatch(r"0 busy, 0 queued, [0-9.]+ tok/s gen", now.text())


def test_every_sample_of_a_real_metrics_page_is_kept() -> None:
    """What the fact script's sed keeps of a real /metrics page: every llamacpp: sample."""
    samples = {
        line.split()[0].removeprefix("llamacpp:"): float(line.split()[1])
        for line in METRICS.read_text().splitlines()
        if line.startswith("llamacpp:")
    }
    assert len(samples) >= 10 and "requests_processing" in samples
    assert set(scenario("quadlet-metrics").metrics) == set(samples)


def test_a_key_the_reader_could_not_read_says_so() -> None:
    u = scenario("metrics-without-key")
    assert u.metrics_status == 401 and u.metrics == {}
    now, why = load(u)
    assert now is None and why is not None and "401" in why and "root" in why
    assert unit_status(u, None, True).json()["metrics_error"] == why


def test_no_metrics_asked_or_enabled_is_no_load() -> None:
    u = scenario("quadlet-running")
    assert load(u) == (None, None)
    doc = unit_status(u, None, True).json()
    assert doc["metrics"] is None and doc["metrics_error"] is None


# ------------------------------------------------------------------------------------- targets


def host(
    name: str, *units: DeployedUnit, key: str | None = "/keys/fleet.key", cert: str | None = None
) -> HostUnits:
    return HostUnits(name, f"{name}.example", units, key, cert)


def test_scrape_address_of_each_kind_of_bind() -> None:
    assert scrape_address("0.0.0.0", 8080, "10.0.0.5") == "10.0.0.5:8080"
    assert scrape_address("::", 8080, "gpu1.lan") == "gpu1.lan:8080"
    assert scrape_address("10.1.2.3", 8081, "gpu1.lan") == "10.1.2.3:8081"
    assert scrape_address("fd00::7", 8081, "gpu1.lan") == "[fd00::7]:8081"
    assert scrape_address("127.0.0.1", 8080, "gpu1.lan") is None
    assert scrape_address("::1", 8080, "gpu1.lan") is None


def test_a_keyed_unit_is_scraped_with_the_key_file_never_the_key() -> None:
    u = scenario("quadlet-metrics")
    assert u.unit_labels[LABEL_AUTH] == "api-key" and u.unit_labels[LABEL_METRICS] == "true"
    made, skipped = jobs([host("gpu1", u)])
    assert skipped == []
    (job,) = made
    assert job.file_sd() == [
        {
            "targets": ["gpu1.example:8080"],
            "labels": {
                "host": "gpu1",
                "unit": "tensorless-tiny-p100",
                "model": "tensorless-test/tiny-llama-GGUF",
                "card": "p100",
            },
        }
    ]
    config = job.scrape_config("/prom/x.json")
    assert config["authorization"] == {"type": "Bearer", "credentials_file": "/keys/fleet.key"}
    assert config["scheme"] == "http" and "tls_config" not in config
    assert json.dumps(config).count("/keys/fleet.key") == 1


def test_left_out_units_say_why() -> None:
    u = scenario("quadlet-metrics")
    plain = scenario("quadlet-running")
    made, skipped = jobs(
        [
            host("a", relabel(u, **{LABEL_BIND: "127.0.0.1"})),
            host("b", plain),
            host("c", u, key=None),
        ]
    )
    assert made == []
    why = {s.host: s.why for s in skipped}
    assert "bound to 127.0.0.1" in why["a"] and "tensorless_bind" in why["a"]
    assert "tensorless_metrics" in why["b"]
    assert "tensorless_api_key_file" in why["c"]


def test_jobs_part_by_key_file_and_tls_with_stable_names() -> None:
    u = scenario("quadlet-metrics")
    tls = relabel(u, **{LABEL_TLS: "true"})
    open_ = relabel(u, **{LABEL_AUTH: "none"})
    fleet = [
        host("a", u),
        host("b", u),
        host("c", u, key="/keys/other.key"),
        host("d", tls, cert="/certs/d.crt"),
        host("e", open_),
    ]
    made, skipped = jobs(fleet)
    assert skipped == []
    by_hosts = {tuple(t.host for t in j.targets): j for j in made}
    assert set(by_hosts) == {("a", "b"), ("c",), ("d",), ("e",)}
    assert by_hosts[("e",)].name == "tensorless"
    assert by_hosts[("d",)].scheme == "https"
    assert by_hosts[("d",)].scrape_config("f")["tls_config"] == {"ca_file": "/certs/d.crt"}
    names = [j.name for j in made]
    assert len(set(names)) == len(names)
    assert names == [j.name for j in jobs(list(reversed(fleet)))[0]]  # same fleet, same names
    for j in made:
        assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_-]*", j.name)  # a Prometheus job name


@pytest.mark.parametrize("tls", [False, True])
def test_scrape_configs_yaml_reads_back_as_the_jobs(tls: bool) -> None:
    u = scenario("quadlet-metrics")
    if tls:
        u = relabel(u, **{LABEL_TLS: "true"})
    made, _ = jobs(
        [host("a", u, cert="/c/a.crt"), host("b", u, key='/odd "path"/k: x.key', cert="/c/a.crt")]
    )
    configs: list[dict[str, Any]] = [j.scrape_config(f"/prom/{j.name}.json") for j in made]
    assert yaml.safe_load(scrape_configs_yaml(configs)) == {"scrape_configs": configs}


def test_a_wildcard_in_any_spelling_is_the_hosts_address() -> None:
    assert scrape_address("::0", 8080, "gpu1.example") == "gpu1.example:8080"
    assert scrape_address("not-an-ip", 8080, "gpu1") == "not-an-ip:8080"  # as the label says
