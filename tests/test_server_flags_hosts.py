"""The refused-flag list against the real llama-server of the test engine image, on a test host:
its live --help must give no owned or forbidden option a spelling or twin the list lacks, every
option that names a file or reaches out must be decided, and the captured fixture must still be
that help (else recapture it: the command is in tests/fixtures/llama-server/README.md)."""

from __future__ import annotations

import pytest

from tests.hosts.harness import Host
from tests.hosts.plugin import SshRunner
from tests.llama_help import parse_help
from tests.test_server_flags import FIXTURES, missing_from_list, undecided

pytestmark = pytest.mark.hosts


def test_list_is_complete_against_the_engine_images_llama_server_help(
    ssh: SshRunner, gpu_hosts: list[Host], engine_image: str
) -> None:
    h = gpu_hosts[0]
    ssh(h, f"podman pull -q {engine_image}", timeout=180)
    proc = ssh(
        h,
        f"podman run --rm --network none --entrypoint /usr/bin/llama-server {engine_image} --help",
        timeout=120,
    )
    options = parse_help(proc.stdout)
    assert len(options) > 200, proc.stdout[-2000:]
    spelled = {s for o in options for s in o.spellings}
    assert {"--hf-repo", "--ctx-size", "--tools", "--path"} <= spelled
    assert missing_from_list(options) == []
    assert undecided(options) == []
    captured = (FIXTURES / "help.txt").read_text(encoding="utf-8")
    assert proc.stdout == captured, "the image's help changed: recapture tests/fixtures/..."
