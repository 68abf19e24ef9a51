"""deploy --transfer push: the controller fetches the model and the image once and sends them to
hosts that cannot reach the Hub or the registry, over the SSH connections pyinfra already holds.

A send resumes from what the host already has (its partial file's size), every byte read from
the controller's disk once per run however many hosts take it, and the host verifies on arrival
(sha256 for the model, the manifest digest for the image) before anything is renamed or used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.fleet.connect import host_fact
from tensorless_deploy.hostplan.plan import HostPlan
from tensorless_deploy.hub import controller_state_dir

CHUNK = 1 << 20
REMOTE_IMAGES = "/var/lib/tensorless/transfer"


class TransferError(TensorlessError):
    """The controller could not fetch what it is to push."""


def image_archive(image: str) -> Path:
    """The image as an OCI archive that keeps its manifest digest (skopeo --preserve-digests),
    made once per digest on the controller."""
    digest = image.rpartition("@")[2]
    out = Path(controller_state_dir()) / "images" / f"{digest.replace(':', '-')}.oci.tar"
    if out.is_file():
        return out
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise TransferError(
            "pushing an image needs skopeo on the controller", fix="sudo apt install skopeo"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.unlink(missing_ok=True)
    conf = os.environ.get("CONTAINERS_REGISTRIES_CONF")
    # older skopeo (Debian 12's 1.9) reads only the flag, newer ones the variable as well
    flags = ["--registries-conf", conf] if conf else []
    proc = subprocess.run(
        [
            skopeo,
            *flags,
            "copy",
            "--quiet",
            "--preserve-digests",
            f"docker://{image}",
            f"oci-archive:{tmp}",
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise TransferError(
            f"skopeo copy {image}: {proc.stderr.strip()[-300:]}",
            fix="check the registry is reachable from the controller",
        )
    os.replace(tmp, out)
    return out


def remote_image_path(image: str) -> str:
    return f"{REMOTE_IMAGES}/{image.rpartition('@')[2].replace(':', '-')}.oci.tar"


@dataclass
class Receiver:
    """One host taking one file: where it goes, and how much it already has."""

    host: str
    sftp: Any  # paramiko SFTPClient
    path: str  # the remote partial file
    offset: int = 0
    sent: int = 0
    error: str | None = None


def _remote_size(sftp: Any, path: str) -> int:
    try:
        return int(sftp.stat(path).st_size)
    except OSError:
        return 0


def open_receivers(hosts: Sequence[tuple[str, Any, str]], size: int) -> list[Receiver]:
    """An SFTP session per (name, host, remote path), on pyinfra's own SSH connection, resuming
    at the size the host already has."""
    out = []
    for name, host, path in hosts:
        sftp = host.connector.client.open_sftp()
        directory = path.rsplit("/", 1)[0]
        _mkdirs(sftp, directory)
        have = _remote_size(sftp, path)
        if have > size:  # a partial longer than the file is not ours to trust
            sftp.remove(path)
            have = 0
        out.append(Receiver(name, sftp, path, have))
    return out


def _mkdirs(sftp: Any, directory: str) -> None:
    parts = [p for p in directory.split("/") if p]
    cur = ""
    for part in parts:
        cur += "/" + part
        try:
            sftp.stat(cur)
        except OSError:
            sftp.mkdir(cur, 0o755)


def broadcast(source: Path, receivers: Sequence[Receiver]) -> None:
    """Send source to every receiver from its own offset, reading each byte of source once:
    one pass from the smallest offset, each chunk appended where the host has reached it."""
    live = [r for r in receivers if r.offset < source.stat().st_size]
    if not live:
        return
    files = {}
    for r in live:
        f = r.sftp.open(r.path, "ab")
        f.set_pipelined(True)
        files[r.host] = f
    try:
        with source.open("rb") as src:
            pos = min(r.offset for r in live)
            src.seek(pos)
            while True:
                block = src.read(CHUNK)
                if not block:
                    break
                end = pos + len(block)
                for r in live:
                    if r.error is not None or r.offset >= end:
                        continue
                    start = r.offset - pos  # > 0 only for the first block a host takes
                    try:
                        files[r.host].write(block[start:])
                    except OSError as exc:  # this host stops; the others go on
                        r.error = f"push to {r.host} stopped at {r.offset} bytes: {exc}"
                        continue
                    r.sent += len(block) - start
                    r.offset = end
                pos = end
    finally:
        for f in files.values():
            with contextlib.suppress(OSError):  # a host that failed mid-send already says so
                f.close()
        for r in receivers:
            r.sftp.close()


def _registry(image: str) -> str:
    first = image.split("/", 1)[0]
    return first if ("." in first or ":" in first or first == "localhost") else "docker.io"


def choose_transfer(
    state: Any, by_name: dict[str, Any], plans: dict[str, HostPlan], mode: str
) -> dict[str, tuple[str, str]]:
    """pull or push per host, and why. auto: a cheap check from the host itself (HEAD of the
    model URL, GET of the registry's /v2/): push where either cannot be reached."""
    from tensorless_deploy.facts.pyinfra import HttpStatus

    out: dict[str, tuple[str, str]] = {}
    for name, plan in plans.items():
        if mode != "auto":
            out[name] = (mode, f"--transfer {mode}")
            continue
        assert plan.recipe is not None and plan.url is not None
        h = by_name[name]
        model = host_fact(state, h, HttpStatus, url=plan.url, head=True)
        reg = _registry(plan.recipe.engine.image)
        registry = max(
            host_fact(state, h, HttpStatus, url=f"{scheme}://{reg}/v2/")
            for scheme in ("https", "http")
        )
        if model and registry:
            out[name] = ("pull", "the host reaches the model server and the registry")
        else:
            gone = [
                what for what, code in (("model server", model), ("registry", registry)) if not code
            ]
            out[name] = ("push", f"the host cannot reach the {' or the '.join(gone)}")
    return out


def push(
    state: Any,
    by_name: dict[str, Any],
    plans: dict[str, HostPlan],
    token: str | None,
) -> tuple[dict[str, str], dict[str, str]]:
    """Fetch model and image once on the controller, send them to every host that lacks them
    (resuming partial files, each byte read once). Returns the hosts that failed, with why, and
    what was sent to each host."""
    from tensorless_deploy.facts.pyinfra import ImagePresent, ModelBlob
    from tensorless_deploy.hub import cache_dir
    from tensorless_deploy.local.fetch import LocalError, fetch_model

    failed: dict[str, str] = {}
    sent: dict[str, list[str]] = {}
    for sha in {p.recipe.model.sha256 for p in plans.values() if p.recipe is not None}:
        group = {n: p for n, p in plans.items() if p.recipe and p.recipe.model.sha256 == sha}
        recipe = next(iter(group.values())).recipe
        assert recipe is not None
        needs_model = []
        needs_image = []
        for n, p in group.items():
            assert p.paths is not None and p.engine_bin is not None
            blob = host_fact(
                state,
                by_name[n],
                ModelBlob,
                blob=p.paths.blob,
                stamp=p.paths.stamp,
                snapshot=p.paths.snapshot,
            )
            if not blob.exists:
                needs_model.append(n)
            if not host_fact(
                state, by_name[n], ImagePresent, engine_bin=p.engine_bin, image=recipe.engine.image
            ):
                needs_image.append(n)
        try:
            if needs_model:
                blob_path, _ = fetch_model(recipe, cache_dir(), token=token)
                targets = [(n, by_name[n], _partial(group[n])) for n in needs_model]
                _send("model", blob_path, targets, failed, sent)
            if needs_image:
                archive = image_archive(recipe.engine.image)
                remote = remote_image_path(recipe.engine.image)
                targets = [(n, by_name[n], remote) for n in needs_image]
                _send("image", archive, targets, failed, sent)
        except (LocalError, TransferError) as exc:
            failed.update({n: f"push: {exc.message}" for n in group})
    return failed, {n: "; ".join(parts) for n, parts in sent.items()}


def _partial(plan: HostPlan) -> str:
    assert plan.paths is not None
    return plan.paths.partial


def _send(
    what: str,
    source: Path,
    targets: list[tuple[str, Any, str]],
    failed: dict[str, str],
    sent: dict[str, list[str]],
) -> None:
    """One file to several hosts, each resuming from its partial; what went where is noted."""
    receivers = open_receivers(targets, source.stat().st_size)
    starts = {r.host: r.offset for r in receivers}
    broadcast(source, receivers)
    failed.update({r.host: r.error for r in receivers if r.error})
    for r in receivers:
        sent.setdefault(r.host, []).append(
            f"{what}: sent {r.sent} bytes (resumed from {starts[r.host]})"
        )
