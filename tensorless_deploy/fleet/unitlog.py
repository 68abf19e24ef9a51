"""What the unit scripts print (operations/scripts/unit-activate.sh, unit-rollback.sh), read for
the report (pure): the journal of a failed start cut to its first error line and a few lines
after it, and the device lines of a start judged by decisions.device.

The scripts print a start's journal as ``  | LINE`` lines after a line naming it (``journal of this
start ...``), and the device lines as ``  > LINE`` after ``device lines of this start:``. On a
failure the cause is rarely the last line: a start refused by the OCI runtime prints it among
forty lines of podman events, conmon warnings and systemd's own summary, so the report shows the
first line that says an error, from the start on, then the lines after it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tensorless_deploy.decisions.device import DeviceVerdict, device_verdict
from tensorless_deploy.facts.device import parse_device_log

JOURNAL_HEAD = "journal of this start"
DEVICE_HEAD = "device lines of this start:"
NOT_ON_CARD = "but is not on its card"  # unit-activate.sh and unit-rollback.sh say it so
JOURNAL_ROW, DEVICE_ROW = "  | ", "  > "
CONTEXT_LINES = 3  # shown after the first error line
TAIL_LINES = 5  # shown when no line says an error (a start that only timed out)

# podman's own event lines (image pull, container create/init/start/died/remove ...), bare
# container ids, and blank lines: none of them says why a start failed
_NOISE = re.compile(
    r"^\s*$|^[0-9a-f]{64}$|"
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ [+-]\d{4} \S+ m=\+\S+ (container|image|pod|volume) "
)
_ERROR = re.compile(
    r"\berror\b|\bfailed\b|\bfatal\b|not available|permission denied|no such file|"
    r"\bcannot\b|\bcan't\b|\bunable to\b|\binvalid\b|out of memory|\baborted\b|"
    r"segmentation fault|core dumped|\bpanic\b",
    re.IGNORECASE,
)
# conmon's warnings about itself (an inotify watch, a cgroup file it could not open) are not a
# cause; its "runtime stderr" lines are the OCI runtime's own error
_CONMON_WARNING = re.compile(r"<nwarn>: (?!runtime stderr)")
_STARTING = re.compile(r"^Starting \S+\.service\b")
# systemd's own summary of a failed start, which names no cause; and a line systemd logs for a unit
_SUMMARY = re.compile(r"^\S+\.service: Failed with result '|^Failed to start \S+\.service\b")
_UNIT_LINE = re.compile(r"^\S+\.service: ")
_SINCE = re.compile(r"\((journalctl -u \S+ --since @\d+)\)")


def _block(lines: Sequence[str], start: int, row: str) -> list[str]:
    out = []
    for line in lines[start:]:
        if not line.startswith(row):
            break
        out.append(line[len(row) :])
    return out


def _says_error(line: str) -> bool:
    return (
        not _NOISE.search(line) and not _CONMON_WARNING.search(line) and bool(_ERROR.search(line))
    )


def first_error(journal: Sequence[str]) -> int | None:
    """The index of the first line that says an error, from the (first) start on. Where that
    is only systemd's summary of the failure (``Failed with result 'resources'``), the cause is
    the unit's own line just before the start: systemd logs a spawn that failed at once
    (``Failed to spawn 'start' task: ...``) before its ``Starting ...`` line."""
    begin = next((i for i, line in enumerate(journal) if _STARTING.match(line)), 0)
    at = next((i for i in range(begin, len(journal)) if _says_error(journal[i])), None)
    if at is None or not _SUMMARY.search(journal[at]):
        return at
    before = (
        i
        for i in range(begin - 1, -1, -1)
        if _UNIT_LINE.match(journal[i])
        and _says_error(journal[i])
        and not _SUMMARY.search(journal[i])
    )
    return next(before, at)


def excerpt(journal: Sequence[str], command: str | None = None) -> tuple[list[str], str | None]:
    """The lines a report shows of a failed start's journal, and its first error line (None:
    none says an error; then its last lines)."""
    kept = [
        i
        for i, line in enumerate(journal)
        if not _NOISE.search(line) and not _CONMON_WARNING.search(line)
    ]
    at = first_error(journal)
    if at is None:
        shown = kept[-TAIL_LINES:]
        head = [f"last lines of this start ({len(journal)} in all):"]
    else:
        after = [i for i in kept if i > at][:CONTEXT_LINES]
        shown = [at, *after]
        head = [f"first error: {journal[at]}"]
    body = [JOURNAL_ROW + journal[i] for i in shown if at is None or i != at]
    more = len(journal) - len(shown)
    tail = [f"({more} more lines: {command})"] if more > 0 and command else []
    return head + body + tail, journal[at] if at is not None else None


@dataclass(frozen=True)
class UnitReport:
    """One unit script's output, read: the lines a report shows, why it failed in one line
    (None: it did not, or it says nothing more than its own first line), and the device."""

    lines: tuple[str, ...]
    why: str | None
    device: DeviceVerdict | None


def read_output(lines: Sequence[str], label: str | None, uuid: str | None = None) -> UnitReport:
    """A unit script's output lines, with its journal block cut to the first error and its
    device lines judged against the unit's io.tensorless.device label (None: not known)."""
    out: list[str] = []
    why: str | None = None
    device: DeviceVerdict | None = None
    failed_on_card = any(NOT_ON_CARD in line for line in lines)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(JOURNAL_HEAD):
            journal = _block(lines, i + 1, JOURNAL_ROW)
            m = _SINCE.search(line)
            shown, error = excerpt(journal, m.group(1) if m else None)
            out += shown
            why = why or error
            i += 1 + len(journal)
            continue
        if line == DEVICE_HEAD:
            found = _block(lines, i + 1, DEVICE_ROW)
            if label is not None:
                device = device_verdict(label, parse_device_log(found), uuid)
            if failed_on_card and device is not None and device.why and out:
                out[-1] = f"{out[-1].rstrip('.')}: {device.why}"
                why = why or f"not on its card: {device.why}"
            out += [line, *(DEVICE_ROW + f for f in found)]
            i += 1 + len(found)
            continue
        out.append(line)
        i += 1
    if device is None and label is not None and not failed_on_card:
        # a CPU engine prints no device lines: its verdict needs none
        device = device_verdict(label, parse_device_log([]), uuid) if label == "cpu" else None
    return UnitReport(tuple(out), why, device)
