"""Layer 4: the launch spec, one value describing the container that serves a recipe on a host.

Rendered three ways (quadlet .container, plain systemd .service, the argv of a foreground run);
deploy, serve and run build it through the same function, so a recipe that runs locally deploys
identically.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tensorless_deploy.decisions.checks import EngineName, Tuning, threads_for, tuning
from tensorless_deploy.recipe.catalog import recipe_digest
from tensorless_deploy.recipe.schema import Recipe

MODEL_MOUNT_DIR = "/models"
_PLAIN = re.compile(r"[A-Za-z0-9._+-]+")
LABEL_PREFIX = "io.tensorless"
# Loading reads the whole file; budget a slow disk (50 MB/s) on top of a fixed two minutes.
START_TIMEOUT_BASE_S = 120
START_TIMEOUT_BYTES_PER_S = 50_000_000


def unit_name(recipe: Recipe) -> str:
    """The systemd service and container name: tensorless-<short name or repo>-<card>."""
    stem = recipe.model.name or recipe.model.hf_repo
    slug = re.sub(r"[^a-z0-9]+", "-", f"{stem}-{recipe.card.id}".lower()).strip("-")
    return f"tensorless-{slug}"


def start_timeout_s(recipe: Recipe) -> int:
    return START_TIMEOUT_BASE_S + recipe.model.size_bytes // START_TIMEOUT_BYTES_PER_S


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
    def health_url(self) -> str:
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}/health"

    @property
    def cdi_devices(self) -> tuple[str, ...]:
        return tuple(f"nvidia.com/gpu={uuid}" for uuid in self.gpu_uuids)

    def engine_run_args(self) -> list[str]:
        """`podman run` / `docker run` options and image and server args (no binary, no 'run')."""
        args = [
            "--name",
            self.name,
            "--network",
            "host",
            "--cap-drop",
            "all",
            "--security-opt",
            "no-new-privileges",
            "--volume",
            f"{self.model_path}:{self.model_mount}:ro",
        ]
        if self.engine == "docker":
            if self.gpu_uuids:
                # docker reads --gpus as one CSV record: several ids need the field quoted
                # ('"device=a,b"'), else "b" is taken as a field of its own and refused.
                devices = "device=" + ",".join(self.gpu_uuids)
                args += ["--gpus", devices if len(self.gpu_uuids) == 1 else f'"{devices}"']
        else:
            for dev in self.cdi_devices:
                args += ["--device", dev]
        for key, value in self.env:
            args += ["--env", f"{key}={value}"]
        for key, value in self.labels:
            args += ["--label", f"{key}={value}"]
        return [*args, self.image, *self.server_args]


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
        (f"{LABEL_PREFIX}.recipe-digest", recipe_digest(recipe)),
        (f"{LABEL_PREFIX}.model", recipe.model.hf_repo),
        (f"{LABEL_PREFIX}.card", recipe.card.id),
        (f"{LABEL_PREFIX}.bind", bind),
        (f"{LABEL_PREFIX}.port", str(port)),
        (f"{LABEL_PREFIX}.tuned", "true" if tune.tuned else "false"),
    )
    return LaunchSpec(
        name=unit_name(recipe),
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
