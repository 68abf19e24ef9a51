"""Engine images for the Pascal guard's host tests, built from the set's CPU engine image with
the host-side podman of tests/hosts/setup.sh and pushed to the set's registry (by digest):

* ``ptx``: its ``/usr/lib/llama-server/libggml-cuda.so`` holds PTX for compute_60 only
  (tests/fixtures/fatbin/ptx60.so, made by nvcc), and its labels say so
  (``io.tensorless.engine.cuda-architectures=60-virtual``);
* ``ptx-unlabelled``: the same library without the engine labels (its contents must tell);
* ``sm60``: the library with sm_60 machine code, labelled ``60``.

Each is built once per set (the digest is kept in BASE/engine/pascal-NAME.digest while the
registry still has it)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

FATBIN = Path(__file__).resolve().parent.parent / "fixtures" / "fatbin"
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "ptx": (
        "ptx60.so",
        {
            "io.tensorless.engine.arch": "sm60",
            "io.tensorless.engine.cuda-architectures": "60-virtual",
            "io.tensorless.engine.cuda": "12.4.1",
        },
    ),
    "ptx-unlabelled": ("ptx60.so", {}),
    "sm60": (
        "sm60.so",
        {
            "io.tensorless.engine.arch": "sm60",
            "io.tensorless.engine.cuda-architectures": "60",
            "io.tensorless.engine.cuda": "12.4.1",
        },
    ),
}


def _podman_env(base: Path) -> dict[str, str]:
    ph = base / "podman-host"
    return {
        **os.environ,
        "CONTAINERS_CONF": str(ph / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(ph / "storage.conf"),
    }


def _manifest_ok(registry: str, name: str, digest: str) -> bool:
    accept = (
        "application/vnd.oci.image.manifest.v1+json, "
        "application/vnd.docker.distribution.manifest.v2+json"
    )
    done = subprocess.run(
        [
            "curl",
            "-fsS",
            "-m",
            "5",
            "-o",
            "/dev/null",
            "-I",
            "-H",
            f"Accept: {accept}",
            f"http://{registry}/v2/{name}/manifests/{digest}",
        ],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def pascal_image(hosts_json: dict[str, Any], variant: str) -> str:
    """registry/tensorless-engine-pascal-test@sha256:... of one variant, built if needed."""
    base = Path(hosts_json["base"])
    registry = hosts_json["registry"]
    name = f"tensorless-engine-pascal-{variant}"
    digest_file = base / "engine" / f"pascal-{variant}.digest"
    if digest_file.is_file():
        digest = digest_file.read_text().strip()
        if _manifest_ok(registry, name, digest):
            return f"{registry}/{name}@{digest}"
    lib, labels = VARIANTS[variant]
    env = _podman_env(base)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp)
        (ctx / "libggml-cuda.so").write_bytes((FATBIN / lib).read_bytes())
        lines = [
            f"FROM {hosts_json['image']['ref']}",
            "COPY libggml-cuda.so /usr/lib/llama-server/",
        ]
        lines += [f'LABEL "{k}"="{v}"' for k, v in labels.items()]
        (ctx / "Containerfile").write_text("\n".join(lines) + "\n")
        local = f"localhost/{name}:test"
        for argv in (
            ["podman", "build", "-q", "--tls-verify=false", "-t", local, str(ctx)],
            [
                "podman",
                "push",
                "-q",
                "--tls-verify=false",
                "--digestfile",
                str(digest_file),
                local,
                f"{registry}/{name}:test",
            ],
            ["podman", "rmi", "-f", local],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
            assert done.returncode == 0, f"{argv}: {done.stderr[-2000:]}"
    return f"{registry}/{name}@{digest_file.read_text().strip()}"
