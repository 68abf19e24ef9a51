"""targets: where a Prometheus scrapes the fleet's llama-server /metrics, from the units as they
are on each host (pure): one scrape job per way of scraping (scheme, API key file, CA file), each
with its file-based discovery groups, and why any unit is left out.

A target's address is the one its unit is bound to, or for a wildcard bind the host's address as
the inventory names it (its ssh_hostname); a loopback-bound unit cannot be scraped from another
machine and is left out, like a unit deployed without metrics. The key is never written: a job
names the key file (the inventory's tensorless_api_key_file) as Prometheus's
``authorization.credentials_file``; a TLS job names the certificate the server was given as its
``tls_config.ca_file``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorless_deploy.decisions.checks import is_loopback
from tensorless_deploy.decisions.options import DEFAULT_BIND, address
from tensorless_deploy.facts.values import (
    LABEL_BIND,
    LABEL_CARD,
    LABEL_MODEL,
    LABEL_PORT,
    DeployedUnit,
)
from tensorless_deploy.launch.spec import LABEL_AUTH, LABEL_METRICS, LABEL_TLS

if TYPE_CHECKING:
    from tensorless_deploy.hostplan.gateway import DoorSpec

JOB_PREFIX = "tensorless"
METRICS_PATH = "/metrics"


@dataclass(frozen=True)
class HostUnits:
    """One reachable host's units, with what the inventory says about reaching and calling it."""

    host: str
    reach: str  # the host's address as the inventory names it (ssh_hostname, else its name)
    units: tuple[DeployedUnit, ...]
    api_key_file: str | None  # on the controller (and the Prometheus machine)
    tls_cert_file: str | None


@dataclass(frozen=True)
class Target:
    host: str
    unit: str
    model: str
    card: str
    address: str  # host:port
    scheme: str
    key_file: str | None
    ca_file: str | None

    def labels(self) -> dict[str, str]:
        return {"host": self.host, "unit": self.unit, "model": self.model, "card": self.card}


@dataclass(frozen=True)
class Skipped:
    host: str
    unit: str
    why: str


@dataclass(frozen=True)
class Job:
    """One Prometheus scrape job: every target it holds is scraped the same way."""

    name: str
    scheme: str
    key_file: str | None
    ca_file: str | None
    targets: tuple[Target, ...]

    def file_sd(self) -> list[dict[str, Any]]:
        """The job's file-based discovery file: one group per instance, with its labels."""
        return [{"targets": [t.address], "labels": t.labels()} for t in self.targets]

    def scrape_config(self, file_sd_path: str) -> dict[str, Any]:
        """The job under Prometheus's scrape_configs."""
        config: dict[str, Any] = {
            "job_name": self.name,
            "scheme": self.scheme,
            "metrics_path": METRICS_PATH,
            "file_sd_configs": [{"files": [file_sd_path]}],
        }
        if self.key_file is not None:
            config["authorization"] = {"type": "Bearer", "credentials_file": self.key_file}
        if self.ca_file is not None:
            config["tls_config"] = {"ca_file": self.ca_file}
        return config


def scrape_address(bind: str, port: int, reach: str) -> str | None:
    """Where another machine reaches a unit bound to bind:port on a host the inventory reaches at
    reach; None for a loopback bind."""
    if is_loopback(bind):
        return None
    try:
        wildcard = ipaddress.ip_address(bind).is_unspecified  # 0.0.0.0, :: in any spelling
    except ValueError:  # a label written by hand: taken as the address it names
        wildcard = False
    if wildcard:
        return address(reach, port)
    return address(bind, port)


def host_targets(h: HostUnits) -> tuple[list[Target], list[Skipped]]:
    targets: list[Target] = []
    skipped: list[Skipped] = []
    for u in h.units:
        labels = u.unit_labels
        port = labels.get(LABEL_PORT, "")
        if labels.get(LABEL_METRICS) != "true":
            skipped.append(
                Skipped(h.host, u.name, "no /metrics: set tensorless_metrics = true and deploy")
            )
            continue
        if not port.isdigit():
            skipped.append(Skipped(h.host, u.name, "the unit names no port (written by hand?)"))
            continue
        bind = labels.get(LABEL_BIND) or DEFAULT_BIND
        where = scrape_address(bind, int(port), h.reach)
        if where is None:
            skipped.append(
                Skipped(
                    h.host,
                    u.name,
                    f"bound to {bind}: no other machine reaches it (set tensorless_bind, "
                    "with tensorless_api_key_file, and deploy)",
                )
            )
            continue
        keyed = labels.get(LABEL_AUTH) == "api-key"
        if keyed and h.api_key_file is None:
            skipped.append(
                Skipped(
                    h.host,
                    u.name,
                    "the unit needs an API key and the inventory names none for this host "
                    "(tensorless_api_key_file)",
                )
            )
            continue
        tls = labels.get(LABEL_TLS) == "true"
        targets.append(
            Target(
                host=h.host,
                unit=u.name,
                model=labels.get(LABEL_MODEL, ""),
                card=labels.get(LABEL_CARD, ""),
                address=where,
                scheme="https" if tls else "http",
                key_file=h.api_key_file if keyed else None,
                ca_file=h.tls_cert_file if tls else None,
            )
        )
    return targets, skipped


def door_target(host: str, reach: str, spec: DoorSpec | None) -> Target | Skipped:
    """The front door on host (reached at reach) as a target: HAProxy's own Prometheus
    endpoint at the door's address, asked with the door's key (its gateway run's files)."""
    from tensorless_deploy.hostplan.gateway import SERVICE

    unit = SERVICE.removesuffix(".service")
    if spec is None:
        return Skipped(host, unit, "its markers record no gateway run: run gateway again")
    bind = spec.bind or DEFAULT_BIND
    where = scrape_address(bind, spec.port, reach)
    if where is None:
        return Skipped(
            host, unit, f"the door is bound to {bind}: no other machine reaches it (--bind)"
        )
    tls = spec.tls_cert_file is not None
    return Target(
        host=host,
        unit=unit,
        model=",".join(spec.models),
        card="",
        address=where,
        scheme="https" if tls else "http",
        key_file=spec.api_key_file,
        ca_file=spec.tls_cert_file if tls else None,
    )


def jobs(
    hosts: Iterable[HostUnits], doors: Sequence[Target | Skipped] = ()
) -> tuple[list[Job], list[Skipped]]:
    """The fleet's scrape jobs (in a stable order and with stable names: the same inventory and
    units give the same files) and the units left out; doors: the front doors' targets."""
    groups: dict[tuple[str, str | None, str | None], list[Target]] = {}
    skipped: list[Skipped] = [d for d in doors if isinstance(d, Skipped)]
    found_doors = [d for d in doors if isinstance(d, Target)]
    for t in found_doors:
        groups.setdefault((t.scheme, t.key_file, t.ca_file), []).append(t)
    for h in hosts:
        found, left = host_targets(h)
        skipped += left
        for t in found:
            groups.setdefault((t.scheme, t.key_file, t.ca_file), []).append(t)
    out = []
    for (scheme, key_file, ca_file), members in sorted(groups.items(), key=lambda g: _key(g[0])):
        out.append(
            Job(_job_name(scheme, key_file, ca_file), scheme, key_file, ca_file, tuple(members))
        )
    return out, skipped


def _key(k: tuple[str, str | None, str | None]) -> tuple[str, str, str]:
    return (k[0], k[1] or "", k[2] or "")


def _job_name(scheme: str, key_file: str | None, ca_file: str | None) -> str:
    """tensorless for plain keyless http; else a name that says how, with a short hash of the
    files (two key files never share a job)."""
    if key_file is None and ca_file is None and scheme == "http":
        return JOB_PREFIX
    parts = [JOB_PREFIX, *(["key"] if key_file else []), *(["tls"] if scheme == "https" else [])]
    digest = hashlib.sha256(json.dumps([scheme, key_file, ca_file]).encode()).hexdigest()[:8]
    return "-".join([*parts, digest])


def scrape_configs_yaml(configs: Sequence[dict[str, Any]]) -> str:
    """Prometheus's scrape_configs as YAML (launch.kube's writer: block style, quoted where a
    YAML 1.1 reader such as Prometheus's would misread a value)."""
    from tensorless_deploy.launch.kube import to_yaml

    return to_yaml([{"scrape_configs": list(configs)}])
