"""A foreground container on this machine, from the same launch spec a fleet deploy renders:
the image pulled by digest, /health waited for, and one Ctrl-C or SIGTERM stopping and removing
it."""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

from tensorless_deploy import shell
from tensorless_deploy.decisions.device import DeviceVerdict, device_verdict
from tensorless_deploy.decisions.options import api_key_text, pem_text
from tensorless_deploy.facts.device import DEVICE_LINE, parse_device_log
from tensorless_deploy.launch.container import run_argv
from tensorless_deploy.launch.spec import (
    API_KEY_NAME,
    ENGINE_GID,
    TLS_CERT_NAME,
    TLS_KEY_NAME,
    LaunchSpec,
)
from tensorless_deploy.local.fetch import LocalError

HEALTH_POLL_S = 0.05  # /health asked this often while the server starts (a local request)


def engine_bin(engine: str) -> str:
    found = shutil.which(engine)
    if found is None:
        raise LocalError(f"{engine} not found on this machine", fix=f"install {engine}")
    return found


def image_present(engine: str, image: str) -> bool:
    check = ["image", "exists", image] if engine.endswith("podman") else ["image", "inspect", image]
    return subprocess.run([engine, *check], capture_output=True, timeout=60).returncode == 0


def pull_image(engine: str, image: str, *, present: bool | None = None) -> bool:
    """Pull by digest (the engine prints its own progress); False when it was already here.
    present: whether the survey saw the engine hold it (None: not known, the engine is asked).
    Everything the engine prints goes to stderr: podman ends a pull with the image ID on
    stdout, which would land ahead of a command's --json."""
    if present is None:
        present = image_present(engine, image)
    if present:
        return False
    sys.stderr.flush()
    proc = subprocess.run([engine, "pull", image], stdout=2, timeout=3600)  # fd 2: stderr
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


def local_secrets_root() -> str:
    """Where a foreground run stages the operator's key and TLS files for its container: a
    directory only this user can enter (root: /run/tensorless/run, a tmpfs; others: their
    XDG_RUNTIME_DIR, else ~/.cache), removed again when the run ends."""
    if os.geteuid() == 0:
        return "/run/tensorless/run"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = runtime if runtime and os.path.isdir(runtime) else os.path.expanduser("~/.cache")
    return posixpath.join(base, "tensorless", "run")


_READERS: dict[str, Callable[[str], str]] = {
    API_KEY_NAME: api_key_text,
    TLS_CERT_NAME: lambda p: pem_text(p, "certificate"),
    TLS_KEY_NAME: lambda p: pem_text(p, "private key"),
}


@contextlib.contextmanager
def staged_secrets(spec: LaunchSpec, sources: Sequence[tuple[str, str]]) -> Iterator[None]:
    """The spec's secret files, copied from the operator's (sources: name -> path here) into
    the unit's private directory for the container's read-only mounts, and removed after. As
    root each copy is root:10001 0440 (the engine's group reads it); as another user (rootless
    podman maps the container's users elsewhere) 0444, in a 0700 directory of this user's:
    only the container, through its file mount, can reach it."""
    if not spec.secrets:
        yield
        return
    where = posixpath.dirname(spec.secrets[0].host_path)
    root = posixpath.dirname(where)
    old = os.umask(0o077)
    try:
        for d in (root, where):
            os.makedirs(d, mode=0o700, exist_ok=True)
            os.chmod(d, 0o700)
        by_name = dict(sources)
        for secret in spec.secrets:
            try:
                content = _READERS[secret.name](by_name[secret.name])
            except (KeyError, ValueError) as exc:
                raise LocalError(f"{secret.name}: {exc}") from None
            fd, tmp = tempfile.mkstemp(dir=where, prefix=".secret.")
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(content)
            if os.geteuid() == 0:
                os.chown(tmp, 0, ENGINE_GID)
                os.chmod(tmp, 0o440)
            else:
                os.chmod(tmp, 0o444)
            os.replace(tmp, secret.host_path)
    except OSError as exc:
        shutil.rmtree(where, ignore_errors=True)
        raise LocalError(
            f"cannot stage the secrets in {where}: {exc.strerror or exc}",
            fix="run as root, or as a user with a writable XDG_RUNTIME_DIR",
        ) from None
    finally:
        os.umask(old)
    try:
        yield
    finally:
        shutil.rmtree(where, ignore_errors=True)


def health_status(url: str) -> int:
    """/health's status (0: no answer). https: the server's own loopback, unverified (the
    certificate names the host, not 127.0.0.1; nothing secret is sent)."""
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=shell.HEALTH_TIMEOUT_S, context=context) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


def device_report(spec: LaunchSpec, engine: str, *, tries: int = 4) -> DeviceVerdict:
    """What the running container's start log says it runs on (``ENGINE logs``, its device
    lines), judged by the spec's device (decisions.device); read again for a few seconds until
    it tells where the layers went, as the engine's log may trail the health answer."""
    pattern = re.compile(DEVICE_LINE)
    uuid = spec.gpu_uuids[0] if spec.gpu_uuids else None
    verdict = device_verdict(spec.device, parse_device_log(()), uuid)
    for attempt in range(tries):
        proc = subprocess.run(
            [engine, "logs", spec.name], capture_output=True, text=True, timeout=60
        )
        lines = [x for x in (proc.stdout + proc.stderr).splitlines() if pattern.search(x)]
        report = parse_device_log(lines)
        verdict = device_verdict(spec.device, report, uuid)
        if verdict.ok or report.offloaded is not None or attempt == tries - 1:
            break
        time.sleep(1)
    return verdict


def run_foreground(
    spec: LaunchSpec,
    engine: str,
    *,
    on_healthy: Callable[[float, str], None],
    sources: Sequence[tuple[str, str]] = (),
) -> int:
    """Start the container in the foreground, wait for /health (503 and a refused connection
    mean loading), check that its own start log shows it on its device (else stop it and
    refuse: not on its card), report, and on Ctrl-C or SIGTERM stop and remove it; one signal
    is enough. sources: the operator's key and TLS files (name, path here), staged for the run
    only."""
    with staged_secrets(spec, sources):
        return _run_foreground(spec, engine, on_healthy)


def _run_foreground(spec: LaunchSpec, engine: str, on_healthy: Callable[[float, str], None]) -> int:
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
                took = time.monotonic() - t0
                where = device_report(spec, engine)
                if not where.ok:
                    stop(signal.SIGTERM, None)
                    raise LocalError(
                        f"{spec.name} answers /health after {took:.1f} s, but is not on its "
                        f"card ({spec.device}): {where.why}",
                        fix="see the server's start log above (its device lines); stopped",
                    )
                on_healthy(took, where.device)
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
