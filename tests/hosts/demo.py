"""The whole path on the embedded default: deploy the tiny CPU test recipe to a local test host
(booted by tests/hosts/setup.sh) and print a completion from the served model.

Run through ./demo, which installs and boots first. What is real: systemd as PID 1 on the host,
SSH, podman and quadlet, the registry and the pull by digest, the model download with sha256
verification, llama-server. What is a stand-in: the GPU (nvidia-smi, nvidia-ctk, the CDI spec).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.hosts.fleet import cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import base_dir, load_hosts, load_hosts_json, ssh_run
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT

STAND_INS = (
    "Stand-ins: the GPU. gpu1 has no NVIDIA card; its nvidia-smi, nvidia-ctk and CDI spec replay "
    "a Tesla P100's real output formats, and the engine image is llama.cpp's CPU build (Debian's "
    "llama.cpp-tools). Real: systemd, SSH, podman + quadlet, the registry and the pull by digest, "
    "the model download with resume and sha256 check, llama-server and its /health."
)


def main() -> int:
    hosts_json = load_hosts_json()
    host = load_hosts()["gpu1"]
    work = Path(tempfile.mkdtemp(prefix="demo-", dir=base_dir()))
    with HFServer(host=hosts_json["gateway"]) as hf:
        hf.publish(
            hosts_json["tiny_gguf"]["hf_repo"],
            {hosts_json["tiny_gguf"]["hf_file"]: Path(hosts_json["tiny_gguf"]["path"])},
            commit=TINY_COMMIT,
        )
        catalog = write_catalog(work / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
        inventory = write_inventory(work / "inventory.py", [host])
        print(f"deploying the tiny test recipe to {host.name} ({host.ip}); model server {hf.url}")
        proc = cli(
            "deploy",
            "-i",
            str(inventory),
            "tiny",
            "--recipes",
            str(catalog),
            "-v",
            env={"HF_ENDPOINT": hf.url},
        )
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            return proc.returncode
    body = json.dumps({"prompt": "Hello", "max_tokens": 16, "temperature": 0})
    out = ssh_run(
        host,
        "curl -fsS http://127.0.0.1:8080/v1/completions "
        f"-H 'Content-Type: application/json' -d '{body}'",
    )
    answer = json.loads(str(out.stdout))
    timings = answer.get("timings", {})
    print(f"\ncompletion from {answer['model']} on {host.name}: {answer['choices'][0]['text']!r}")
    print(
        f"  {timings.get('predicted_n')} tokens at {timings.get('predicted_per_second', 0):.1f} "
        "tok/s (random weights: the words mean nothing; the path is what is real)"
    )
    print("\n" + STAND_INS)
    tl_set = f"TL_SET={hosts_json['set']} " if hosts_json.get("set") else ""
    print(
        f"\nthe service keeps running on {host.name}; "
        f"`{tl_set}bash tests/hosts/teardown.sh` stops the test hosts"
    )
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("demo: needs root (it boots a test host in a network namespace)", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        sys.exit(1)
