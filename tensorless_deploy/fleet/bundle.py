"""The offline bundle: one directory an operator carries to a site that reaches neither the Hub
nor a registry, holding everything a deploy of one recipe needs, and its verification.

A bundle is a directory (copy it with ``cp -r``, ``rsync`` or as a tar: resumable copies are the
user's business; the verification here is ours)::

    SHA256SUMS                        sha256sum's format: every other file, one line each
    recipe/<org>/<repo>/<card>.toml   the recipe, as a catalog of one (load_catalog reads it)
    model/<file>                      the GGUF, its recipe's sha256 and size_bytes
    image/sha256-<hex>.oci.tar        the engine image as an OCI archive of its pinned digest
    wheel/<this tool>.whl             this tool, built by ``pip wheel --no-deps`` from its tree

``verify`` checks every part before anything reaches a host: the file set is exactly the one
SHA256SUMS lists (a missing or an extra file is refused), every file hashes to its line, the
recipe is one the catalog accepts, the GGUF has the recipe's size and sha256, and the archive's
index names the recipe's pinned digest, every blob that manifest reaches hashing to its digest.
``stage`` then puts what planning reads over the network on the controller (the GGUF header,
the engine image's labels) into the caches the planner reads first, so that a deploy from a
bundle opens no connection but SSH to the hosts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.fleet.push import Source, file_sha256
from tensorless_deploy.recipe.catalog import Catalog, Entry
from tensorless_deploy.recipe.schema import Recipe

SUMS = "SHA256SUMS"
CHUNK = 4 << 20
_SUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *](\S.*)$")
# the build backend is the one installed here (no isolation): no index is asked for anything
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
PIP_WHEEL.append("--no-index")
SMALL = 4 << 20  # archive members kept in memory to be parsed: the index and the manifests


class BundleError(TensorlessError):
    """A bundle that cannot be written, or whose part is not what it must be."""


@dataclass(frozen=True)
class Bundle:
    """A verified bundle: its catalog of one recipe, and the files of the bytes to push."""

    root: Path
    catalog: Catalog
    entry: Entry
    model: Path
    image: Path
    wheel: Path

    @property
    def source(self) -> Source:
        r = self.entry.recipe
        return Source(r.model.sha256, self.model, r.engine.image, self.image)


def parts(recipe: Recipe, recipe_rel: str, wheel: str) -> dict[str, str]:
    """What each part of a bundle of this recipe is called in it (the one naming of both
    writing and verifying)."""
    from tensorless_deploy.fleet.push import remote_image_path

    archive = remote_image_path(recipe.engine.image).rpartition("/")[2]  # the hosts' name for it
    return {
        "recipe": f"recipe/{recipe_rel}",
        "model": f"model/{Path(recipe.model.file).name}",
        "image": f"image/{archive}",
        "wheel": f"wheel/{wheel}",
    }


# --- writing ----------------------------------------------------------------------------------


def tool_wheel(out: Path) -> Path:
    """This tool as a wheel in out, built from the source tree it runs from with
    ``pip wheel --no-deps --no-build-isolation`` (the build backend is the one installed here:
    no index is asked)."""
    import tensorless_deploy

    tree = Path(tensorless_deploy.__file__).resolve().parents[1]
    if not (tree / "pyproject.toml").is_file():
        raise BundleError(
            f"bundle: this tool runs from {tree}, not from its source tree: there is no "
            "pyproject.toml to build its wheel from",
            fix="run bundle from a checkout installed with pip install -e .",
        )
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [*PIP_WHEEL, "-w", str(out), str(tree)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    wheels = sorted(out.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        why = proc.stderr.strip().splitlines()[-1:] or [f"{len(wheels)} wheels"]
        raise BundleError(
            f"bundle: pip wheel of {tree} failed: {why[0]}",
            fix="install the build backend here (pip install hatchling)",
        )
    return wheels[0]


def _place(src: Path, dest: Path) -> None:
    """src at dest: a hard link where both lie on one file system, else a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def _refuse_existing(out: Path) -> None:
    if out.exists() or out.is_symlink():
        raise BundleError(
            f"bundle: {out} exists", fix="remove it, or write the bundle to another -o PATH"
        )


def write_bundle(entry: Entry, recipe_file: Path, model: Path, image: Path, out: Path) -> Bundle:
    """The bundle of entry at out, from the GGUF and the image archive the controller holds;
    written under a temporary name beside out, verified as deploy --from-bundle verifies it
    (a cached copy that rotted is caught here, not at the site), then renamed into place. An
    existing out is refused: a bundle is never merged into."""
    _refuse_existing(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        wheel = tool_wheel(tmp / "wheel")
        names = parts(entry.recipe, entry.path, wheel.name)
        recipe = tmp / names["recipe"]
        recipe.parent.mkdir(parents=True)
        shutil.copyfile(recipe_file, recipe)
        _place(model, tmp / names["model"])
        _place(image, tmp / names["image"])
        lines = [f"{file_sha256(tmp / rel)}  {rel}\n" for rel in sorted(names.values())]
        (tmp / SUMS).write_text("".join(lines))
        verify(tmp)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _at(out)


def bundle_of(catalog: Catalog, entry: Entry, out: Path, token: Any = None) -> Bundle:
    """bundle MODEL: the GGUF fetched (or found verified) in this machine's Hub cache and the
    image saved by digest (fleet.push.image_archive), both as --transfer push takes them."""
    from tensorless_deploy.fleet.push import TransferError, image_archive
    from tensorless_deploy.hub import cache_dir
    from tensorless_deploy.local.fetch import LocalError, fetch_model

    _refuse_existing(out)
    try:
        model = fetch_model(entry.recipe, cache_dir(), token=token).blob
        image = image_archive(entry.recipe.engine.image)
    except (LocalError, TransferError) as exc:
        raise BundleError(f"bundle: {exc.message}", fix=exc.fix) from None
    return write_bundle(entry, catalog.root / entry.path, model, image, out)


# --- verifying --------------------------------------------------------------------------------


def _sums(root: Path) -> dict[str, str]:
    """SHA256SUMS read strictly: rel path -> sha256; a line it cannot read is refused."""
    try:
        text = (root / SUMS).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BundleError(
            f"bundle {root}: no {SUMS}", fix="copy the whole bundle directory, or write it again"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"bundle {root}: {SUMS} cannot be read: {exc}") from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        m = _SUM_LINE.match(line)
        rel = m.group(2) if m else ""
        if m is None or rel.startswith("/") or ".." in rel.split("/") or rel in out:
            raise BundleError(f"bundle {root}: {SUMS} line {n} is not '<sha256>  <part>'")
        out[rel] = m.group(1)
    return out


def _files(root: Path) -> Iterator[str]:
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not (path.is_dir() or path.is_file()):
            raise BundleError(
                f"bundle {root}: {path.relative_to(root)} is not a plain file",
                fix="copy the bundle without links (cp -rL)",
            )
        if path.is_file():
            yield path.relative_to(root).as_posix()


def _part_set(root: Path, listed: dict[str, str]) -> None:
    """The files there are exactly the files SHA256SUMS lists."""
    there = set(_files(root)) - {SUMS}
    for rel in sorted(set(listed) - there):
        raise BundleError(
            f"bundle {root}: part {rel} is missing (SHA256SUMS lists it)",
            fix="copy the whole bundle again",
        )
    for rel in sorted(there - set(listed)):
        raise BundleError(
            f"bundle {root}: {rel} is not one of its parts (SHA256SUMS does not list it)",
            fix=f"remove {rel}: a bundle holds only what it was written with",
        )


def _recipe(root: Path, listed: dict[str, str]) -> tuple[Catalog, Entry]:
    from tensorless_deploy.errors import RecipeError
    from tensorless_deploy.recipe import load_catalog

    tomls = [rel for rel in listed if rel.startswith("recipe/")]
    if len(tomls) != 1:
        raise BundleError(f"bundle {root}: {len(tomls)} recipe parts under recipe/, not one")
    try:
        catalog = load_catalog(root / "recipe")
    except RecipeError as exc:
        raise BundleError(f"bundle {root}: the recipe is refused: {exc.problems[0]}") from None
    if len(catalog.entries) != 1:
        raise BundleError(f"bundle {root}: {tomls[0]} is not a recipe file")
    return catalog, catalog.entries[0]


def _expected(root: Path, entry: Entry, listed: dict[str, str]) -> dict[str, str]:
    """The parts the recipe names; SHA256SUMS must list exactly these."""
    wheels = [rel.removeprefix("wheel/") for rel in listed if rel.startswith("wheel/")]
    names = parts(entry.recipe, entry.path, wheels[0] if len(wheels) == 1 else "*.whl")
    for what, rel in names.items():
        if rel not in listed:
            raise BundleError(
                f"bundle {root}: no {what} part {rel} for recipe {entry.path}",
                fix="write the bundle again with tensorless-deploy bundle",
            )
    for rel in sorted(set(listed) - set(names.values())):
        raise BundleError(
            f"bundle {root}: {rel} is not one of its parts (recipe {entry.path} names "
            f"{', '.join(sorted(names.values()))})"
        )
    return names


def _check_hash(root: Path, rel: str, got: str, want: str) -> None:
    if got != want:
        raise BundleError(
            f"bundle {root}: part {rel} has sha256 {got}, not {want} as SHA256SUMS says",
            fix="copy that part again from the original bundle",
        )


def _check_model(root: Path, rel: str, recipe: Recipe, listed: str) -> None:
    m = recipe.model
    size = (root / rel).stat().st_size
    if size != m.size_bytes:
        raise BundleError(
            f"bundle {root}: part {rel} has {size} bytes, not the recipe's size_bytes "
            f"{m.size_bytes}",
            fix="copy that part again from the original bundle",
        )
    got = file_sha256(root / rel)
    _check_hash(root, rel, got, listed)
    if got != m.sha256:
        raise BundleError(
            f"bundle {root}: part {rel} has sha256 {got}, not the recipe's {m.sha256}"
        )


@dataclass
class _Archive:
    """What a read of an OCI archive found: each blob's sha256 and size, the small files."""

    blobs: dict[str, tuple[str, int]] = field(default_factory=dict)  # "sha256:..." -> (hex, n)
    small: dict[str, bytes] = field(default_factory=dict)


def _read_archive(path: Path) -> _Archive:
    """Every file of the archive hashed (tarfile seeks from header to header; its stream mode
    copies each block and took twice as long here); those up to SMALL kept to be parsed."""
    out = _Archive()
    with tarfile.open(path, mode="r:") as tar:
        for member in tar:
            data = tar.extractfile(member) if member.isfile() else None
            if data is None:
                continue
            name = member.name.removeprefix("./")
            h, kept = hashlib.sha256(), []
            while block := data.read(CHUNK):
                h.update(block)
                if member.size <= SMALL:
                    kept.append(block)
            if member.size <= SMALL:
                out.small[name] = b"".join(kept)
            if name.startswith("blobs/sha256/"):
                out.blobs[f"sha256:{name.rpartition('/')[2]}"] = (h.hexdigest(), member.size)
    return out


def _image_problem(archive: _Archive, digest: str) -> str | None:
    """Why the archive is not the image of digest (its index names it, and every blob the
    manifest reaches is there and hashes to its digest), or None."""
    try:
        index = json.loads(archive.small["index.json"])
        listed = [str(m.get("digest")) for m in index.get("manifests", [])]
    except (KeyError, ValueError, AttributeError):
        return "it has no readable index.json"
    if digest not in listed:
        return f"its manifest is {', '.join(listed) or 'none'}, not the pinned {digest}"
    todo: list[tuple[str, bool]] = [(digest, True)]
    seen: set[str] = set()
    while todo:
        d, is_manifest = todo.pop()
        if d in seen:
            continue
        seen.add(d)
        blob = archive.blobs.get(d)
        if blob is None:
            return f"blob {d} is missing"
        if f"sha256:{blob[0]}" != d:
            return f"blob {d} has sha256 {blob[0]}"
        if is_manifest:
            try:
                todo += _references(json.loads(archive.small[f"blobs/sha256/{blob[0]}"]))
            except (KeyError, ValueError, TypeError):
                return f"manifest {d} cannot be read"
    return None


def _references(doc: Any) -> list[tuple[str, bool]]:
    """The blobs a manifest or an index names: (digest, is itself a manifest)."""
    if not isinstance(doc, dict):
        raise ValueError("not a manifest")
    out = [(str(m["digest"]), True) for m in doc.get("manifests", [])]
    if isinstance(doc.get("config"), dict):
        out.append((str(doc["config"]["digest"]), False))
    out += [(str(layer["digest"]), False) for layer in doc.get("layers", [])]
    return out


def _check_image(root: Path, rel: str, recipe: Recipe, listed: str) -> None:
    _check_hash(root, rel, file_sha256(root / rel), listed)
    try:
        archive = _read_archive(root / rel)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BundleError(
            f"bundle {root}: part {rel} is not a whole OCI archive: {exc}",
            fix="copy that part again from the original bundle",
        ) from None
    digest = recipe.engine.image.rpartition("@")[2]
    problem = _image_problem(archive, digest)
    if problem is not None:
        raise BundleError(f"bundle {root}: part {rel} is not the image {digest}: {problem}")


def verify(root: Path) -> Bundle:
    """Every part of the bundle at root checked (the module's docstring says what), cheapest
    first; the first part at fault is one BundleError naming it and the fix."""
    if not root.is_dir():
        raise BundleError(
            f"bundle {root}: no such directory", fix="pass the directory bundle -o wrote"
        )
    listed = _sums(root)
    _part_set(root, listed)
    _, entry = _recipe(root, listed)
    names = _expected(root, entry, listed)
    _check_hash(root, names["recipe"], file_sha256(root / names["recipe"]), listed[names["recipe"]])
    _check_model(root, names["model"], entry.recipe, listed[names["model"]])
    _check_image(root, names["image"], entry.recipe, listed[names["image"]])
    _check_hash(root, names["wheel"], file_sha256(root / names["wheel"]), listed[names["wheel"]])
    return _at(root)


def _at(root: Path) -> Bundle:
    """The bundle at root as its parts name it (after verify: nothing checked again)."""
    listed = _sums(root)
    catalog, entry = _recipe(root, listed)
    names = _expected(root, entry, listed)
    return Bundle(
        root,
        catalog,
        entry,
        root / names["model"],
        root / names["image"],
        root / names["wheel"],
    )


# --- staging: what planning reads over the network, from the verified bytes -------------------


def stage(bundle: Bundle) -> None:
    """The GGUF header (sizing) and the engine image's labels and fatbins (engine.code) put
    into the controller's caches from the bundle, where planning looks before any network."""
    from tensorless_deploy.gguf.header import HeaderCache, header_cache_dir, read_header_file

    m = bundle.entry.recipe.model
    HeaderCache(header_cache_dir()).put(
        m.hf_repo, m.revision, m.file, read_header_file(bundle.model)
    )
    if bundle.entry.recipe.engine.arch != "cpu":
        _stage_engine_image(bundle)


class _ArchiveBlobs:
    """The blobs of an OCI archive served as fleet.registry reads a registry's (``get`` of
    ``blobs/<digest>``), so that its labels and fatbins are read by the same code."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar

    def get(self, path: str) -> IO[bytes]:
        digest = path.removeprefix("blobs/")
        f = self.tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
        if f is None:
            raise tarfile.TarError(f"{digest}: not a file")
        return f

    def json(self, path: str) -> Any:
        with self.get(path) as f:
            return json.loads(f.read(SMALL))


def _stage_engine_image(bundle: Bundle) -> None:
    """engine.code's answer for the bundle's GPU image, read from its archive (its config's
    labels; where they name no CUDA architectures, its libggml-cuda fatbins) into the cache
    fleet.registry.read_engine_image reads first."""
    from tensorless_deploy.facts.values import EngineImage
    from tensorless_deploy.fleet.registry import CUDA_LABEL, _cache, _scan_layers

    image = bundle.entry.recipe.engine.image
    digest = image.rpartition("@")[2]
    with tarfile.open(bundle.image) as tar:
        blobs = _ArchiveBlobs(tar)
        manifest = blobs.json(f"blobs/{digest}")
        if "manifests" in manifest:  # an index: linux/amd64, as the registry's reader picks
            pick = next(
                m
                for m in manifest["manifests"]
                if m.get("platform", {}).get("architecture", "amd64") == "amd64"
            )
            manifest = blobs.json(f"blobs/{pick['digest']}")
        config = blobs.json(f"blobs/{manifest['config']['digest']}")
        labels = {
            str(k): str(v) for k, v in ((config.get("config") or {}).get("Labels") or {}).items()
        }
        fatbin = None if CUDA_LABEL in labels else _scan_layers(blobs, manifest)  # type: ignore[arg-type]
    where = f"read from the bundle {bundle.root}"
    known = EngineImage(ref=image, source="registry", labels=labels, fatbin=fatbin, where=where)
    cached = _cache(digest)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(cached.name + ".tmp")
    tmp.write_text(known.model_dump_json())
    tmp.replace(cached)


# --- this machine: pull and run from a bundle ---------------------------------------------------


def image_here(bundle: Bundle, engine: str) -> bool:
    """The bundle's image in this machine's engine, loaded by the hosts' own loader
    (operations/scripts/image-load.sh: refused unless its digest is the pin) from a link to the
    archive (the loader removes what it loaded); False when the image was here already."""
    import tempfile

    from tensorless_deploy.hub import controller_state_dir
    from tensorless_deploy.local.fetch import LocalError
    from tensorless_deploy.local.run import image_present
    from tensorless_deploy.operations._run import bound

    image = bundle.entry.recipe.engine.image
    if image_present(engine, image):
        return False
    repo, _, digest = image.partition("@")
    where = Path(controller_state_dir()) / "images"  # the bundle may lie on read-only media
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where, prefix=".load-") as tmp:
        archive = Path(tmp) / bundle.image.name
        _place(bundle.image, archive)
        text = bound(
            "image-load", engine=engine, archive=str(archive), digest=digest, repo=repo, image=image
        )
        proc = subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise LocalError(f"loading {bundle.image}: {why[0]}")
    return True


def model_here(bundle: Bundle, cache: str) -> Path:
    """The bundle's GGUF (verified by verify) in this machine's Hub cache, stamped and linked
    as fetch_model leaves a download: a later pull or run finds it verified earlier."""
    from tensorless_deploy.local.fetch import _link, _write_stamp, model_is_verified
    from tensorless_deploy.recipe.catalog import model_paths

    paths = model_paths(cache, bundle.entry.recipe)
    blob = Path(paths.blob)
    if not model_is_verified(paths):
        partial = Path(paths.partial)
        partial.unlink(missing_ok=True)
        _place(bundle.model, partial)
        os.replace(partial, blob)
        _write_stamp(paths)
    _link(paths)
    return blob
