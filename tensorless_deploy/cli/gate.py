"""gate: the release gate. `gate check` judges a recipes checkout against a base revision (for a
recipes repository's CI); `gate run` measures a recipe on its card and writes its receipt (for
the person with the card)."""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorless_deploy.cli.common import catalog_from, inventory_flags, wait_lock_flag
from tensorless_deploy.cli.output import emit_json, paint, write_atomic
from tensorless_deploy.errors import TensorlessError, UsageError

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.fleet.gate import GateResult
    from tensorless_deploy.local.bench import Summary


def _recipes_flag(p: argparse.ArgumentParser, default: Any) -> None:
    # on `gate` and on each of its commands, like --json: given before or after the command
    p.add_argument(
        "--recipes",
        type=Path,
        metavar="DIR",
        default=default,
        help="read DIR/<org>/<repo>/<card>.toml, not the built-in catalog",
    )


def cmd_gate(args: argparse.Namespace) -> int:  # pragma: no cover - argparse requires one
    raise UsageError("gate: say check or run", fix="see tensorless-deploy gate --help")


def cmd_gate_check(args: argparse.Namespace) -> int:
    from tensorless_deploy.recipe import builtin_recipes_dir
    from tensorless_deploy.recipe.gate import judge
    from tensorless_deploy.recipe.history import history

    root: Path = args.recipes if args.recipes is not None else builtin_recipes_dir()
    h = history(root, args.base)
    files: list[dict[str, str]] = []
    violations = []
    counts = {"new": 0, "changed": 0, "deleted": 0, "unchanged": 0}
    for v in h.files:
        kind, found = ("unchanged", []) if v.same else judge(v.path, v.old, v.new, args.base)
        counts[kind] += 1
        if kind != "unchanged":
            files.append({"file": v.path, "change": kind})
        violations += found
    total = sum(counts[k] for k in ("new", "changed", "unchanged"))
    if args.json:
        emit_json(
            {
                "ok": not violations,
                "base": args.base,
                "base_commit": h.commit,
                "repository": str(h.top),
                "recipes": h.prefix or ".",
                "checked": total,
                "files": files,
                "violations": [
                    {"file": x.file, "table": x.table, "problem": x.problem} for x in violations
                ],
            }
        )
    else:
        for x in violations:
            print(x.line())
        changes = ", ".join(f"{counts[k]} {k}" for k in ("new", "changed", "deleted"))
        verdict = f"{len(violations)} violation(s)" if violations else paint("all hold", "32")
        print(
            f"gate check: {total} recipe(s) in {h.prefix or '.'} against {args.base} "
            f"({h.commit[:12]}): {changes}; {verdict}"
        )
    return 1 if violations else 0


def _figures(name: str, s: Summary, key: str) -> str:
    med, lo, hi = (
        (s.decode_median, s.decode_min, s.decode_max)
        if key == "decode"
        else (s.prefill_median, s.prefill_min, s.prefill_max)
    )
    return f"  {name:<15}{med:9.2f} tok/s  (min {lo:.2f}, max {hi:.2f})"


def _result_json(r: GateResult, path: Path, written: bool) -> dict[str, Any]:
    def spread(s: Summary | None, key: str) -> dict[str, Any] | None:
        if s is None:
            return None
        if key == "decode":
            return {"median": s.decode_median, "min": s.decode_min, "max": s.decode_max}
        return {"median": s.prefill_median, "min": s.prefill_min, "max": s.prefill_max}

    return {
        "ok": written,
        "host": r.host,
        "unit": r.unit,
        "port": r.port,
        "gpu": {"index": r.gpu.index, "uuid": r.gpu.uuid, "name": r.gpu.name},
        "driver": r.driver,
        "image": r.image_seen,
        "tuned": r.tuning.tuned,
        "untuned_reasons": list(r.tuning.reasons),
        "runs": r.summary.runs,
        "prompt_tokens": r.summary.prompt_n,
        "generated_tokens": r.summary.predicted_n,
        "decode_tps": spread(r.summary, "decode"),
        "prefill_tps": spread(r.summary, "prefill"),
        "prefill_4k": spread(r.prefill_4k, "prefill"),
        "prefill_4k_tokens": r.prefill_4k.prompt_n if r.prefill_4k else None,
        "prefill_4k_note": r.prefill_note,
        "comparisons": [
            {
                "key": c.key,
                "measured": c.measured,
                "receipt": c.receipt,
                "ratio": c.ratio,
                "meets": c.meets,
            }
            for c in r.comparisons
        ],
        "receipt": {
            "source": r.receipt.source,
            "summary": r.receipt.summary,
            "decode_tps": dict(r.receipt.decode_tps),
            "prefill_tps": dict(r.receipt.prefill_tps),
            "notes": list(r.receipt.notes),
        },
        "promote": r.promote,
        "promoted": r.promoted and written,
        "refusals": list(r.refusals),
        "file": str(path),
        "written": written,
        "not_written": r.not_written,
        "cleanup": list(r.cleanup),
    }


def _print_result(r: GateResult, path: Path, written: bool, tolerance: float) -> None:
    label = "tuned" if r.tuning.tuned else paint("UNTUNED", "1;33")
    print(
        f"{r.host}: {r.unit} on GPU {r.gpu.index} ({r.gpu.name}, driver {r.driver}) at "
        f"127.0.0.1:{r.port} ({label}), median of {r.summary.runs} runs, "
        f"{r.summary.predicted_n} tokens after a {r.summary.prompt_n}-token prompt"
    )
    print(_figures("decode", r.summary, "decode"))
    print(_figures("prefill", r.summary, "prefill"))
    if r.prefill_4k is not None:
        print(_figures("prefill at 4k", r.prefill_4k, "prefill"))
    else:
        print(f"  prefill at 4k  not measured: {r.prefill_note}")
    for c in r.comparisons:
        verdict = paint("meets", "32") if c.meets else paint("BELOW", "1;31")
        print(
            f"  {c.key}: {c.ratio:.2f}x the receipt's {c.receipt:g} ({verdict}; "
            f"tolerance {tolerance:.0%})"
        )
    if not r.comparisons:
        print("  the old receipt has no figure to compare with")
    for line in r.cleanup:
        print(f"  {line}")
    if written:
        state = "; status released" if r.promoted else ""
        print(f"{path}: receipt written{state}")
    else:
        print(f"{path}: not written: {r.not_written}")


def cmd_gate_run(args: argparse.Namespace) -> int:
    from tensorless_deploy.cli.common import flags_from
    from tensorless_deploy.fleet.gate import GateRequest, gate_run
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.hub import token

    catalog = catalog_from(args)
    entry = catalog.card(args.model, args.card) if args.card else catalog.find(args.model)[0]
    path = catalog.root / entry.path
    try:
        before = path.read_bytes()
        mode = os.stat(path).st_mode & 0o7777
    except OSError as exc:
        raise TensorlessError(f"{path}: cannot read: {exc.strerror or exc}") from None
    flags = flags_from(args)
    inventory = load_inventory(args.inventory, False)
    hosts = select_hosts(inventory, args.limit or [])
    request = GateRequest(
        entry=entry,
        text=before.decode("utf-8"),
        flags=flags,
        promote=args.promote,
        date=datetime.date.today().isoformat(),
        token_source=token,
    )
    result = gate_run(inventory, hosts, request)
    written = False
    if result.text is not None:
        try:
            if path.read_bytes() != before:
                raise TensorlessError(
                    f"{path}: changed while gate run measured; nothing was written",
                    fix="run gate run again",
                )
            write_atomic(path, result.text, mode)
        except OSError as exc:
            raise TensorlessError(f"{path}: cannot write: {exc.strerror or exc}") from None
        written = True
    if args.json:
        emit_json(_result_json(result, path, written))
    else:
        _print_result(result, path, written, request.tolerance)
    if result.tuning.tuned and not written:
        return 1  # refused: --promote's conditions failed
    return 0


def register(command: Command) -> None:
    from tensorless_deploy.cli import subcommand

    gate = command(
        "gate",
        "the release gate: check a recipe change against a base revision (CI); measure a "
        "recipe on its card and write its receipt",
        cmd_gate,
    )
    _recipes_flag(gate, None)
    group = gate.add_subparsers(dest="gate_command", metavar="COMMAND", required=True)
    check = subcommand(
        group,
        "check",
        "every recipe against its version at --base REV: a changed [run], [engine] or model "
        "pin needs a new receipt (or draft); released needs decode_tps.short and a source "
        "naming engine.image's digest",
        cmd_gate_check,
    )
    check.add_argument(
        "--base", required=True, metavar="REV", help="the revision to compare with (git)"
    )
    _recipes_flag(check, argparse.SUPPRESS)
    run = subcommand(
        group,
        "run",
        "measure MODEL on an idle card of its recipe's on an inventory host (a scratch "
        "instance: no serving unit is touched) and write the recipe's [receipt] "
        "(extra llama-server args after --: untuned, measured but not written)",
        cmd_gate_run,
    )
    inventory_flags(run)
    wait_lock_flag(run)
    run.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    run.add_argument("--card", metavar="ID", help="the card's recipe (default: the model's first)")
    run.add_argument(
        "--promote",
        action="store_true",
        help='also set status = "released", only when the run was tuned, on the recipe\'s '
        "card and image, and met the old receipt within bench's tolerance",
    )
    run.set_defaults(takes_extra=True)
    _recipes_flag(run, argparse.SUPPRESS)
