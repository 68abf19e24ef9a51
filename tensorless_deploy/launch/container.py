"""The one description of the container's options, formatted two ways: as `podman run` /
`docker run` flags (the plain unit's ExecStart and the foreground run) and as quadlet
``[Container]`` keys. Neither the template nor the renderers name an option themselves, so the
three renderings cannot drift apart (tests/test_render_golden.py compares them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tensorless_deploy.launch.spec import (
    HEALTH_INTERVAL_S,
    HEALTH_RETRIES,
    HEALTH_STARTUP_INTERVAL_S,
    TMPFS_DIRS,
    LaunchSpec,
)
from tensorless_deploy.shell import HEALTH_TIMEOUT_S

# podman's --health-on-failure exists from 4.2 (the quadlet keys' version is the facts' own
# QUADLET_MIN_PODMAN: a podman without them gets the plain unit)
HEALTH_ON_FAILURE_MIN_PODMAN = (4, 2)

Kind = Literal[
    "health_cmd",
    "health_interval",
    "health_timeout",
    "health_retries",
    "health_start_period",
    "health_on_failure",
    "name",
    "network",
    "user",
    "read_only",
    "tmpfs",
    "pids_limit",
    "cap_drop",
    "no_new_privileges",
    "volume",
    "device",
    "gpus",
    "env",
    "label",
]
Escape = Literal["raw", "word", "raw_words"]


@dataclass(frozen=True)
class Format:
    """How one kind of option is spelled: its run flag, its quadlet key and how quadlet takes
    the value (raw, one quoted word, or several raw words)."""

    flag: str
    key: str | None  # None: no quadlet key (docker only)
    escape: Escape = "raw"
    quadlet_value: str | None = None  # the quadlet value when it differs from the flag's
    joined: bool = False  # one run word, flag=value (a boolean flag: --read-only=true)


FORMATS: dict[Kind, Format] = {
    "health_cmd": Format("--health-cmd", "HealthCmd", "raw_words"),
    "health_interval": Format("--health-interval", "HealthInterval"),
    "health_timeout": Format("--health-timeout", "HealthTimeout"),
    "health_retries": Format("--health-retries", "HealthRetries"),
    "health_start_period": Format("--health-start-period", "HealthStartPeriod"),
    "health_on_failure": Format("--health-on-failure", "HealthOnFailure"),
    "name": Format("--name", "ContainerName"),
    "network": Format("--network", "Network"),
    "user": Format("--user", "User"),
    "read_only": Format("--read-only", "ReadOnly", joined=True),
    "tmpfs": Format("--tmpfs", "Tmpfs"),
    "pids_limit": Format("--pids-limit", "PidsLimit"),
    "cap_drop": Format("--cap-drop", "DropCapability"),
    "no_new_privileges": Format("--security-opt", "NoNewPrivileges", quadlet_value="true"),
    "volume": Format("--volume", "Volume"),
    "device": Format("--device", "AddDevice"),
    "gpus": Format("--gpus", None),
    "env": Format("--env", "Environment", "word"),
    "label": Format("--label", "Label", "word"),
}
# The order of the [Container] keys (the run flags keep the order of container_options).
QUADLET_ORDER: tuple[Kind, ...] = (
    "name",
    "network",
    "user",
    "read_only",
    "tmpfs",
    "volume",
    "device",
    "env",
    "label",
    "cap_drop",
    "no_new_privileges",
    "pids_limit",
    "health_cmd",
    "health_interval",
    "health_timeout",
    "health_retries",
    "health_start_period",
    "health_on_failure",
)


@dataclass(frozen=True)
class Option:
    kind: Kind
    value: str


def health_command(spec: LaunchSpec) -> tuple[str, ...]:
    """curl inside the container, bounded by its own --max-time: podman 5.4 does not end a
    probe at HealthTimeout (seen: a stopped server held one for minutes, so it never turned
    unhealthy). /health needs no API key. With TLS, -k: the probe goes to the container's own
    loopback, carries nothing secret, and a certificate names the host, not 127.0.0.1."""
    insecure = ("-k",) if spec.tls else ()
    return ("curl", "-fsS", "--max-time", str(HEALTH_TIMEOUT_S), *insecure, spec.health_url)


def container_options(
    spec: LaunchSpec, *, health: bool, startup_probe: bool = False
) -> tuple[Option, ...]:
    """Every option of the container, in run-flag order. health: the engine's own health
    check (the units have it; a foreground run polls /health itself instead). startup_probe:
    podman's startup health check gates the regular one (quadlet_startup_keys): the regular
    check then starts once the server is up, and needs no start period of its own (with one,
    failures of a server that hangs right after its start would not count until it ended)."""
    opts: list[Option] = []
    if health:
        period = 0 if startup_probe else spec.start_timeout_s
        opts += [
            Option("health_cmd", " ".join(health_command(spec))),
            Option("health_interval", f"{HEALTH_INTERVAL_S}s"),
            Option("health_timeout", f"{HEALTH_TIMEOUT_S}s"),
            Option("health_retries", str(HEALTH_RETRIES)),
            Option("health_start_period", f"{period}s"),
        ]
        if spec.heal and spec.engine == "podman":  # docker has no --health-on-failure
            opts.append(Option("health_on_failure", "kill"))
    opts += [
        Option("name", spec.name),
        Option("network", "host"),
        Option("user", spec.user),
        Option("read_only", "true"),
        *(Option("tmpfs", d) for d in TMPFS_DIRS),
        Option("cap_drop", "all"),
        Option("no_new_privileges", "no-new-privileges"),
    ]
    if spec.pids_limit is not None:
        opts.append(Option("pids_limit", str(spec.pids_limit)))
    opts.append(Option("volume", f"{spec.model_path}:{spec.model_mount}:ro"))
    opts += [Option("volume", s.volume) for s in spec.secrets]
    if spec.engine == "docker":
        if spec.gpu_uuids:
            # docker reads --gpus as one CSV record: several ids need the field quoted
            # ('"device=a,b"'), else "b" is taken as a field of its own and refused.
            devices = "device=" + ",".join(spec.gpu_uuids)
            opts.append(Option("gpus", devices if len(spec.gpu_uuids) == 1 else f'"{devices}"'))
    else:
        opts += [Option("device", dev) for dev in spec.cdi_devices]
    opts += [Option("env", f"{k}={v}") for k, v in spec.env]
    opts += [Option("label", f"{k}={v}") for k, v in spec.labels]
    return tuple(opts)


def run_flags(options: tuple[Option, ...]) -> list[str]:
    """`podman run` / `docker run` flags, in order."""
    out: list[str] = []
    for o in options:
        f = FORMATS[o.kind]
        out += [f"{f.flag}={o.value}"] if f.joined else [f.flag, o.value]
    return out


# A plain unit's `podman run` stays in the foreground for systemd, yet lets conmon's journald
# log driver carry the server's lines alone: attached to stdout too (podman 4.3 as Debian 12
# ships it), every line reached the journal twice (docs/field-notes.md). docker's default log
# driver writes no journal, so its attached client stays the one copy.
UNIT_JOURNAL_WORDS = ("--log-driver", "journald", "--attach", "stdin")


def run_argv(spec: LaunchSpec, engine_bin: str, *, health: bool) -> list[str]:
    """The whole `ENGINE run` command line: the plain unit's ExecStart (health=True) and the
    foreground run (health=False)."""
    journal = UNIT_JOURNAL_WORDS if health and spec.engine == "podman" else ()
    return [
        engine_bin,
        "run",
        "--rm",
        *journal,
        "--pull=never",
        *run_flags(container_options(spec, health=health)),
        spec.image,
        *spec.server_args,
    ]


def quadlet_keys(options: tuple[Option, ...]) -> list[tuple[str, str, Escape]]:
    """The [Container] keys (key, value, how quadlet takes it), in QUADLET_ORDER."""
    rank = {kind: i for i, kind in enumerate(QUADLET_ORDER)}
    out: list[tuple[str, str, Escape]] = []
    for o in sorted(options, key=lambda o: rank[o.kind]):
        f = FORMATS[o.kind]
        if f.key is None:
            raise ValueError(f"{o.kind}: no quadlet key (a docker option)")
        value = o.value if f.quadlet_value is None else f.quadlet_value
        out.append((f.key, value, f.escape))
    return out


def quadlet_startup_keys(spec: LaunchSpec) -> list[tuple[str, str, Escape]]:
    """podman 5's startup health check, which gates Notify=healthy (the regular interval alone
    would hold the start that long). systemd runs its timer about once a second at a phase of
    its own (podman asks AccuracySec=1s), so probes came 1.5-2.1 s apart on the test hosts, and
    a server listening just after one was ready that much later: a start the tool makes runs
    the probe itself as soon as /health answers (operations/scripts/unit-activate.sh, hurry),
    ready within a probe's time of the server listening; one systemd makes alone (boot, a
    crash) waits for the timer's next probe."""
    return [
        ("HealthStartupCmd", " ".join(health_command(spec)), "raw_words"),
        ("HealthStartupInterval", f"{HEALTH_STARTUP_INTERVAL_S}s", "raw"),
        ("HealthStartupTimeout", f"{HEALTH_TIMEOUT_S}s", "raw"),
        ("HealthStartupSuccess", "1", "raw"),
        ("Notify", "healthy", "raw"),
    ]
