"""What the commands share: the catalog they read, the operator's flags as one value, the
refusal of a host plan, and the per-host deploy report (text and JSON)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorless_deploy.cli.output import own, paint
from tensorless_deploy.errors import TensorlessError

if TYPE_CHECKING:
    from tensorless_deploy.decisions.checks import Check
    from tensorless_deploy.decisions.options import Flags, Instances
    from tensorless_deploy.fleet.runner import HostResult
    from tensorless_deploy.recipe import Catalog

COLOURS = {
    "changed": "33",
    "unchanged": "32",
    "no change": "32",
    "would change": "33",
    "failed": "1;31",
    "skipped": "1;31",
    "unreachable": "1;31",
    "untouched": "33",
}


def catalog_from(args: argparse.Namespace) -> Catalog:
    from tensorless_deploy.recipe import load_catalog  # pydantic and the schema: not for --help

    recipes: Path | None = getattr(args, "recipes", None)
    return load_catalog(recipes)


def recipes_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--recipes",
        type=Path,
        metavar="DIR",
        help="read DIR/<org>/<repo>/<card>.toml, not the built-in catalog",
    )


def hosts_flags(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """-i INVENTORY or --local, and --limit."""
    where = p.add_mutually_exclusive_group(required=required)
    where.add_argument(
        "-i", "--inventory", metavar="INVENTORY", help="pyinfra inventory file (see docs)"
    )
    where.add_argument("--local", action="store_true", help="this machine only")
    limit_flag(p)
    host_timeout_flag(p)


def inventory_flags(
    p: argparse.ArgumentParser, *, required: bool = True, help: str = "pyinfra inventory file"
) -> None:
    """-i INVENTORY (no --local: the command works on inventory hosts), and --limit."""
    p.add_argument("-i", "--inventory", required=required, metavar="INVENTORY", help=help)
    limit_flag(p)
    host_timeout_flag(p)


def limit_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", action="append", metavar="HOST", help="only this host (repeatable)")


def host_timeout_flag(p: argparse.ArgumentParser) -> None:
    """--host-timeout: how long a host may be silent over SSH before it is unreachable."""
    from tensorless_deploy.decisions.options import DEFAULT_HOST_TIMEOUT_S

    p.add_argument(
        "--host-timeout",
        type=int,
        metavar="SECONDS",
        help="a host silent over SSH this long (connect, any step) is unreachable and the "
        f"others go on (default: tensorless_host_timeout, else {DEFAULT_HOST_TIMEOUT_S})",
    )


def wait_lock_flag(p: argparse.ArgumentParser) -> None:
    """--wait-lock: how long a command that changes hosts waits for another run's lock."""
    p.add_argument(
        "--wait-lock",
        type=int,
        metavar="SECONDS",
        help="wait up to SECONDS for another run that holds a host's lock (default: 0, refuse "
        "at once, naming it)",
    )


def drain_timeout_flag(p: argparse.ArgumentParser) -> None:
    """--drain-timeout: how long a change waits for a serving instance's requests in flight."""
    from tensorless_deploy.decisions.options import DEFAULT_DRAIN_TIMEOUT_S

    p.add_argument(
        "--drain-timeout",
        type=int,
        metavar="SECONDS",
        help="before an instance that serves is restarted or stopped, wait up to SECONDS for "
        "its requests in flight to finish (its /slots idle), then go on and say so; 0: no "
        f"wait (default: tensorless_drain_timeout, else {DEFAULT_DRAIN_TIMEOUT_S})",
    )


def dry_run_flag(p: argparse.ArgumentParser) -> None:
    """--dry-run on every command that changes something (--dry, its older spelling, too)."""
    p.add_argument(
        "--dry-run",
        "--dry",
        dest="dry_run",
        action="store_true",
        help="show what would change; change nothing",
    )


def serving_flags(p: argparse.ArgumentParser) -> None:
    """--port and --bind of the commands that judge or converge inventory hosts: each wins over
    the host's tensorless_port / tensorless_bind (decisions.options.resolve)."""
    p.add_argument(
        "--port", type=int, metavar="N", help="API port (default: tensorless_port, else 8080)"
    )
    p.add_argument(
        "--bind", metavar="ADDR", help="API address (default: tensorless_bind, else 127.0.0.1)"
    )


def access_flags(p: argparse.ArgumentParser, bind: str, key_help: str | None = None) -> None:
    """Who may call the API, on the command line (deploy reads the same from the inventory):
    the key, the keyless wide bind on purpose, TLS, /metrics."""
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        help=key_help or "callers must send the key in FILE (one line; /health needs none)",
    )
    p.add_argument(
        "--insecure-open",
        action="store_true",
        help=f"allow a non-loopback {bind} without an API key",
    )
    p.add_argument("--tls-cert-file", metavar="FILE", help="serve https with this PEM cert")
    p.add_argument("--tls-key-file", metavar="FILE", help="... and this PEM private key")
    p.add_argument("--metrics", action="store_true", help="llama-server's /metrics (tuned)")
    p.add_argument(
        "--cors-origins",
        metavar="ORIGINS",
        help="browser origins that may call the API: localhost (default: loopback origins "
        "only), scheme://host[:port],... or * (with --api-key-file)",
    )


def access_from(args: argparse.Namespace, flags: Flags) -> Flags:
    """flags with the access_flags given on this command line, checked (a TLS file without its
    pair is one line naming the flag)."""
    import dataclasses

    from tensorless_deploy.decisions.options import SETTINGS, check_flags

    return check_flags(
        dataclasses.replace(flags, **{s.name: _given(args, s.name) for s in SETTINGS if s.access})
    )


def _given(args: argparse.Namespace, name: str) -> Any:
    """A setting's value on this command line; None: not given (a switch left off too)."""
    value = getattr(args, name, None)
    return None if value is False else value


def instances_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--instances",
        metavar="N|all|GPUS",
        help="instances per host, one per card: all (default), a count, or GPU indices/UUIDs "
        "(0,1 or GPU-...); overrides tensorless_instances",
    )


def flags_from(args: argparse.Namespace, **names: str) -> Flags:
    """The operator options given on this command line, checked before any host is touched
    (names: this command's own spelling of a flag, e.g. run's --host for the bind address)."""
    if getattr(args, "gpu", None) is not None:
        names = {"instances": "--gpu", **names}
    from tensorless_deploy.decisions.options import SETTINGS, Flags, check_flags

    # the access settings are access_from's (run, serve, export), the instances _instances_arg's
    given = {s.name: _given(args, s.name) for s in SETTINGS if not s.access}
    return check_flags(
        Flags(
            **{**given, "instances": _instances_arg(args)},
            extra_args=tuple(getattr(args, "extra", ()) or ()),
            allow_draft=getattr(args, "allow_draft", False),
            flag_names=names or None,
            offered=frozenset(
                s.name
                for s in SETTINGS
                if hasattr(args, s.name) or (s.name == "instances" and hasattr(args, "gpu"))
            ),
        )
    )


def _instances_arg(args: argparse.Namespace) -> Instances | None:
    text = getattr(args, "instances", None)
    gpu = getattr(args, "gpu", None)
    if gpu is not None:  # one card, named by index or UUID: never a count
        return (int(gpu) if gpu.isdigit() else gpu,)
    from tensorless_deploy.decisions.options import parse_instances

    return parse_instances(text) if text is not None else None


class Refused(TensorlessError):
    """A host plan refused; its failed checks say why and how to fix each."""

    def __init__(self, what: str, checks: Sequence[Check]) -> None:
        super().__init__(f"{what}: refused on this machine")
        self.failed_checks = tuple(checks)

    def lines(self) -> list[str]:
        out = [self.message]
        for c in self.failed_checks:
            out.append(f"  {c.id}: {c.evidence}")
            if c.fix:
                out.append(f"    fix: {c.fix}")
        return out


def result_json(r: HostResult) -> dict[str, Any]:
    return {
        "host": r.host,
        "outcome": r.outcome,
        "ok": r.ok,
        "reason": r.reason,
        "recipe": r.recipe,
        "recipe_digest": r.recipe_digest,
        "card": r.card,
        "address": r.address,
        "addresses": list(r.addresses),
        "transfer": r.transfer,
        "tuned": None if r.tuning is None else r.tuning.tuned,
        "untuned_reasons": [] if r.tuning is None else list(r.tuning.reasons),
        "devices": list(r.devices),
        "failed_checks": [
            {"id": c.id, "evidence": c.evidence, "fix": c.fix} for c in r.failed_checks
        ],
        "steps": [
            {"name": s.name, "outcome": s.outcome, "output": list(s.output), "seconds": s.seconds}
            for s in r.steps
        ],
    }


def untuned_line(reasons: Sequence[str]) -> str:
    return (
        paint("untuned", "33") + ": " + "; ".join(reasons) + " (the receipt's numbers do not apply)"
    )


def devices_line(r: HostResult) -> str | None:
    """What a serving host's instances run on, as their start logs say: one line."""
    known = [(a, d) for a, d in zip(r.addresses, r.devices, strict=False) if d]
    if not known or not r.ok:
        return None
    if len({d for _, d in known}) == 1:
        return f"device: {known[0][1]}"
    return "devices: " + "; ".join(f"{a} {d}" for a, d in known)


def print_results(results: Sequence[HostResult], verbose: int) -> None:
    for r in results:
        head = f"{r.host}: {paint(r.outcome, COLOURS.get(r.outcome, '0'))}"
        if r.card:
            head += f"  {r.recipe}"
        if r.address and r.ok:
            # a dry run's "no change" host serves there already; "would change" only would
            verb = "would serve on" if r.outcome == "would change" else "serving on"
            head += f"  {verb} {r.address}"
            if r.serving_digest:  # read back from the host after the run
                head += f"  recipe {r.serving_digest[:19]}"
        print(head)
        line = devices_line(r)
        if line:
            print(f"  {line}")
        if r.transfer and r.transfer.startswith("push"):
            print(f"  transfer: {r.transfer}")
        if r.tuning is not None and not r.tuning.tuned:
            print("  " + untuned_line(r.tuning.reasons))
        if r.reason and not r.ok:
            print(f"  {r.reason}")
        for c in r.failed_checks:
            if c.fix:
                print(f"  fix {c.id}: {c.fix}")
        for s in r.steps:
            if s.outcome == "failed" or verbose:
                print(f"  {s.name}: {s.outcome}")
                for line in s.output if (s.outcome == "failed" or verbose > 1) else ():
                    print(f"    {line}")


def rate_eta(done: int, total: int, moved: int, seconds: float) -> str:
    """ "12.3 MB/s, ETA 0:42" from bytes moved in seconds (empty until a rate can be told)."""
    if seconds < 0.5 or moved <= 0:
        return ""
    rate = moved / seconds
    left = max(total - done, 0) / rate
    return f", {rate / 1e6:,.1f} MB/s, ETA {int(left) // 60}:{int(left) % 60:02d}"


class Bar:
    """A one-line progress bar on stderr (redrawn only on a terminal, at most 10 times a second,
    never with --json): percent, MB, rate and time left."""

    def __init__(self, label: str, total: int, *, quiet: bool = False) -> None:
        self.label, self.total, self.last = label, total, 0.0
        self.tty = sys.stderr.isatty() and not quiet
        self.t0 = time.monotonic()
        self.first: int | None = None

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first, self.t0 = done, now  # a resumed file's bytes are no part of the rate
        if not self.tty or (now - self.last < 0.1 and done < total):
            return
        self.last = now
        pct = 100 * done / total if total else 100.0
        bar = "#" * int(pct / 5)
        cr = own("\r", sys.stderr)  # the bar's own carriage return passes the terminal guard
        speed = rate_eta(done, total, done - self.first, now - self.t0)
        sys.stderr.write(
            f"{cr}{self.label} [{bar:<20}] {pct:5.1f}% {done / 1e6:,.1f}/{total / 1e6:,.1f} MB"
            f"{speed}   "
        )
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


class FleetProgress:
    """Transfers on many hosts at once (fleet.push.Progress), one line per kind of transfer on a
    terminal: hosts, MB there of the total, rate, time left, and the slowest host. Nothing on a
    pipe or with --json. close() ends an open line (a host that stopped never reaches 100 %)."""

    def __init__(self, *, quiet: bool = False) -> None:
        self.tty = sys.stderr.isatty() and not quiet
        self.hosts: dict[str, dict[str, tuple[int, int]]] = {}  # what -> host -> (done, total)
        self.start: dict[str, tuple[float, int]] = {}  # what -> (first seen, bytes then)
        self.open: str | None = None
        self.last = 0.0
        self.ended: dict[str, tuple[tuple[str, int, int], ...]] = {}  # what -> rows at 100 %

    def __call__(self, host: str, what: str, done: int, total: int) -> None:
        if not self.tty:
            return
        if what in self.ended and host not in {h for h, _, _ in self.ended[what]}:
            # a later batch of a roll: a transfer of its own, its own line, rate and time left
            del self.ended[what], self.start[what], self.hosts[what]
        rows = self.hosts.setdefault(what, {})
        rows[host] = (done, total)
        now = time.monotonic()
        have = sum(d for d, _ in rows.values())
        want = sum(t for _, t in rows.values())
        if what not in self.start:
            self.start[what] = (now, have)
        finished = have >= want
        snapshot = tuple((h, d, t) for h, (d, t) in sorted(rows.items()))
        if finished and self.ended.get(what) == snapshot:
            return  # drawn at 100 % already: the same report again says nothing new
        if self.open not in (None, what):
            self._end()
        if not finished and self.open == what and now - self.last < 0.25:
            return  # at most four redraws a second; a new line is drawn at once
        self.last = now
        t0, had = self.start[what]
        pct = 100 * have / want if want else 100.0
        slow_host, (d, t) = min(rows.items(), key=lambda kv: kv[1][0] / (kv[1][1] or 1))
        slowest = f"; slowest {slow_host} {100 * d / (t or 1):.0f}%" if len(rows) > 1 else ""
        line = (
            f"{what}: {len(rows)} host(s), {have / 1e6:,.1f}/{want / 1e6:,.1f} MB ({pct:.0f}%)"
            f"{rate_eta(have, want, have - had, now - t0)}{'' if finished else slowest}"
        )
        sys.stderr.write(f"{own(chr(13), sys.stderr)}{line}   ")
        self.open = what
        if finished:
            self.ended[what] = snapshot
            self._end()
        sys.stderr.flush()

    def _end(self) -> None:
        if self.open is not None:
            sys.stderr.write("\n")
            self.open = None

    def close(self) -> None:
        if self.tty:
            self._end()
            sys.stderr.flush()
