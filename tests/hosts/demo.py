"""The whole path on the embedded default: deploy the tiny CPU test recipe to a local test host
(booted by tests/hosts/setup.sh) and print a completion from the served model.

Run through ./demo, which installs and boots first. What is real: systemd as PID 1 on the host,
SSH, podman and quadlet, the registry and the pull by digest, the model download with sha256
verification, llama-server. What is a stand-in: the GPU (nvidia-smi, nvidia-ctk, the CDI spec).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.hosts.fleet import TINY_COMMIT, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host, base_dir, load_hosts, load_hosts_json, ssh_run
from tests.hosts.hf_server import HFServer

STAND_INS = (
    "Stand-ins: the GPU. gpu1 has no NVIDIA card; its nvidia-smi, nvidia-ctk and CDI spec replay "
    "a Tesla P100's real output formats, and the engine image is llama.cpp's CPU build (Debian's "
    "llama.cpp-tools). Real: systemd, SSH, podman + quadlet, the registry and the pull by digest, "
    "the model download with resume and sha256 check, llama-server and its /health."
)


DEMO_PROMPT = {"prompt": "Hello", "max_tokens": 16, "temperature": 0}
TIMED_RUNS = 3


def _complete(host: Host) -> dict[str, Any]:
    body = json.dumps(DEMO_PROMPT)
    out = ssh_run(
        host,
        "curl -fsS http://127.0.0.1:8080/v1/completions "
        f"-H 'Content-Type: application/json' -d '{body}'",
    )
    answer: dict[str, Any] = json.loads(str(out.stdout))
    return answer


def main() -> int:
    hosts_json = load_hosts_json()
    host = load_hosts()["gpu1"]
    base = base_dir()
    work = Path(tempfile.mkdtemp(prefix="demo-", dir=base))
    tl_set = f"TL_SET={hosts_json['set']} " if hosts_json.get("set") else ""
    with HFServer(host=hosts_json["gateway"]) as hf:
        hf.publish(
            hosts_json["tiny_gguf"]["hf_repo"],
            {hosts_json["tiny_gguf"]["hf_file"]: Path(hosts_json["tiny_gguf"]["path"])},
            commit=TINY_COMMIT,
        )
        catalog = write_catalog(work / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
        inventory = write_inventory(work / "inventory.py", [host])
        print(f"deploying the tiny test recipe to {host.name} ({host.ip}); model server {hf.url}")
        print(f"  tensorless-deploy deploy -i {inventory} tiny --recipes {catalog} -v", flush=True)
        # the deploy's own output as it comes (its progress bars too, on a terminal)
        code = subprocess.run(
            [
                sys.executable,
                "-m",
                "tensorless_deploy",
                "deploy",
                "-i",
                str(inventory),
                "tiny",
                "--recipes",
                str(catalog),
                "-v",
            ],
            env={**os.environ, "HF_ENDPOINT": hf.url, "HF_HUB_DISABLE_TELEMETRY": "1"},
            timeout=1800,
        ).returncode
        if code != 0:
            return code
    # The first request after a start also warms llama-server's threads (about a second on
    # these 2 shared cores, against milliseconds after): a speed from it, or from a single
    # request, said 13,489 tok/s on one run and 7.9 on the next. One warm-up, then the median.
    _complete(host)
    answers = [_complete(host) for _ in range(TIMED_RUNS)]
    answer = answers[-1]
    ms = statistics.median(a.get("timings", {}).get("predicted_ms", 0.0) for a in answers)
    n = answer.get("timings", {}).get("predicted_n")
    print(f"\ncompletion from {answer['model']} on {host.name}: {answer['choices'][0]['text']!r}")
    print(
        f"  {n} tokens in {ms:.1f} ms, the median of {TIMED_RUNS} requests after a warm-up: the "
        "tiny test model (2 layers, random weights) on the CPU engine, so neither the words "
        "nor the speed mean anything; the path is what is real "
        "(`tensorless-deploy bench` measures a real model against its receipt)"
    )
    print("\n" + STAND_INS)
    ssh = f"ssh -F {base / 'ssh' / 'config'} {host.name}"
    print(
        f"\nThe server keeps running on {host.name}, on its loopback (127.0.0.1:8080, as deploy "
        "binds by default):"
    )
    print(f"  {ssh} curl -s http://127.0.0.1:8080/v1/models")
    print(f"  the inventory and catalog of this deploy: {inventory}, {catalog}")
    print(f"  .venv/bin/tensorless-deploy status -i {inventory} --recipes {catalog}")
    print(
        "Next: docs/tutorial.md, from an inventory of your own GPU servers to a healthy fleet; "
        f"docs/install.md#the-playground, where every example of the docs runs "
        f'(eval "$({tl_set}bash tests/hosts/playground.sh)").'
    )
    print(f"`{tl_set}bash tests/hosts/teardown.sh` stops the test hosts.")
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
