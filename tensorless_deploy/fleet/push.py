"""deploy --transfer push: the controller fetches the model and the image once and sends them to
hosts that cannot reach the Hub or the registry, over the SSH connections pyinfra already holds.

Each host gets its own writer (a thread: paramiko blocks the thread that sends, so one host with
a full SSH window must not stall the others), streaming the file into one SSH channel that runs
``operations/scripts/model-receive.sh``: the host says how much of the file it already has, the
writer sends the rest from that offset, and the host appends it, hashing the bytes as they
arrive (the prefix an earlier run left is hashed first) and never taking more than the file's
size. The sha256 it leaves beside the partial spares the model step a second read; the image is
verified by its manifest digest when it is loaded.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.fleet.channel import host_command, ssh_transport
from tensorless_deploy.fleet.connect import host_fact, in_step, on_each_host
from tensorless_deploy.hostplan.plan import HostPlan
from tensorless_deploy.hub import controller_state_dir

if TYPE_CHECKING:
    from tensorless_deploy.recipe.schema import Recipe

CHUNK = 4 << 20  # one read and one channel write per 4 MiB
WINDOW = 64 << 20  # the SSH channel's receive window the host grants: a writer never waits on it
PACKET = 256 << 10  # the largest SSH packet asked for (the server may cap it lower)
REMOTE_IMAGES = "/var/lib/tensorless/transfer"
Missing = dict[str, "tuple[bool, bool] | None"]  # host -> (model missing, image missing); None: ?
Token = Callable[[], "str | None"]


# What a transfer reports while it runs: (host, what, bytes there, bytes in all); nothing in
# it is decided on, it is only shown (the CLI draws it on a terminal).
Progress = Callable[[str, str, int, int], None]
PROGRESS_EVERY_S = 0.5


class TransferError(TensorlessError):
    """The controller could not fetch what it is to push."""


@dataclass(frozen=True)
class Source:
    """Where a push takes its bytes from instead of the Hub and the registry: the verified
    files of an offline bundle (fleet.bundle): the GGUF of sha256, the archive of image_ref."""

    sha256: str
    model: Path
    image_ref: str
    image: Path


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
        fix = "check the registry is reachable from the controller"
        if "HTTP response to HTTPS client" in proc.stderr:
            where = conf or "/etc/containers/registries.conf"
            fix = (
                f"the registry {_registry(image)} speaks plain HTTP: mark it insecure in "
                f'registries.conf ({where}): [[registry]] location = "{_registry(image)}" '
                "insecure = true"
            )
        raise TransferError(f"skopeo copy {image}: {proc.stderr.strip()[-300:]}", fix=fix)
    os.replace(tmp, out)
    return out


def remote_image_path(image: str) -> str:
    return f"{REMOTE_IMAGES}/{image.rpartition('@')[2].replace(':', '-')}.oci.tar"


@dataclass
class Receiver:
    """One host taking one file: where it goes, how much it had, what was sent, and how long
    the send took (seconds from the channel's start to the host's last word)."""

    host: str
    remote: Any  # the pyinfra Host
    path: str  # the remote partial file
    offset: int = 0
    sent: int = 0
    seconds: float = 0.0
    error: str | None = None
    said: list[str] = field(default_factory=list)


def receive_command(state: Any, host: Any, partial: str, size: int, lock: str = "") -> str:
    """The host side of one send (model-receive.sh bound), wrapped as pyinfra wraps every
    command for this host (sudo and su from its inventory data). lock: the flock of the file's
    writers (a model's: hub.CachePaths.lock; default: beside the partial)."""
    from tensorless_deploy.operations._run import script

    cmd = script("model-receive", partial=partial, size=size, lock=lock or f"{partial}.lock")
    return host_command(state, host, cmd)


def send_one(source: Path, receiver: Receiver, command: str, chunk: int = CHUNK) -> None:
    """Stream source into one host from the offset it reports, on its own SSH channel."""
    t0 = time.monotonic()
    transport = ssh_transport(receiver.remote)
    channel = transport.open_session(window_size=WINDOW, max_packet_size=PACKET)
    try:
        channel.exec_command(command)
        out = channel.makefile("rb")
        first = out.readline().decode(errors="replace").strip()
        word, _, value = first.partition(" ")
        if word != "have" or not value.isdigit():
            err = channel.makefile_stderr("rb").read().decode(errors="replace").strip()
            receiver.error = f"push to {receiver.host}: the host did not start: {err or first}"
            return
        receiver.offset = int(value)
        with source.open("rb") as src:
            src.seek(receiver.offset)
            while block := src.read(chunk):
                channel.sendall(block)
                receiver.sent += len(block)
        channel.shutdown_write()
        rest = out.read().decode(errors="replace")
        err = channel.makefile_stderr("rb").read().decode(errors="replace")
        code = channel.recv_exit_status()
        receiver.said = [line for line in (rest + err).splitlines() if line]
        if code != 0:
            why = "; ".join(receiver.said) or f"exit {code}"
            receiver.error = f"push to {receiver.host} stopped: {why}"
    except (OSError, EOFError) as exc:  # this host stops; the others go on
        where = receiver.offset + receiver.sent
        receiver.error = f"push to {receiver.host} stopped at {where} bytes: {exc}"
    finally:
        channel.close()
        receiver.seconds = time.monotonic() - t0


def fan_out(
    source: Path,
    receivers: Sequence[Receiver],
    commands: Sequence[str],
    progress: Progress | None = None,
    what: str = "file",
) -> None:
    """One writer thread per host, each reading source at its own offset (the page cache serves
    all but the first read of a block), none waiting for another; with progress, each host's
    bytes there are reported every PROGRESS_EVERY_S while they run, and once at the end."""
    threads = [
        threading.Thread(target=send_one, args=(source, r, c), daemon=True)
        for r, c in zip(receivers, commands, strict=True)
    ]
    for t in threads:
        t.start()
    total = source.stat().st_size if progress else 0
    while progress and any(t.is_alive() for t in threads):
        for r in receivers:
            progress(r.host, what, r.offset + r.sent, total)
        for t in threads:
            t.join(PROGRESS_EVERY_S / len(threads))
    for t in threads:
        t.join()
    if progress:
        for r in receivers:
            progress(r.host, what, r.offset + r.sent, total)


def _registry(image: str) -> str:
    first = image.split("/", 1)[0]
    return first if ("." in first or ":" in first or first == "localhost") else "docker.io"


def choose_transfer(
    state: Any,
    by_name: dict[str, Any],
    plans: dict[str, HostPlan],
    mode: str,
    missing: Missing | None = None,
) -> dict[str, tuple[str, str]]:
    """pull or push per host, and why. auto: a cheap check from the host itself (HEAD of the
    model URL, GET of the registry's /v2/), only of what the host lacks (the survey says; a
    host it says nothing of is checked for both), all hosts at once: push where either cannot
    be reached; a host that lacks nothing pulls nothing."""
    from tensorless_deploy.facts.pyinfra import HttpStatus

    missing = missing or {}
    out: dict[str, tuple[str, str]] = {}
    probe: dict[str, tuple[bool, bool]] = {}
    for name in plans:
        need = missing.get(name)
        if mode != "auto":
            out[name] = (mode, f"--transfer {mode}")
        elif need is not None and not any(need):
            out[name] = ("pull", "nothing to fetch: the model and the image are there")
        else:
            probe[name] = need or (True, True)

    def check(host: Any) -> tuple[int, int]:
        plan = plans[host.name]
        assert plan.recipe is not None and plan.url is not None
        model_missing, image_missing = probe[host.name]
        model = host_fact(state, host, HttpStatus, url=plan.url, head=True) if model_missing else 1
        registry = 1
        if image_missing:
            reg = _registry(plan.recipe.engine.image)
            registry = host_fact(state, host, HttpStatus, url=f"https://{reg}/v2/")
            if not registry:
                registry = host_fact(state, host, HttpStatus, url=f"http://{reg}/v2/")
        return int(model), int(registry)

    hosts = [by_name[n] for n in probe]
    codes = (
        on_each_host(state, hosts, check, keep_connected=True, access="checked") if hosts else []
    )
    for host, code in zip(hosts, codes, strict=True):
        if isinstance(code, str):  # the probe itself failed: pushing needs the same connection
            out[host.name] = ("push", f"the reachability check failed: {code}")
            continue
        model, registry = code
        if model and registry:
            out[host.name] = ("pull", "the host reaches the model server and the registry")
        else:
            gone = [what for what, c in (("model server", model), ("registry", registry)) if not c]
            out[host.name] = ("push", f"the host cannot reach the {' or the '.join(gone)}")
    return {n: out[n] for n in plans}


def needs_of(
    state: Any, by_name: dict[str, Any], group: dict[str, HostPlan], missing: Missing
) -> dict[str, tuple[bool, bool]]:
    """(model missing, image missing) per host: the survey's word, else its facts (read on all
    the hosts it says nothing of at once)."""
    from tensorless_deploy.facts.pyinfra import ImagePresent, ModelBlob

    out = {n: need for n in group if (need := missing.get(n)) is not None}
    unknown = [by_name[n] for n in group if n not in out]

    def read(host: Any) -> tuple[bool, bool]:
        p = group[host.name]
        assert p.paths is not None and p.engine_bin is not None and p.recipe is not None
        blob = host_fact(
            state,
            host,
            ModelBlob,
            blob=p.paths.blob,
            stamp=p.paths.stamp,
            snapshot=p.paths.snapshot,
        )
        held = host_fact(
            state, host, ImagePresent, engine_bin=p.engine_bin, image=p.recipe.engine.image
        )
        return (not ModelBlob.typed(blob).exists, not held)

    read_back = (
        on_each_host(state, unknown, read, keep_connected=True, access="checked") if unknown else []
    )
    for host, r in zip(unknown, read_back, strict=True):
        out[host.name] = (True, True) if isinstance(r, str) else r
    return out


@dataclass
class PushReport:
    """What a push did: per host the error (if any) and what was sent; per file the phases."""

    failed: dict[str, str] = field(default_factory=dict)
    sent: dict[str, list[str]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # "fetch model", "send image"...


def push(
    state: Any,
    by_name: dict[str, Any],
    plans: dict[str, HostPlan],
    token: Token | str | None,
    missing: Missing | None = None,
    progress: Progress | None = None,
    source: Source | None = None,
    relay: bool = False,
    held: dict[str, HostPlan] | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """Fetch model and image once on the controller (or take them from source), send them to
    every host that lacks them (resuming partial files, each host at its own pace). relay
    (every host), or a host's own tensorless_relay: it gets them from a host that holds them
    verified (held: the run's hosts whose cache holds the model already; the controller sends
    only while none does), fleet.relay. Returns the hosts that failed, with why, and what was
    sent to each host."""
    report = push_report(state, by_name, plans, token, missing, progress, source, relay, held)
    return report.failed, {n: "; ".join(parts) for n, parts in report.sent.items()}


def push_report(
    state: Any,
    by_name: dict[str, Any],
    plans: dict[str, HostPlan],
    token: Token | str | None,
    missing: Missing | None = None,
    progress: Progress | None = None,
    source: Source | None = None,
    relay: bool = False,
    held: dict[str, HostPlan] | None = None,
) -> PushReport:
    from tensorless_deploy.local.fetch import LocalError

    report = PushReport()
    for sha in {p.recipe.model.sha256 for p in plans.values() if p.recipe is not None}:
        group = {n: p for n, p in plans.items() if p.recipe and p.recipe.model.sha256 == sha}
        recipe = next(iter(group.values())).recipe
        assert recipe is not None
        needs = needs_of(state, by_name, group, missing or {})
        needs_model = [n for n in group if needs[n][0]]
        needs_image = [n for n in group if needs[n][1]]
        try:
            if needs_model:
                _push_model(
                    state, by_name, group, needs_model, report, progress,
                    functools.partial(_model_file, recipe, source, token, progress),
                    relay, held or {},
                )  # fmt: skip
            if needs_image:
                t0 = time.monotonic()
                archive = _image_file(recipe.engine.image, source)
                report.seconds["fetch image"] = time.monotonic() - t0
                remote = remote_image_path(recipe.engine.image)
                size = archive.stat().st_size
                relayed = _relayed(needs_image, group, relay)
                parts: list[tuple[list[str], str | None]] = [
                    ([n for n in needs_image if n not in relayed], None),
                    (relayed, file_sha256(archive) if relayed else None),
                ]
                for names, digest in parts:
                    if names:
                        targets = [(n, remote, size, "") for n in names]
                        _send(state, by_name, "image", archive, targets, report, progress, digest)
        except (LocalError, TransferError) as exc:
            why = f"push: {exc.message}" + (f" (fix: {exc.fix})" if exc.fix else "")
            report.failed.update({n: why for n in group})
    return report


def _push_model(
    state: Any,
    by_name: dict[str, Any],
    group: dict[str, HostPlan],
    needs_model: list[str],
    report: PushReport,
    progress: Progress | None,
    model_file: Callable[[], Path],
    relay: bool,
    held: dict[str, HostPlan],
) -> None:
    """The model to the hosts that lack it: straight from the controller, or (relay, or a
    host's own tensorless_relay) from the run's hosts that hold it verified, the controller's
    copy fetched only if it has to send."""
    recipe = group[needs_model[0]].recipe
    assert recipe is not None

    got: list[Path] = []

    def fetch() -> Path:  # once, whoever asks first
        if not got:
            t0 = time.monotonic()
            got.append(model_file())
            report.seconds["fetch model"] = time.monotonic() - t0
        return got[0]

    def targets(names: list[str]) -> list[tuple[str, str, int, str]]:
        size = recipe.model.size_bytes
        return [(n, _partial(group[n]), size, _lock(group[n])) for n in names]

    relayed = _relayed(needs_model, group, relay)
    direct = [n for n in needs_model if n not in relayed]
    if direct:
        _send(state, by_name, "model", fetch(), targets(direct), report, progress)
    if relayed:
        holders = holders_of(held, recipe.model.sha256, needs_model)
        lazy = fetch if holders else fetch()
        sha = recipe.model.sha256
        _send(state, by_name, "model", lazy, targets(relayed), report, progress, sha, holders)


def _relayed(names: list[str], group: dict[str, HostPlan], relay: bool) -> list[str]:
    """The hosts that get a file through the relay: all with relay, else those whose own
    options ask for it (tensorless_relay)."""
    return [n for n in names if relay or group[n].options.relay]


def holders_of(
    held: dict[str, HostPlan], sha256: str, needing: Sequence[str]
) -> dict[str, tuple[str, str]]:
    """The run's hosts whose cache holds this model verified: host -> (blob, stamp)."""
    return {
        n: (p.paths.blob, p.paths.stamp)
        for n, p in sorted(held.items())
        if n not in needing
        and p.recipe is not None
        and p.recipe.model.sha256 == sha256
        and p.paths is not None
    }


def _model_file(
    recipe: Recipe, source: Source | None, token: Token | str | None, progress: Progress | None
) -> Path:
    """The GGUF to send: the source's where it holds this model, else this machine's Hub
    cache's (fetched once, or found verified)."""
    from tensorless_deploy.hub import cache_dir
    from tensorless_deploy.local.fetch import fetch_model

    if source is not None and source.sha256 == recipe.model.sha256:
        return source.model
    fetched = _on_controller(progress, "fetch model")
    return fetch_model(recipe, cache_dir(), token=token, progress=fetched).blob


def _image_file(image: str, source: Source | None) -> Path:
    """The image archive to send: the source's where it holds this image, else saved here."""
    if source is not None and source.image_ref == image:
        return source.image
    return image_archive(image)


def _on_controller(progress: Progress | None, what: str) -> Callable[[int, int], None] | None:
    """fetch_model's (done, total) progress as this machine's row of the transfer's."""
    return None if progress is None else functools.partial(progress, "controller", what)


class DownloadWatch:
    """While hosts download a model themselves, how many bytes each has, read every
    PROGRESS_EVERY_S on a channel of its own SSH connection (`stat` of the partial file, then
    of the blob it is renamed to): shown, never decided on; a host it cannot read is left out."""

    def __init__(
        self,
        by_name: dict[str, Any],
        files: dict[str, tuple[str, str, int]],
        progress: Progress | None,
    ) -> None:
        self.by_name, self.files, self.progress = by_name, files, progress
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DownloadWatch:
        if self.files and self.progress is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()

    def _size(self, host: Any, partial: str, blob: str) -> int | None:
        import shlex

        transport = ssh_transport(host)
        if transport is None or not transport.is_active():
            return None
        p, b = shlex.quote(partial), shlex.quote(blob)
        channel = transport.open_session()
        try:
            channel.settimeout(5)
            channel.exec_command(f"stat -c %s {p} 2>/dev/null || stat -c %s {b} 2>/dev/null")
            text = channel.makefile("rb").read().decode(errors="replace").strip()
        except (OSError, EOFError):
            return None
        finally:
            channel.close()
        return int(text) if text.isdigit() else None

    def _run(self) -> None:
        assert self.progress is not None
        while not self.done.wait(PROGRESS_EVERY_S):
            for name, (partial, blob, total) in self.files.items():
                if self.done.is_set():
                    return
                size = self._size(self.by_name[name], partial, blob)
                if size is not None:
                    self.progress(name, "download model", min(size, total), total)


def _partial(plan: HostPlan) -> str:
    assert plan.paths is not None
    return plan.paths.partial


def _lock(plan: HostPlan) -> str:
    assert plan.paths is not None
    return plan.paths.lock


def _send(
    state: Any,
    by_name: dict[str, Any],
    what: str,
    source: Path | Callable[[], Path],
    targets: list[tuple[str, str, int, str]],
    report: PushReport,
    progress: Progress | None = None,
    relay_sha: str | None = None,
    holders: dict[str, tuple[str, str]] | None = None,
) -> None:
    """One file to several hosts at once, each resuming from its partial and taking at most
    the file's size (the model's size_bytes); what went where is noted. relay_sha: the file's
    sha256, and it goes from the holders (host -> its verified blob and stamp), else to one
    host that passes it on (fleet.relay); source may then be how to fetch it, when needed."""
    live = [(n, p, s, k) for n, p, s, k in targets if n not in report.failed]
    for n, _, _, _ in live:
        in_step(state, by_name[n], f"the push of the {what}")
    if relay_sha is not None:
        _relay(state, by_name, what, source, live, report, progress, relay_sha, holders or {})
        return
    assert isinstance(source, Path)
    receivers = [Receiver(n, by_name[n], p) for n, p, _, _ in live]
    commands = [receive_command(state, by_name[n], p, s, k) for n, p, s, k in live]
    t0 = time.monotonic()
    fan_out(source, receivers, commands, progress, f"push {what}")
    report.seconds[f"send {what}"] = time.monotonic() - t0
    for r in receivers:
        if r.error:
            report.failed[r.host] = r.error
        report.sent.setdefault(r.host, []).append(
            f"{what}: sent {r.sent} bytes (resumed from {r.offset}) in {r.seconds:.2f} s"
        )


def file_sha256(path: Path) -> str:
    """A file's sha256, read in CHUNKs (the relay's sender check, the bundle's parts)."""
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _relay(
    state: Any,
    by_name: dict[str, Any],
    what: str,
    source: Path | Callable[[], Path],
    live: list[tuple[str, str, int, str]],
    report: PushReport,
    progress: Progress | None,
    sha: str,
    holders: dict[str, tuple[str, str]],
) -> None:
    """_send through fleet.relay: every hop noted on its receiver, a failed one as its line."""
    from tensorless_deploy.fleet.relay import Copy, relay

    if not live:
        return
    size = live[0][2]
    copy = Copy(
        what,
        source,
        sha,
        size,
        {n: p for n, p, _, _ in live},
        {n: k for n, _, _, k in live},
        held=holders,
    )
    t0 = time.monotonic()
    receivers = [n for n, _, _, _ in live]
    done = relay(state, by_name, copy, receivers, holders=list(holders), progress=progress)
    report.seconds[f"send {what}"] = time.monotonic() - t0
    report.seconds[f"controller bytes {what}"] = float(done.controller_bytes)
    for hop in done.hops:
        report.sent.setdefault(hop.receiver, []).append(
            f"{what}: from {hop.sender}, sent {hop.sent} bytes (resumed from {hop.offset}) "
            f"in {hop.seconds:.2f} s" + (f", then {hop.kind}" if hop.kind != "ok" else "")
        )
    for name, hop in done.failed.items():
        report.failed[name] = hop.line
