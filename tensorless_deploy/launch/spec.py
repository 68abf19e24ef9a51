"""The launch spec: one value describing the container that serves a recipe on a host.

Rendered three ways (quadlet .container, plain systemd .service, the argv of a foreground run)
from one option set (launch.container); deploy, serve and run build it through the same
function, so a recipe that runs locally deploys identically. Every address the tool prints or
polls comes from here.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tensorless_deploy.decisions.checks import EngineName, Tuning, threads_for, tuning
from tensorless_deploy.decisions.options import address, reach_host
from tensorless_deploy.facts.values import (
    LABEL_BIND,
    LABEL_CARD,
    LABEL_HEALTH,
    LABEL_MODEL,
    LABEL_PORT,
    LABEL_RECIPE_DIGEST,
    LABEL_TUNED,
)
from tensorless_deploy.recipe.catalog import recipe_digest
from tensorless_deploy.recipe.schema import Recipe

MODEL_MOUNT_DIR = "/models"
_PLAIN = re.compile(r"[A-Za-z0-9._+-]+")
# Loading reads the whole file; budget a slow disk (50 MB/s) on top of a fixed two minutes.
START_TIMEOUT_BASE_S = 120
START_TIMEOUT_BYTES_PER_S = 50_000_000
# The health check: how often, how long one probe may take, how many failures make it unhealthy.
HEALTH_INTERVAL_S = 30
HEALTH_TIMEOUT_S = 5
HEALTH_RETRIES = 3
HEALTH_STARTUP_INTERVAL_S = 1  # while loading, with Notify=healthy (podman 5)


UNIT_PREFIX = "tensorless-"


def slug(text: str) -> str:
    """A name part of a unit: lowercase letters and digits, runs of anything else one dash."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def unit_name(recipe: Recipe) -> str:
    """The systemd service and container name: tensorless-<short name or repo>-<card>."""
    stem = recipe.model.name or recipe.model.hf_repo
    return UNIT_PREFIX + slug(f"{stem}-{recipe.card.id}")


def unit_model_slug(name: str, card: str) -> str | None:
    """The model part of a unit's name (its short name or repo id, slugged), given its card
    label; None when the name is not one unit_name makes (instances add -1, -2...)."""
    m = re.fullmatch(
        re.escape(UNIT_PREFIX) + r"(.+)-" + re.escape(slug(card)) + r"(-[0-9]+)?", name
    )
    return m.group(1) if m else None


def start_timeout_s(recipe: Recipe) -> int:
    return START_TIMEOUT_BASE_S + recipe.model.size_bytes // START_TIMEOUT_BYTES_PER_S


def health_url(bind: str, port: int) -> str:
    """The /health URL a client on the same host polls for a server bound to bind:port."""
    return f"http://{address(reach_host(bind), port)}/health"


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

    @property
    def address(self) -> str:
        """bind:port, as the operator reaches the API (brackets around an IPv6 literal)."""
        return address(self.bind, self.port)

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def health_url(self) -> str:
        return health_url(self.bind, self.port)

    @property
    def cdi_devices(self) -> tuple[str, ...]:
        return tuple(f"nvidia.com/gpu={uuid}" for uuid in self.gpu_uuids)


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
) -> LaunchSpec:
    """The one way a recipe becomes a container, for deploy, serve and run alike."""
    threads = threads_for(recipe, cpus)
    tune = tuning(recipe, context, extra_args)
    base = posixpath.basename(recipe.model.file)
    # The mount point appears raw in a quadlet Volume=: keep it to plain characters.
    mount = posixpath.join(MODEL_MOUNT_DIR, base if _PLAIN.fullmatch(base) else "model.gguf")
    server_args = (
        "-m",
        mount,
        "--host",
        bind,
        "--port",
        str(port),
        "-c",
        str(context if context is not None else recipe.run.context),
        "--alias",
        recipe.run.alias,
        "-t",
        str(threads),
        "-tb",
        str(threads),
        *recipe.run.args,
        *extra_args,
    )
    env = (*recipe.run.env.items(), ("OMP_NUM_THREADS", str(threads)))
    labels = (
        (LABEL_RECIPE_DIGEST, recipe_digest(recipe)),
        (LABEL_MODEL, recipe.model.hf_repo),
        (LABEL_CARD, recipe.card.id),
        (LABEL_BIND, bind),
        (LABEL_PORT, str(port)),
        (LABEL_TUNED, "true" if tune.tuned else "false"),
        (LABEL_HEALTH, health_url(bind, port)),
    )
    return LaunchSpec(
        name=name or unit_name(recipe),
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
    )
