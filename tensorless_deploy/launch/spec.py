"""The launch spec: one value describing the container that serves a recipe on a host.

Rendered three ways (quadlet .container, plain systemd .service, the argv of a foreground run)
from one option set (launch.container); deploy, serve and run build it through the same
function, so a recipe that runs locally deploys identically. Every address the tool prints or
polls comes from here.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tensorless_deploy.decisions.checks import EngineName, Tuning, threads_for, tuning
from tensorless_deploy.decisions.device import CUDA_DEVICE, expected_device
from tensorless_deploy.decisions.options import (
    CORS_LOOPBACK,
    DEFAULT_PIDS_LIMIT,
    address,
    reach_host,
)
from tensorless_deploy.facts.values import (
    LABEL_BIND,
    LABEL_CARD,
    LABEL_DEVICE,
    LABEL_HEALTH,
    LABEL_MODEL,
    LABEL_PORT,
    LABEL_PREFIX,
    LABEL_RECIPE_DIGEST,
    LABEL_TUNED,
)
from tensorless_deploy.recipe.catalog import recipe_digest, slug, unit_name
from tensorless_deploy.recipe.flags import LAUNCHER
from tensorless_deploy.recipe.schema import Recipe
from tensorless_deploy.shell import UNIT_PREFIX

MODEL_MOUNT_DIR = "/models"
_PLAIN = re.compile(r"[A-Za-z0-9._+-]+")
# Loading reads the whole file; budget a slow disk (50 MB/s) on top of a fixed two minutes.
START_TIMEOUT_BASE_S = 120
START_TIMEOUT_BYTES_PER_S = 50_000_000
# The health check: how often, how long one probe may take, how many failures make it unhealthy;
# unhealthy: killed and restarted (a hung server is found within about 3 x 10 s + 5 s; where the
# startup probe gates the check (podman 5) from the moment the server is up, else once the start
# period, the start timeout, has passed).
HEALTH_INTERVAL_S = 10  # one probe may take shell.HEALTH_TIMEOUT_S, as every probe may
HEALTH_RETRIES = 3
HEALTH_STARTUP_INTERVAL_S = 1  # while loading, with Notify=healthy (podman 5)
# An always-on server comes back from anything but a stop asked of systemd (Restart=always, no
# start limit: a crash loop never leaves the unit down for good). It is started again RESTART_SEC
# after it ended; where systemd has RestartSteps= (254 and later) the pause grows over
# RESTART_STEPS restarts to RESTART_MAX_DELAY_S, so a server that keeps failing costs one start
# every five minutes, and one whose cause went away (a disk freed, a GPU back) serves again.
RESTART_SEC = 10
RESTART_STEPS = 5
RESTART_MAX_DELAY_S = 300
RESTART_STEPS_MIN_SYSTEMD = 254
# llama-server's log verbosity: 4 ("trace") prints its library's INFO lines, among them where
# the model went (facts.device); the default, 3, prints none of them.
LOG_VERBOSITY = 4
# The engine image contract (engine/README.md): llama-server runs as this plain user; the units
# say so themselves, so an image that declares none (the CPU test image) runs as it too.
ENGINE_UID = 10001
ENGINE_GID = 10001
# Where llama-server may write with a read-only root: nothing it needs (strace of a load and a
# completion shows no write), a small tmpfs for libraries that want a temporary file.
TMPFS_DIRS = ("/tmp",)
# The operator's secrets on the host, one directory per unit (0700 root), each file root-owned
# and readable by the engine's group only (0440 root:10001): what llama-server reads through
# one read-only file mount each, at the same path in every container.
SECRETS_DIR = "/etc/tensorless-deploy/secrets"
SECRET_MOUNT_DIR = "/run/tensorless"
SECRET_FILE_MODE = "440"
API_KEY_NAME = "api-key"
TLS_CERT_NAME = "tls.crt"
TLS_KEY_NAME = "tls.key"
# Labels beside facts.values' own (status reads them back from the unit or the container).
LABEL_AUTH = f"{LABEL_PREFIX}.auth"  # "api-key": callers need the key; "none"
LABEL_TLS = f"{LABEL_PREFIX}.tls"  # "true": https
LABEL_METRICS = f"{LABEL_PREFIX}.metrics"  # "true": /metrics (with the key where one is set)


# The release gate's scratch instances (gate run): a transient unit and container of their own
# name, never a serving unit's (those never end in a -gate-TAG part, nor start tensorless-gate-).
SCRATCH_PREFIX = UNIT_PREFIX + "gate-"


def scratch_name(recipe: Recipe, tag: str) -> str:
    """The transient unit and container of one gate run: tensorless-gate-<model>-<card>-<tag>."""
    return SCRATCH_PREFIX + slug(
        f"{recipe.model.name or recipe.model.hf_repo}-{recipe.card.id}-{tag}"
    )


def unit_model_slug(name: str, card: str) -> str | None:
    """The model part of a unit's name (its short name or repo id, slugged), given its card
    label; None when the name is not one unit_name makes (instances add -1, -2...)."""
    m = re.fullmatch(
        re.escape(UNIT_PREFIX) + r"(.+)-" + re.escape(slug(card)) + r"(-[0-9]+)?", name
    )
    return m.group(1) if m else None


def start_timeout_s(recipe: Recipe) -> int:
    return START_TIMEOUT_BASE_S + recipe.model.size_bytes // START_TIMEOUT_BYTES_PER_S


def scheme(tls: bool) -> str:
    return "https" if tls else "http"


def health_url(bind: str, port: int, tls: bool = False) -> str:
    """The /health URL a client on the same host polls for a server bound to bind:port."""
    return f"{scheme(tls)}://{address(reach_host(bind), port)}/health"


def secrets_dir(name: str, root: str = SECRETS_DIR) -> str:
    """The host directory of one unit's secrets."""
    return posixpath.join(root, name)


def api_key_path(name: str) -> str:
    """Where the host keeps one unit's API key (what a read of its /slots or /metrics sends)."""
    return posixpath.join(secrets_dir(name), API_KEY_NAME)


@dataclass(frozen=True)
class Secret:
    """One operator file llama-server reads: its name, where the host keeps it (installed by
    operations.secrets), and where the container sees it (a read-only file mount)."""

    name: str  # api-key, tls.crt, tls.key
    host_path: str
    mount: str

    @property
    def volume(self) -> str:
        return f"{self.host_path}:{self.mount}:ro"


def split_address(text: str) -> tuple[str, int] | None:
    """ "127.0.0.1:8080" or "[::1]:8080" -> (host, port); None when it is not one."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


@dataclass(frozen=True)
class LaunchSpec:
    """Everything about the container, decided; renderers only format it."""

    name: str
    description: str
    engine: EngineName
    image: str
    model_path: str  # the verified file on the host
    model_mount: str  # where llama-server sees it, read-only
    gpu_uuids: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    server_args: tuple[str, ...]  # llama-server's argv after the binary
    bind: str
    port: int
    labels: tuple[tuple[str, str], ...]
    tuning: Tuning
    start_timeout_s: int
    user: str = f"{ENGINE_UID}:{ENGINE_GID}"
    secrets: tuple[Secret, ...] = ()  # the API key, the TLS pair: file mounts, never values
    tls: bool = False
    metrics: bool = False
    pids_limit: int | None = None  # None: none set by the tool (the engine's default)
    heal: bool = True  # an unhealthy container is killed (podman --health-on-failure=kill)
    device: str = CUDA_DEVICE  # where it must say it runs (decisions.device.expected_device)

    @property
    def address(self) -> str:
        """bind:port, as the operator reaches the API (brackets around an IPv6 literal)."""
        return address(self.bind, self.port)

    @property
    def url(self) -> str:
        return f"{scheme(self.tls)}://{self.address}"

    @property
    def health_url(self) -> str:
        return health_url(self.bind, self.port, self.tls)

    @property
    def api_key(self) -> bool:
        return any(s.name == API_KEY_NAME for s in self.secrets)

    @property
    def cdi_devices(self) -> tuple[str, ...]:
        return tuple(f"nvidia.com/gpu={uuid}" for uuid in self.gpu_uuids)


def launcher_args(values: Mapping[str, str | bool | None]) -> tuple[str, ...]:
    """The launcher's own llama-server flags with their values, in the order of their table
    (recipe.flags.LAUNCHER): a value None, or a switch's False, leaves its flag out. ``values``
    names exactly the table's values, so a flag cannot be written without its row (refused in
    every spelling, read back by launch.read) nor a row left without its value."""
    rows = {r.sets for r in LAUNCHER}
    if set(values) != rows:
        raise ValueError(f"launcher values without a row or a value: {sorted(rows ^ set(values))}")
    out: list[str] = []
    for row in LAUNCHER:
        value = values[row.sets]
        if value is None or value is False:
            continue
        if isinstance(value, bool) != row.switch:
            raise TypeError(
                f"{row.written}: {value!r} is not a {'switch' if row.switch else 'value'}"
            )
        out += [row.written] if row.switch else [row.written, str(value)]
    return tuple(out)


def build_launch_spec(
    recipe: Recipe,
    *,
    engine: EngineName,
    model_path: str,
    gpu_uuids: Sequence[str],
    cpus: int | None,
    port: int = 8080,
    bind: str = "127.0.0.1",
    context: int | None = None,
    extra_args: Sequence[str] = (),
    name: str | None = None,
    api_key: bool = False,
    tls: bool = False,
    metrics: bool = False,
    pids_limit: int | None = DEFAULT_PIDS_LIMIT,
    heal: bool = True,
    secrets_root: str = SECRETS_DIR,
    device: str | None = None,
    cors_origins: str = CORS_LOOPBACK,
) -> LaunchSpec:
    """The one way a recipe becomes a container, for deploy, serve and run alike. api_key and
    tls say that the operator's key file / certificate pair is installed for this unit (under
    secrets_root/NAME/); none of them changes what was measured, so none touches tuning.
    device: where the instance must say it runs (decisions.device.expected_device of its cards;
    None: by the recipe's engine arch alone, the card not tied to a bus id)."""
    where_on = device if device is not None else expected_device(recipe.engine.arch, ())
    threads = threads_for(recipe, cpus)
    tune = tuning(recipe, context, extra_args)
    unit = name or unit_name(recipe)
    where = secrets_dir(unit, secrets_root)
    wanted = ([API_KEY_NAME] if api_key else []) + ([TLS_CERT_NAME, TLS_KEY_NAME] if tls else [])
    secrets = tuple(
        Secret(n, posixpath.join(where, n), posixpath.join(SECRET_MOUNT_DIR, n)) for n in wanted
    )
    mounts = {s.name: s.mount for s in secrets}
    base = posixpath.basename(recipe.model.file)
    # The mount point appears raw in a quadlet Volume=: keep it to plain characters.
    mount = posixpath.join(MODEL_MOUNT_DIR, base if _PLAIN.fullmatch(base) else "model.gguf")
    launcher = launcher_args(
        {
            "model": mount,
            "bind": bind,
            "port": str(port),
            "context": str(context if context is not None else recipe.run.context),
            "alias": recipe.run.alias,
            "threads": str(threads),
            "threads_batch": str(threads),
            "verbosity": str(LOG_VERBOSITY),
            "api_key_file": mounts.get(API_KEY_NAME),
            "tls_cert_file": mounts.get(TLS_CERT_NAME),
            "tls_key_file": mounts.get(TLS_KEY_NAME),
            "metrics": metrics,
            "cors_origins": cors_origins,  # never llama-server's own default, *
        }
    )
    server_args = (*launcher, *recipe.run.args, *extra_args)
    env = (*recipe.run.env.items(), ("OMP_NUM_THREADS", str(threads)))
    labels = (
        (LABEL_RECIPE_DIGEST, recipe_digest(recipe)),
        (LABEL_MODEL, recipe.model.hf_repo),
        (LABEL_CARD, recipe.card.id),
        (LABEL_BIND, bind),
        (LABEL_PORT, str(port)),
        (LABEL_TUNED, "true" if tune.tuned else "false"),
        (LABEL_HEALTH, health_url(bind, port, tls)),
        (LABEL_AUTH, "api-key" if api_key else "none"),
        (LABEL_TLS, "true" if tls else "false"),
        (LABEL_METRICS, "true" if metrics else "false"),
        (LABEL_DEVICE, where_on),
    )
    return LaunchSpec(
        name=unit,
        description=f"tensorless llama-server: {recipe.model.hf_repo} on {recipe.card.id}",
        engine=engine,
        image=recipe.engine.image,
        model_path=model_path,
        model_mount=mount,
        gpu_uuids=tuple(gpu_uuids),
        env=env,
        server_args=server_args,
        bind=bind,
        port=port,
        labels=labels,
        tuning=tune,
        start_timeout_s=start_timeout_s(recipe),
        secrets=secrets,
        tls=tls,
        metrics=metrics,
        pids_limit=pids_limit or None,
        heal=heal,
        device=where_on,
    )
