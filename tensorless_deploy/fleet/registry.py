"""An engine image as its registry publishes it, read from this machine before any host pulls it:
its config's labels (``io.tensorless.engine.*`` say what device code it holds) and, for an image
without those labels, the CUDA code in the fatbins of its layers' ``libggml-cuda`` (the parser of
facts.fatbin). The OCI distribution API over HTTP (anonymous bearer tokens, as ``podman pull``
gets them); a registry marked ``insecure`` in the registries configuration podman and skopeo read
here is spoken to over plain HTTP. Each digest is read once: the answer is kept under the
controller's state directory (a digest's bytes never change). Every request is bounded."""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tensorless_deploy.facts.fatbin import entries as fatbin_entries
from tensorless_deploy.facts.survey import PROBE_TIMEOUT_S
from tensorless_deploy.facts.values import EngineImage
from tensorless_deploy.hub import controller_state_dir

ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)
CUDA_LABEL = "io.tensorless.engine.cuda-architectures"
CUDA_LIB = re.compile(r"(^|/)libggml-cuda\.so(\.[0-9.]+)?$")
MAX_LIB_BYTES = 2 << 30  # the largest libggml-cuda read into memory (a many-arch build: ~0.5 GiB)
DOCKER_HUB = "registry-1.docker.io"


class RegistryError(Exception):
    pass


def _split(image: str) -> tuple[str, str, str]:
    """(registry, repository, digest) of name@sha256:..., with Docker Hub's defaults."""
    name, at, digest = image.partition("@")
    if not at or not digest.startswith("sha256:"):
        raise RegistryError(f"{image}: not pinned by digest")
    first, slash, rest = name.partition("/")
    if slash and first == "docker.io":
        return DOCKER_HUB, rest if "/" in rest else f"library/{rest}", digest
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first, rest, digest
    return DOCKER_HUB, name if slash else f"library/{name}", digest


def _conf_files() -> list[Path]:
    named = os.environ.get("CONTAINERS_REGISTRIES_CONF")
    if named:
        return [Path(named)]
    files = [Path("/etc/containers/registries.conf")]
    files += sorted(Path("/etc/containers/registries.conf.d").glob("*.conf"))
    files.append(Path.home() / ".config/containers/registries.conf")
    return [f for f in files if f.is_file()]


def insecure_registries(files: Iterable[Path] | None = None) -> set[str]:
    """The locations marked ``insecure = true`` in registries.conf (v2, TOML)."""
    if sys.version_info >= (3, 11):
        import tomllib as toml
    else:  # pragma: no cover - exercised on 3.10 controllers
        import tomli as toml
    out: set[str] = set()
    for path in _conf_files() if files is None else files:
        try:
            data = toml.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for reg in data.get("registry", []) or []:
            if isinstance(reg, Mapping) and reg.get("insecure") is True:
                where = reg.get("location") or reg.get("prefix")
                if isinstance(where, str):
                    out.add(where.rstrip("/"))
    return out


class _Client:
    """GETs against one registry repository, with the bearer token the registry asks for."""

    def __init__(self, registry: str, repo: str, plain_http: bool, timeout: float) -> None:
        self.base = f"{'http' if plain_http else 'https'}://{registry}/v2/{repo}"
        self.repo = repo
        self.timeout = timeout
        self.token: str | None = None

    def _open(self, url: str, accept: str | None) -> Any:
        headers = {"User-Agent": "tensorless-deploy"}
        if accept:
            headers["Accept"] = accept
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=self.timeout
        )

    def _login(self, challenge: str) -> None:
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", None)
        if not challenge.lower().startswith("bearer") or realm is None:
            raise RegistryError(f"the registry asks for credentials ({challenge[:80]})")
        params.setdefault("scope", f"repository:{self.repo}:pull")
        url = f"{realm}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=self.timeout) as resp:
            body = json.loads(resp.read(1 << 20))
        token = body.get("token") or body.get("access_token")
        if not isinstance(token, str):
            raise RegistryError("the registry's token service gave no token")
        self.token = token

    def get(self, path: str, accept: str | None = None) -> Any:
        url = f"{self.base}/{path}"
        try:
            return self._open(url, accept)
        except urllib.error.HTTPError as exc:
            if exc.code != 401 or self.token is not None:
                raise RegistryError(f"GET {url}: HTTP {exc.code}") from None
            self._login(exc.headers.get("WWW-Authenticate", ""))
            try:
                return self._open(url, accept)
            except urllib.error.HTTPError as again:
                raise RegistryError(f"GET {url}: HTTP {again.code}") from None

    def json(self, path: str, accept: str | None = None) -> Any:
        with self.get(path, accept) as resp:
            return json.loads(resp.read(4 << 20))


def _manifest(client: _Client, digest: str) -> dict[str, Any]:
    doc = client.json(f"manifests/{digest}", ACCEPT)
    if "manifests" in doc:  # an index: this machine's platform, linux/amd64
        pick = next(
            (
                m
                for m in doc["manifests"]
                if m.get("platform", {}).get("os") == "linux"
                and m.get("platform", {}).get("architecture") == "amd64"
            ),
            None,
        )
        if pick is None:
            raise RegistryError("the image index has no linux/amd64 image")
        doc = client.json(f"manifests/{pick['digest']}", ACCEPT)
    if not isinstance(doc, dict) or "config" not in doc:
        raise RegistryError("not an image manifest")
    return doc


def _scan_layers(client: _Client, manifest: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """The fatbin entries of every libggml-cuda in the image's layers (gzip tar layers)."""
    found: list[tuple[str, int]] = []
    for layer in manifest.get("layers", []):
        media = str(layer.get("mediaType", ""))
        if media and "gzip" not in media and not media.endswith(".tar"):
            continue  # zstd and others: not read (their labels must say)
        with client.get(f"blobs/{layer['digest']}") as resp:
            stream: Any = gzip.GzipFile(fileobj=resp) if "gzip" in media or not media else resp
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    if not (member.isfile() and CUDA_LIB.search(member.name)):
                        continue
                    if member.size > MAX_LIB_BYTES:
                        raise RegistryError(f"{member.name}: {member.size} bytes, too large")
                    data = tar.extractfile(member)
                    if data is not None:
                        found.extend(fatbin_entries(data.read()))
    return tuple(sorted(set(found)))


def _cache(digest: str) -> Path:
    return Path(controller_state_dir()) / "engine-images" / f"{digest.replace(':', '-')}.json"


def read_engine_image(
    image: str, *, scan: bool = True, timeout: float = PROBE_TIMEOUT_S
) -> EngineImage:
    """What the registry publishes of ``image``: its labels, and where it names no CUDA
    architectures (and ``scan``), the fatbins of its layers. Never raises: what could not be
    read is an EngineImage without labels saying why."""
    try:
        registry, repo, digest = _split(image)
    except RegistryError as exc:
        return EngineImage(ref=image, source="registry", where=str(exc))
    cached = _cache(digest)
    if cached.is_file():
        try:
            known = EngineImage.model_validate_json(cached.read_text())
            if known.labels is not None and (
                known.fatbin is not None or not scan or CUDA_LABEL in known.labels
            ):
                return known.model_copy(update={"ref": image})
        except ValueError:
            pass
    insecure = insecure_registries()
    plain = any(loc == registry or loc.startswith(registry + "/") for loc in insecure)
    client = _Client(registry, repo, plain, timeout)
    try:
        manifest = _manifest(client, digest)
        config = client.json(f"blobs/{manifest['config']['digest']}")
        labels = (config.get("config") or {}).get("Labels") or {}
        labels = {str(k): str(v) for k, v in labels.items()}
        fatbin = None
        where = f"labels read from the registry {registry}"
        if scan and CUDA_LABEL not in labels:
            fatbin = _scan_layers(client, manifest)
            where = f"read from the registry {registry} (no {CUDA_LABEL} label)"
        known = EngineImage(ref=image, source="registry", labels=labels, fatbin=fatbin, where=where)
    except (RegistryError, OSError, ValueError, KeyError, tarfile.TarError) as exc:
        why = str(exc.reason if isinstance(exc, urllib.error.URLError) else exc)
        if not plain and ("WRONG_VERSION_NUMBER" in why or "HTTP response" in why):
            why += (
                " (it speaks plain HTTP: mark it insecure in the registries.conf podman reads "
                f'here: [[registry]] location = "{registry}" insecure = true)'
            )
        return EngineImage(
            ref=image,
            source="registry",
            where=f"the registry {registry} could not be read from this machine: {why}",
        )
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(cached.name + ".tmp")
        tmp.write_text(known.model_dump_json())
        tmp.replace(cached)
    except OSError:
        pass  # a cache that cannot be written only costs a second read
    return known
