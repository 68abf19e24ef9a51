"""A failed start's report puts its first error line first (fleet.unitlog): the journals are
captured on a test host (tests/fixtures/journal/: `journalctl -u UNIT --since @T0 -o cat` right
after the start failed), the script output around them is unit-activate.sh's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorless_deploy.fleet.unitlog import excerpt, first_error, read_output

pytestmark = pytest.mark.pure  # no process, no connection (tests/conftest.py)

JOURNALS = Path(__file__).parent / "fixtures" / "journal"
SINCE = "journalctl -u tensorless-tiny-p100.service --since @1796166605"


def _journal(name: str) -> list[str]:
    return (JOURNALS / name).read_text().splitlines()


def _script_output(journal: list[str], last: str) -> list[str]:
    return [
        "tensorless-tiny-p100.service failed after 0 s (its start may take 120 s): "
        "the start job failed.",
        f"journal of this start ({SINCE}):",
        *(f"  | {line}" for line in journal),
        last,
    ]


def test_the_pids_cause_comes_first_not_35_lines_down() -> None:
    journal = _journal("start-pids-not-available.txt")
    at = first_error(journal)
    assert at is not None
    assert "runtime stderr: controller `pids` is not available" in journal[at]
    report = read_output(
        _script_output(journal, "restored the previous unit; it is healthy again"), "cpu"
    )
    lines = list(report.lines)
    assert lines[0].startswith("tensorless-tiny-p100.service failed after 0 s")
    assert lines[1].startswith("first error: conmon ") and "controller `pids`" in lines[1]
    # a few lines of context: the OCI runtime's own error among them, no podman event line
    context = [x for x in lines[2:] if x.startswith("  | ")]
    assert 1 <= len(context) <= 3, lines
    assert any("Error: OCI runtime error: crun: controller `pids`" in x for x in context)
    assert not any(" container remove " in x or " image pull " in x for x in context)
    assert lines[-2] == f"({len(journal) - 1 - len(context)} more lines: {SINCE})"
    assert lines[-1] == "restored the previous unit; it is healthy again"
    assert report.why is not None and "controller `pids` is not available" in report.why


def test_a_bad_llama_flag_is_the_first_error() -> None:
    journal = _journal("start-bad-llama-flag.txt")
    at = first_error(journal)
    assert at is not None and journal[at] == "error: invalid argument: --definitely-not-a-flag"


def test_no_error_line_shows_the_last_lines() -> None:
    journal = ["Starting x.service - x...", "still loading", "", "still loading more"]
    shown, error = excerpt(journal, SINCE)
    assert error is None
    assert shown[0] == "last lines of this start (4 in all):"
    assert shown[1:3] == ["  | Starting x.service - x...", "  | still loading"]


def test_a_device_refusal_names_why_and_keeps_the_lines() -> None:
    out = [
        "tensorless-tiny-p100.service answers /health after 3 s, but is not on its card "
        "(CUDA0@0000:00:04.0).",
        "device lines of this start:",
        "  > 0.00.016.863 I load_backend: loaded CPU backend from /usr/lib/llama-server/x.so",
        "restored the previous unit; it is healthy again",
    ]
    report = read_output(out, "CUDA0@0000:00:04.0", "GPU-1")
    assert report.device is not None and not report.device.ok
    assert report.lines[0].endswith(
        "(CUDA0@0000:00:04.0): it serves on the CPU, not on GPU-1 (CUDA0 at 0000:00:04.0): "
        "its CUDA backend never loaded (it loaded: CPU), as when the container gets no "
        "libcuda.so.1 from the driver"
    )
    assert report.why is not None and report.why.startswith("not on its card: it serves on")
    assert report.lines[1:3] == tuple(out[1:3])


def test_a_healthy_cpu_engine_needs_no_device_line() -> None:
    out = ["x.service healthy after 2 s at http://127.0.0.1:8080/health, on its device (cpu)"]
    report = read_output(out, "cpu")
    assert report.device is not None and report.device.ok and report.why is None


def test_a_spawn_that_failed_at_once_names_its_cause_not_the_summary() -> None:
    # systemd logs a start task it could not spawn before its "Starting" line, then only the
    # result (seen on a test host under load: "restart failed: ...: Failed with result
    # 'resources'", with the cause left in the "more lines"); the lines are systemd's own
    # formats, the unit's stop before them included
    unit = "tensorless-tiny-p100.service"
    what = "tensorless llama-server: tensorless-test/tiny-llama-GGUF on p100"
    journal = [
        f"Stopping {unit} - {what}...",
        f"{unit}: Failed with result 'exit-code'.",
        f"Stopped {unit} - {what}.",
        f"{unit}: Failed to spawn executor: No such file or directory",
        f"{unit}: Failed to spawn 'start' task: No such file or directory",
        f"Starting {unit} - {what}...",
        f"{unit}: Failed with result 'resources'.",
        f"Failed to start {unit} - {what}.",
    ]
    at = first_error(journal)
    assert at is not None
    assert journal[at] == f"{unit}: Failed to spawn 'start' task: No such file or directory"
    # a summary with no cause before it is still the first error
    assert first_error(journal[5:]) == 1
