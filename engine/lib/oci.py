"""Write an engine image as an OCI image layout, byte for byte the same for the same tree.

    python3 engine/lib/oci.py ROOTFS OUT_DIR --tag TAG --epoch SECONDS --label K=V ...

ROOTFS becomes one layer: a POSIX tar written here in sorted path order, every mtime set to
--epoch, owners numeric (no user or group names), no atime, ctime or extended attributes, then
gzip with no name and mtime 0. The config carries the image contract of engine/README.md
(user 10001, exec-form entrypoint /usr/bin/llama-server, no Cmd, port 8080, the labels) and
`created` = --epoch. OUT_DIR is an OCI layout (oci-layout, index.json, blobs/sha256/...) that
`skopeo copy oci:OUT_DIR:TAG docker://...` pushes unchanged, so the pushed manifest digest is the
one printed here. Prints: manifest=sha256:... config=sha256:... layer=sha256:... diff_id=...
size=BYTES (the compressed layer). Standard library only (the build machine's python3).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import stat
import sys
import tarfile
import time
from pathlib import Path

ENTRYPOINT = ["/usr/bin/llama-server"]
USER = "10001:10001"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HashingWriter:
    """A file-like sink that hashes and counts what passes through to `out`."""

    def __init__(self, out) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def walk(root: Path) -> list[str]:
    """Every path under root, relative, in sorted order (directories before their contents)."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        for name in sorted(dirnames + filenames):
            found.append(name if rel == "." else f"{rel}/{name}")
    return sorted(found)


def write_layer(root: Path, dest, epoch: int) -> None:
    seen: dict[tuple[int, int], str] = {}  # (dev, inode) -> first path, for hard links
    with tarfile.open(fileobj=dest, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel in walk(root):
            path = root / rel
            st = os.lstat(path)
            info = tarfile.TarInfo(rel)
            info.mtime = epoch
            info.mode = stat.S_IMODE(st.st_mode)
            info.uid, info.gid = st.st_uid, st.st_gid
            info.uname = info.gname = ""
            key = (st.st_dev, st.st_ino)
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
            elif stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            elif stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and key in seen:
                info.type, info.linkname = tarfile.LNKTYPE, seen[key]
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                if st.st_nlink > 1:
                    seen[key] = rel
                with open(path, "rb") as f:
                    tar.addfile(info, f)
                continue
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                # device nodes are the runtime's to create; none belongs in an image layer
                continue
            elif stat.S_ISFIFO(st.st_mode):
                info.type = tarfile.FIFOTYPE
            else:
                continue  # sockets
            tar.addfile(info)


def blob(out: Path, data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (out / "blobs/sha256" / digest[7:]).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rootfs", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--epoch", type=int, required=True)
    ap.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--created-by", default="engine/build.sh")
    args = ap.parse_args(argv)
    labels = dict(label.split("=", 1) for label in args.label)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(args.epoch))

    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    (out / "blobs/sha256").mkdir(parents=True)
    tmp = out / "layer.tmp"
    with open(tmp, "wb") as raw:
        compressed = HashingWriter(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0,
                           compresslevel=6) as gz:  # fmt: skip
            plain = HashingWriter(gz)
            write_layer(args.rootfs, plain, args.epoch)
    diff_id = "sha256:" + plain.sha.hexdigest()
    layer = {"digest": "sha256:" + compressed.sha.hexdigest(), "size": compressed.size}
    tmp.rename(out / "blobs/sha256" / layer["digest"][7:])

    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "User": USER,
            "Entrypoint": ENTRYPOINT,
            "Env": [PATH_ENV],
            "ExposedPorts": {"8080/tcp": {}},
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": args.created_by}],
    }
    config_desc = blob(out, canonical(config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
    }
    manifest_desc = blob(out, canonical(manifest))
    index = {
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_desc,
            "annotations": {"org.opencontainers.image.ref.name": args.tag},
        }],
    }  # fmt: skip
    (out / "index.json").write_bytes(canonical(index))
    (out / "oci-layout").write_bytes(canonical({"imageLayoutVersion": "1.0.0"}))
    print(f"manifest={manifest_desc['digest']} config={config_desc['digest']} "
          f"layer={layer['digest']} diff_id={diff_id} size={layer['size']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
