"""The survey's shell really runs: POSIX sh, real coreutils/ss/kernel, pyinfra's @local connector.

Only nvidia-smi and nvidia-ctk are stand-ins (docs/design.md#tests-against-real-components):
scripts that print the captured bytes
of tests/fixtures and exit with the code the real tool did. The CDI specs are real files in a
temporary folder that the survey is pointed at.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorless_deploy.facts import pyinfra as host_facts
from tensorless_deploy.facts.parsers import NVIDIA_SMI_QUERY, parse_ss
from tensorless_deploy.facts.survey import all_sections, host_facts_from_survey, survey_script
from tensorless_deploy.facts.values import HostFacts, blocking_listeners

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "nvidia-smi" / "h200-driver-580"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _stand_in(bin_dir: Path, name: str, expected_args: str, output: Path, code: int) -> None:
    """A script that answers only the exact arguments the survey must pass."""
    script = bin_dir / name
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$*" != {_sh_quote(expected_args)} ]; then echo "unexpected: $*" >&2; exit 99; fi\n'
        f"cat {_sh_quote(str(output))}\n"
        f"exit {code}\n"
    )
    script.chmod(0o755)


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@pytest.fixture
def stand_ins(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    version = tmp_path / "ctk-version.out"
    version.write_text(
        "NVIDIA Container Toolkit CLI version 1.17.8\n"
        "commit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d\n"
    )
    _stand_in(bin_dir, "nvidia-ctk", "--version", version, 0)
    return bin_dir


@pytest.fixture
def cdi_dirs(tmp_path: Path) -> list[str]:
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    etc.mkdir()
    run.mkdir()
    shutil.copy(FIXTURES / "cdi" / "h200-535.183.01-stale.yaml", etc / "nvidia.yaml")
    # no trailing newline: the framing must still hold
    (run / "nvidia.yaml").write_text(
        (FIXTURES / "cdi" / "h200-580.159.04.yaml").read_text().rstrip("\n")
    )
    (run / "ignored.txt").write_text("not a spec name")
    return [str(etc), str(run), str(tmp_path / "no-such-dir")]


def _run_survey(path: str, models_dir: str, cdi: list[str]) -> HostFacts:
    script = survey_script(all_sections(models_dir, cdi))
    done = subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        env={"PATH": path, "LANG": "C"},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return host_facts_from_survey(done.stdout)


def test_survey_reads_a_gpu_host(stand_ins: Path, cdi_dirs: list[str], tmp_path: Path) -> None:
    smi_args = NVIDIA_SMI_QUERY.split(" ", 1)[1]
    _stand_in(stand_ins, "nvidia-smi", smi_args, H200 / "query-csv.out", 0)
    facts = _run_survey(f"{stand_ins}:{SYSTEM_PATH}", str(tmp_path / "models" / "sub"), cdi_dirs)

    assert facts.gpus.state == "ok"
    assert facts.driver_version == "580.159.04"
    assert [gpu.uuid for gpu in facts.gpus.gpus] == ["GPU-ab6a0263-0ae2-1846-2f4f-455ff8b12167"]
    assert facts.toolkit is not None and facts.toolkit.version == (1, 17, 8)
    assert facts.cdi is not None
    assert [spec.path for spec in facts.cdi.specs] == [
        f"{cdi_dirs[0]}/nvidia.yaml",
        f"{cdi_dirs[1]}/nvidia.yaml",
    ]
    assert all(spec.error is None for spec in facts.cdi.specs)
    assert facts.cdi.stale == (f"{cdi_dirs[0]}/nvidia.yaml",)
    assert list(facts.cdi.duplicate_kinds) == ["nvidia.com/gpu"]
    assert facts.cdi.addressable_uuids == ("GPU-ab6a0263-0ae2-1846-2f4f-455ff8b12167",)
    assert facts.disk is not None
    assert facts.disk.checked_path == str(tmp_path)
    assert not facts.disk.path_exists and facts.disk.available_bytes > 0
    assert facts.cpus == len(os.sched_getaffinity(0))
    assert facts.init is not None
    assert facts.init.pid1 == Path("/proc/1/comm").read_text().strip()
    if shutil.which("ss", path=SYSTEM_PATH):
        assert facts.listeners is not None and facts.problems == ()


def test_survey_keeps_nvidia_smi_exit_9_as_a_state(stand_ins: Path, tmp_path: Path) -> None:
    smi_args = NVIDIA_SMI_QUERY.split(" ", 1)[1]
    out = FIXTURES / "nvidia-smi" / "no-driver" / "query-csv.out"
    _stand_in(stand_ins, "nvidia-smi", smi_args, out, 9)
    facts = _run_survey(f"{stand_ins}:{SYSTEM_PATH}", "/var/lib/tensorless/models", [])
    assert facts.gpus.state == "no_driver"
    assert facts.gpus.exit_code == 9
    assert "couldn't communicate with the NVIDIA driver" in facts.gpus.message


def _hung_smi(bin_dir: Path, *, ignore_term: bool = False) -> None:
    """nvidia-smi on a wedged NVML: it never answers (the stand-in sleeps)."""
    trap = "trap '' TERM\n" if ignore_term else ""
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{trap}sleep 300\n")
    script.chmod(0o755)


def _end_left_behind(bin_dir: Path) -> None:
    """End what this test left running: the processes whose PATH holds its own stand-in folder
    (a tmp folder of this test alone), each by its pid."""
    import signal

    mine = f"PATH={bin_dir}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(var.startswith(mine) for var in environ):
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)


def _survey_seconds(path: str, tmp_path: Path) -> tuple[HostFacts, float]:
    import time

    start = time.monotonic()
    facts = _run_survey(path, str(tmp_path / "models"), [str(tmp_path)])
    return facts, time.monotonic() - start


def test_a_hung_nvidia_smi_is_a_state_and_the_survey_goes_on(
    stand_ins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """coreutils timeout ends the hung probe at the bound (exit 124); every other section
    answers as usual."""
    from tensorless_deploy.facts import survey

    if not shutil.which("timeout", path=SYSTEM_PATH):
        pytest.skip("no coreutils timeout here")
    monkeypatch.setattr(survey, "PROBE_TIMEOUT_S", 2)
    _hung_smi(stand_ins)
    facts, seconds = _survey_seconds(f"{stand_ins}:{SYSTEM_PATH}", tmp_path)
    assert facts.gpus.state == "hung" and facts.gpus.exit_code == 124
    assert 2 <= seconds < 10, seconds
    assert facts.toolkit is not None and facts.toolkit.version == (1, 17, 8)
    assert facts.cpus == len(os.sched_getaffinity(0)) and facts.disk is not None


def test_a_probe_that_cannot_be_killed_is_left_behind(
    stand_ins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe no signal ends (nvidia-smi in uninterruptible sleep: SIGKILL waits for the
    driver): here a `timeout` that cannot end its child, and a child that ignores SIGTERM. The
    survey stops waiting 5 s after the bound, reads it as timed out, and goes on."""
    from tensorless_deploy.facts import survey

    monkeypatch.setattr(survey, "PROBE_TIMEOUT_S", 1)
    _hung_smi(stand_ins, ignore_term=True)
    powerless = stand_ins / "timeout"
    powerless.write_text('#!/bin/sh\nshift 3\nexec "$@"\n')  # timeout -k 2 N CMD...: no bound
    powerless.chmod(0o755)
    try:
        facts, seconds = _survey_seconds(f"{stand_ins}:{SYSTEM_PATH}", tmp_path)
    finally:
        _end_left_behind(stand_ins)
    assert facts.gpus.state == "hung" and facts.gpus.exit_code == 124
    assert 6 <= seconds < 15, seconds
    assert facts.toolkit is not None and facts.toolkit.version == (1, 17, 8)


def test_without_timeout_the_watchdog_alone_bounds_a_probe(
    stand_ins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host without coreutils timeout: the survey's own watchdog bounds the probe."""
    from tensorless_deploy.facts import survey

    monkeypatch.setattr(survey, "PROBE_TIMEOUT_S", 1)
    _hung_smi(stand_ins)
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("sh", "sleep", "cat", "mktemp", "rm", "mv", "kill", "ls", "grep", "df", "nproc"):
        found = shutil.which(tool, path=SYSTEM_PATH)
        if found:
            (bare / tool).symlink_to(found)
    try:
        facts, seconds = _survey_seconds(f"{stand_ins}:{bare}", tmp_path)
    finally:
        _end_left_behind(stand_ins)
    assert facts.gpus.state == "hung" and facts.gpus.exit_code == 124
    assert 1 <= seconds < 8, seconds


def test_survey_without_nvidia_tools(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi", path=SYSTEM_PATH) or shutil.which("nvidia-ctk", path=SYSTEM_PATH):
        pytest.skip("this machine has NVIDIA tools in its system PATH")
    facts = _run_survey(SYSTEM_PATH, "/var/lib/tensorless/models", [str(tmp_path)])
    assert facts.gpus.state == "absent"
    assert facts.toolkit is not None and not facts.toolkit.present
    assert facts.cdi is not None and facts.cdi.specs == ()


def test_pyinfra_runs_the_facts_on_local(
    stand_ins: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The FactBase classes through pyinfra itself (the @local connector runs sh -c)."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all

    smi_args = NVIDIA_SMI_QUERY.split(" ", 1)[1]
    _stand_in(stand_ins, "nvidia-smi", smi_args, H200 / "query-csv.out", 0)
    monkeypatch.setenv("PATH", f"{stand_ins}:{SYSTEM_PATH}")
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    local = inventory.get_host("@local")

    # the facts return plain data, as pyinfra's own do; the typed values come from typed()
    plain = local.get_fact(host_facts.HostSurvey, models_dir=str(tmp_path))
    assert json.loads(json.dumps(plain)) == plain
    gpus = host_facts.NvidiaGpus.typed(local.get_fact(host_facts.NvidiaGpus))
    assert gpus.state == "ok" and gpus.driver_version == "580.159.04"
    toolkit = host_facts.NvidiaContainerToolkit.typed(
        local.get_fact(host_facts.NvidiaContainerToolkit)
    )
    assert toolkit.version == (1, 17, 8)
    disk = host_facts.FreeDisk.typed(
        local.get_fact(host_facts.FreeDisk, path=str(tmp_path / "not yet"))
    )
    assert disk.checked_path == str(tmp_path)
    survey = host_facts.HostSurvey.typed(plain)
    assert isinstance(survey, HostFacts) and survey.disk is not None
    assert survey.disk.path_exists
    assert survey.gpus == gpus
    assert not state.failed_hosts


# --- the port verdict against the kernel's own -------------------------------------------------


def _listen(
    family: socket.AddressFamily, address: str, v6only: bool | None = None
) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    if v6only is not None:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
    sock.bind((address, 0))
    sock.listen()
    return sock


@pytest.fixture
def listeners() -> Iterator[list[socket.socket]]:
    if not socket.has_ipv6 or not shutil.which("ss"):
        pytest.skip("needs IPv6 and ss")
    try:
        socks = [
            _listen(socket.AF_INET, "0.0.0.0"),
            _listen(socket.AF_INET, "127.0.0.1"),
            _listen(socket.AF_INET6, "::", v6only=True),
            _listen(socket.AF_INET6, "::", v6only=False),
            _listen(socket.AF_INET6, "::1", v6only=True),
            _listen(socket.AF_INET6, "::ffff:127.0.0.1", v6only=False),
        ]
    except OSError as exc:
        pytest.skip(f"cannot open test listeners: {exc}")
    yield socks
    for sock in socks:
        sock.close()


def _bind_fails(address: str, port: int) -> bool:
    """Try the bind; "::" means IPv6 only, "*" the dual-stack wildcard. With SO_REUSEADDR, as
    servers set it: then only a listener blocks the bind (what the verdict is about), not another
    program's connection that happens to use the same local port (a CI run's bind of 127.0.0.1
    failed with no IPv4 listener on the port, most likely so, while the test hosts booted)."""
    family = socket.AF_INET6 if ":" in address or address == "*" else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(address != "*"))
        sock.bind(("::" if address == "*" else address, port))
    except OSError:
        return True
    finally:
        sock.close()
    return False


def test_port_verdict_matches_the_kernel(listeners: list[socket.socket]) -> None:
    done = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, check=True)
    parsed = parse_ss(done.stdout, done.returncode)
    for sock in listeners:
        port = sock.getsockname()[1]
        assert any(lst.port == port for lst in parsed), f"ss did not show port {port}"
        for bind in ("127.0.0.1", "0.0.0.0", "::1", "::", "*"):
            predicted = bool(blocking_listeners(parsed, port, bind))
            assert predicted == _bind_fails(bind, port), (port, bind, done.stdout)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_host_scripts_are_shellcheck_clean() -> None:
    """Every program that runs on hosts (tensorless_deploy/scripts/*.sh and */scripts/*.sh) is
    POSIX sh that
    shellcheck accepts."""
    root = Path(__file__).parent.parent / "tensorless_deploy"
    scripts = sorted([*root.glob("scripts/*.sh"), *root.glob("*/scripts/*.sh")])
    assert scripts
    subprocess.run(["shellcheck", "-s", "sh", *map(str, scripts)], check=True)
