"""A foreground container on this machine, from the same launch spec a fleet deploy renders:
the image pulled by digest, /health waited for, and one Ctrl-C or SIGTERM stopping and removing
it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from types import FrameType

from tensorless_deploy.launch.container import run_argv
from tensorless_deploy.launch.spec import LaunchSpec
from tensorless_deploy.local.fetch import LocalError

HEALTH_POLL_S = 0.1


def engine_bin(engine: str) -> str:
    found = shutil.which(engine)
    if found is None:
        raise LocalError(f"{engine} not found on this machine", fix=f"install {engine}")
    return found


def image_present(engine: str, image: str) -> bool:
    check = ["image", "exists", image] if engine.endswith("podman") else ["image", "inspect", image]
    return subprocess.run([engine, *check], capture_output=True, timeout=60).returncode == 0


def pull_image(engine: str, image: str) -> bool:
    """Pull by digest (the engine prints its own progress); False when it was already here."""
    if image_present(engine, image):
        return False
    proc = subprocess.run([engine, "pull", image], timeout=3600)
    if proc.returncode != 0:
        raise LocalError(
            f"{engine} pull {image} failed (exit {proc.returncode})",
            fix="check the registry is reachable and the digest exists",
        )
    return True


def container_argv(spec: LaunchSpec, engine: str) -> list[str]:
    """The exact foreground command: the plain unit's ExecStart without the engine's own health
    check (this process polls /health itself)."""
    return run_argv(spec, engine, health=False)


def health_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


def run_foreground(spec: LaunchSpec, engine: str, *, on_healthy: Callable[[float], None]) -> int:
    """Start the container in the foreground, wait for /health (503 and a refused connection
    mean loading), report, and on Ctrl-C or SIGTERM stop and remove it; one signal is enough."""
    proc = subprocess.Popen(container_argv(spec, engine), start_new_session=True)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        subprocess.run([engine, "stop", "-t", "10", spec.name], capture_output=True, timeout=60)

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        t0 = time.monotonic()
        deadline = t0 + spec.start_timeout_s
        while proc.poll() is None and not stopping:
            if health_status(spec.health_url) == 200:
                on_healthy(time.monotonic() - t0)
                break
            if time.monotonic() > deadline:
                stop(signal.SIGTERM, None)
                raise LocalError(
                    f"{spec.name} not healthy within {spec.start_timeout_s} s",
                    fix="see the server's output above",
                )
            time.sleep(HEALTH_POLL_S)
        rc = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if proc.poll() is None:
            proc.kill()
        subprocess.run([engine, "rm", "-f", spec.name], capture_output=True, timeout=60)
    return 0 if stopping else rc
