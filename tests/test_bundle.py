"""The offline bundle (fleet.bundle): written from the controller's verified bytes, and every
part of it checked before deploy --from-bundle lets anything reach a host: a flipped byte, a
wrong image digest, a missing part, an extra part and a truncated archive are each refused in
one line naming the part."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.cli import main
from tensorless_deploy.fleet.bundle import SUMS, Bundle, BundleError, stage, verify, write_bundle
from tensorless_deploy.recipe import load_catalog
from tests.gguf_tools import write_tiny_llama
from tests.recipe_tools import example, write_recipe

CUDA = "io.tensorless.engine.cuda-architectures"


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def oci_archive(path: Path, labels: dict[str, str], layer: bytes = b"layer bytes") -> str:
    """An OCI archive as skopeo writes one (oci-layout, index.json, blobs/sha256/*); returns
    its manifest digest."""
    blobs: dict[str, bytes] = {}
    config = _blob(blobs, json.dumps({"config": {"Labels": labels}}).encode())
    layer_ref = _blob(blobs, layer)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_ref}],
    }
    top = _blob(blobs, json.dumps(manifest).encode())
    index = {"schemaVersion": 2, "manifests": [{"mediaType": manifest["mediaType"], **top}]}
    files: dict[str, bytes | str] = {
        "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
        "index.json": json.dumps(index),
    }
    with tarfile.open(path, "w") as tar:
        for name, data in [
            *((f"blobs/sha256/{d.removeprefix('sha256:')}", b) for d, b in blobs.items()),
            *files.items(),
        ]:
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return str(top["digest"])


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """One bundle of a GPU recipe (sm60) for a tiny GGUF and a made-up image, written once."""
    tmp = tmp_path_factory.mktemp("bundle")
    gguf = write_tiny_llama(tmp / "tiny.gguf")
    archive = tmp / "engine.oci.tar"
    digest = oci_archive(archive, {CUDA: "60"})
    data = example()
    data["model"] |= {
        "file": "tiny.gguf",
        "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
        "size_bytes": gguf.stat().st_size,
    }
    data["engine"]["image"] = f"registry.invalid/engine@{digest}"
    recipe = write_recipe(tmp / "recipes", data)
    (entry,) = load_catalog(tmp / "recipes").entries
    return write_bundle(entry, recipe, gguf, archive, tmp / "out")


@pytest.fixture
def copy(written: Bundle, tmp_path: Path) -> Path:
    """A fresh copy of the bundle to break."""
    out = tmp_path / "bundle"
    shutil.copytree(written.root, out)
    return out


def _resum(root: Path, rel: str) -> None:
    """SHA256SUMS rewritten for rel, as someone who changed the part would."""
    sha = hashlib.sha256((root / rel).read_bytes()).hexdigest()
    lines = [
        f"{sha}  {rel}" if line.endswith(f"  {rel}") else line
        for line in (root / SUMS).read_text().splitlines()
    ]
    (root / SUMS).write_text("\n".join(lines) + "\n")


def _refusal(root: Path) -> str:
    with pytest.raises(BundleError) as caught:
        verify(root)
    (line,) = caught.value.lines()
    return line


def test_written_bundle_has_every_part_and_verifies(written: Bundle) -> None:
    listed = sorted(
        line.split("  ", 1)[1] for line in (written.root / SUMS).read_text().splitlines()
    )
    tail = written.entry.recipe.engine.image.rpartition(":")[2]
    assert listed == [
        "image/sha256-" + tail + ".oci.tar",
        "model/tiny.gguf",
        "recipe/" + written.entry.path,
        "wheel/" + written.wheel.name,
    ]
    assert written.wheel.name.startswith("tensorless_deploy-") and written.wheel.suffix == ".whl"
    again = verify(written.root)
    assert again.source == written.source
    assert again.source.model.read_bytes()[:4] == b"GGUF"
    assert not list(written.root.parent.glob(".out.tmp-*"))  # the temporary name is gone


def test_an_existing_path_is_refused(written: Bundle) -> None:
    with pytest.raises(BundleError, match="exists"):
        write_bundle(written.entry, written.root / "x", written.model, written.image, written.root)


def test_a_flipped_byte_in_the_gguf_is_refused(copy: Path) -> None:
    model = copy / "model" / "tiny.gguf"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x01
    model.write_bytes(bytes(data))
    assert "part model/tiny.gguf has sha256" in _refusal(copy)
    assert "as SHA256SUMS says" in _refusal(copy)
    # SHA256SUMS rewritten to match: the recipe's own sha256 still refuses it
    _resum(copy, "model/tiny.gguf")
    line = _refusal(copy)
    assert "part model/tiny.gguf has sha256" in line and "not the recipe's" in line


def test_an_image_of_another_digest_is_refused(copy: Path, written: Bundle) -> None:
    rel = written.image.relative_to(written.root).as_posix()
    oci_archive(copy / rel, {CUDA: "61"})  # another image under the pinned digest's name
    assert f"part {rel} has sha256" in _refusal(copy)
    _resum(copy, rel)
    line = _refusal(copy)
    digest = written.entry.recipe.engine.image.rpartition("@")[2]
    assert f"part {rel} is not the image {digest}: its manifest is sha256:" in line


def test_a_blob_the_manifest_names_must_hash_to_its_digest(copy: Path, written: Bundle) -> None:
    rel = written.image.relative_to(written.root).as_posix()
    with tarfile.open(copy / rel) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar if m.isfile()]  # type: ignore[union-attr]
    with tarfile.open(copy / rel, "w") as tar:
        for m, data in members:
            if data == b"layer bytes":
                data = b"layer bytez"  # same size, another sha256
            tar.addfile(m, io.BytesIO(data))
    _resum(copy, rel)
    assert "has sha256" in _refusal(copy) and f"part {rel} is not the image" in _refusal(copy)


def test_a_missing_part_is_refused(copy: Path, written: Bundle) -> None:
    (copy / "wheel" / written.wheel.name).unlink()
    line = _refusal(copy)
    assert line.startswith(f"bundle {copy}: part wheel/{written.wheel.name} is missing")


def test_an_extra_part_is_refused(copy: Path) -> None:
    (copy / "model" / "notes.txt").write_text("hello")
    assert "model/notes.txt is not one of its parts" in _refusal(copy)
    _resum(copy, "model/notes.txt")  # not listed: a line of its own added to SHA256SUMS
    sha = hashlib.sha256(b"hello").hexdigest()
    with (copy / SUMS).open("a") as f:
        f.write(f"{sha}  model/notes.txt\n")
    assert "model/notes.txt is not one of its parts (recipe" in _refusal(copy)


def test_a_truncated_archive_is_refused(copy: Path, written: Bundle) -> None:
    rel = written.image.relative_to(written.root).as_posix()
    archive = copy / rel
    archive.write_bytes(archive.read_bytes()[:1500])
    assert f"part {rel}" in _refusal(copy)
    _resum(copy, rel)
    line = _refusal(copy)
    assert f"part {rel} is not" in line, line


def test_a_refused_recipe_is_one_line(copy: Path, written: Bundle) -> None:
    rel = f"recipe/{written.entry.path}"
    (copy / rel).write_text((copy / rel).read_text().replace('"released"', '"bogus"'))
    _resum(copy, rel)
    assert "the recipe is refused: " in _refusal(copy)


def test_staged_bundle_plans_without_network(
    written: Bundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What planning reads over HTTP (the GGUF header, the image's labels) comes from the
    bundle once staged: with the Hub and the registry at a dead address, both still answer."""
    from tensorless_deploy.fleet.registry import read_engine_image
    from tensorless_deploy.gguf.sizing import Sizing, SizingProblem, read_sizings

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    dead = "http://127.0.0.1:9"  # passed, not set as HF_ENDPOINT: huggingface_hub would keep it
    entry = written.entry
    before = read_sizings([(entry.path, entry.recipe)], endpoint=dead)[entry.path]
    assert isinstance(before, SizingProblem) and before.kind == "pending"  # the Hub is dead
    stage(written)
    sized = read_sizings([(entry.path, entry.recipe)], endpoint=dead)[entry.path]
    assert isinstance(sized, Sizing), sized
    known = read_engine_image(entry.recipe.engine.image, timeout=1)
    assert known.labels == {CUDA: "60"} and "bundle" in known.where


def test_deploy_from_a_bad_bundle_says_one_line(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (copy / SUMS).unlink()
    inv = tmp_path / "inventory.py"
    inv.write_text('hosts = ["10.255.255.1"]\n')
    code = main(["deploy", "-i", str(inv), "pn3", "--from-bundle", str(copy)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err == [
        f"bundle {copy}: no SHA256SUMS (fix: copy the whole bundle directory, or write it again)"
    ]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--recipes", "recipes"], "--from-bundle and --recipes: the bundle holds its own recipe"),
        (["--transfer", "pull"], "--from-bundle pushes the bundle's bytes: it takes no --transfer"),
    ],
)
def test_from_bundle_takes_neither_recipes_nor_pull(
    written: Bundle,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    said: str,
) -> None:
    inv = tmp_path / "inventory.py"
    inv.write_text('hosts = ["10.255.255.1"]\n')
    code = main(["deploy", "-i", str(inv), "pn3", "--from-bundle", str(written.root), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(said), err
