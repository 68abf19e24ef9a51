"""The values host programs share with the Python side live once, in Python (tensorless_deploy.
shell and hub.STAMP_STAT), and reach the scripts only through host.sh's bound parameters:
changing a constant changes what the scripts do, and a script with a copy of its own fails here,
named."""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tensorless_deploy import hub, shell
from tensorless_deploy.facts.parsers import parse_deployed_units
from tensorless_deploy.facts.values import LABEL_HEALTH
from tensorless_deploy.local.run import health_status

ROOT = Path(__file__).resolve().parent.parent / "tensorless_deploy"
HOST_LIB = ROOT / "scripts" / "host.sh"

# What a copy of a shared value looks like in a script: each is host.sh's alone
COPIES = {
    "a time bound of its own for a GET (host.sh http_code, td_http_max_time)": r"--max-time [0-9]",
    "a hash of its own (host.sh hashit, hash_stream)": r"sha256sum|openssl dgst",
    # the blob's stamp (a partial's SIZE MTIME record is the model scripts' own)
    "a stamp format of its own (host.sh stamp_of)": r"%s %Y %n|stat -c '%s %Y' \"\$b(lob)?\"",
    "a unit directory of its own (td_quadlet_dir, td_systemd_dir)": (
        r"/etc/containers/systemd|/etc/systemd/system"
    ),
    "a unit name prefix of its own (td_unit_prefix)": r"tensorless-\*",
    "a health label reader of its own (host.sh health_url)": r"io\\\.tensorless\\\.health",
}


def _run(script: str) -> str:
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
    return done.stdout


def test_no_host_script_keeps_a_copy_of_a_shared_value() -> None:
    copies = []
    for path in sorted(ROOT.glob("*/scripts/*.sh")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in COPIES.items():
                if re.search(pattern, line):
                    copies.append(f"{path.relative_to(ROOT.parent)}:{n}: {what}")
    assert not copies, "\n".join(copies)


def test_no_python_probe_has_a_bound_of_its_own() -> None:
    """The Python probes (facts.pyinfra.HttpStatus, local.run.health_status, the container's
    health check) take shell.HEALTH_TIMEOUT_S too."""
    pattern = re.compile(r"--max-time[\"',]* *[0-9]")
    found = [
        f"{path.relative_to(ROOT.parent)}:{n}"
        for path in sorted(ROOT.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found
    assert "shell.HEALTH_TIMEOUT_S" in inspect.getsource(health_status)


def test_the_probe_waits_as_long_as_the_constant_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that takes the connection and never answers: http_code gives up after
    shell.HEALTH_TIMEOUT_S, whatever that is."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        url = f"http://127.0.0.1:{server.getsockname()[1]}/health"
        for bound in (1, 2):
            monkeypatch.setattr(shell, "HEALTH_TIMEOUT_S", bound)
            t0 = time.monotonic()
            assert _run(shell.with_host_lib(f"http_code {url}")) == "000"
            took = time.monotonic() - t0
            assert bound - 0.2 < took < bound + 1.5, (bound, took)


def test_the_unit_reader_reads_where_the_constants_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one reader of the unit files (facts/scripts/units.sh) finds the units in
    shell.QUADLET_DIR and SYSTEMD_DIR by shell.UNIT_PREFIX, hashes them as Python does, and asks
    /health where the label says."""
    quadlets, services = tmp_path / "q", tmp_path / "s"
    quadlets.mkdir()
    services.mkdir()
    unit = f'[Container]\nLabel="{LABEL_HEALTH}=http://127.0.0.1:9/health"\n'
    (quadlets / "tlx-a-p100.container").write_text(unit)
    (services / "tlx-b-h200.service").write_text("[Service]\n")
    (quadlets / "tensorless-c-p100.container").write_text(unit)  # not this prefix: not ours
    monkeypatch.setattr(shell, "QUADLET_DIR", str(quadlets))
    monkeypatch.setattr(shell, "SYSTEMD_DIR", str(services))
    monkeypatch.setattr(shell, "UNIT_PREFIX", "tlx-")
    out = _run(shell.program("tensorless_deploy.facts", "deployed-units"))
    units = parse_deployed_units(out)
    assert [(u.name, u.kind) for u in units] == [
        ("tlx-a-p100", "quadlet"),
        ("tlx-b-h200", "service"),
    ]
    assert units[0].sha256 == hashlib.sha256(unit.encode()).hexdigest()
    assert units[0].unit_labels == {LABEL_HEALTH: "http://127.0.0.1:9/health"}
    assert "@@health 000" in out.splitlines()  # asked, and nothing listens there


def test_the_stamp_is_what_python_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"x" * 123)
    st = os.stat(blob)
    said = _run(shell.with_host_lib(f"stamp_of {blob}")).strip()
    assert said == hub.stamp_text(st.st_size, int(st.st_mtime), str(blob))
    monkeypatch.setattr(hub, "STAMP_STAT", "%s")
    assert _run(shell.with_host_lib(f"stamp_of {blob}")).strip() == "123"


def test_health_url_reads_the_label_python_writes(tmp_path: Path) -> None:
    unit = tmp_path / "u.container"
    unit.write_text(f'Label="{LABEL_HEALTH}=https://10.0.0.1:8443/health"\n')
    assert _run(shell.with_host_lib(f"health_url {unit}")).strip() == "https://10.0.0.1:8443/health"
