"""export: a recipe's launch spec as a Kubernetes manifest (or one for `podman kube play`).

The flags and the printing; fleet.export plans the export target as deploy plans a host
(hostplan.export) and renders it (launch/kube.py); docs/kubernetes.md says what it covers and not.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tensorless_deploy.cli.common import (
    access_flags,
    access_from,
    catalog_from,
    dry_run_flag,
    flags_from,
    recipes_flag,
    untuned_line,
)
from tensorless_deploy.cli.output import emit_json
from tensorless_deploy.errors import UsageError

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.fleet.export import Export


def _write(path: Path, text: str) -> None:
    from tensorless_deploy.cli.output import write_atomic

    write_atomic(path, text)


def _summary(out: Export) -> Sequence[str]:
    lines = []
    for w in out.workloads:
        where = f"{w.replicas} pod(s)" if w.cdi_device is None else w.cdi_device
        lines.append(f"{w.spec.name}: {where}, port {w.spec.port}")
        if not w.spec.tuning.tuned:
            lines.append("  " + untuned_line(w.spec.tuning.reasons))
    return lines


def cmd_export(args: argparse.Namespace) -> int:
    catalog = catalog_from(args)
    entries = [catalog.card(args.model, args.card)] if args.card else catalog.find(args.model)
    if len(entries) > 1:
        cards = ", ".join(e.recipe.card.id for e in entries)
        raise UsageError(f"{args.model}: recipes for several cards; pass --card ({cards})")
    entry = entries[0]
    flags = access_from(args, flags_from(args))
    from tensorless_deploy.fleet.export import export

    out = export(entry.recipe, flags, args.format, entry.digest)
    # --dry-run: every refusal above is the real run's (it exits as that would); only the file
    # is not written
    if args.output and args.dry_run:
        where = Path(args.output).absolute()
        print(f"would write {where} ({len(out.text)} bytes)", file=sys.stderr)
    elif args.output:
        _write(Path(args.output), out.text)
    elif not args.json:
        sys.stdout.write(out.text)
    if args.json:
        emit_json({"ok": True, "format": out.target, "documents": out.documents})
    for line in _summary(out):
        print(line, file=sys.stderr)
    return 0


def register(command: Command) -> None:
    from tensorless_deploy.hostplan.export import FORMATS

    p = command(
        "export",
        "render a recipe's launch spec as manifests: Kubernetes (Deployment and Service, one "
        "GPU per pod) or podman kube play (extra llama-server args after --, untuned)",
        cmd_export,
    )
    p.add_argument("model", metavar="MODEL", help="a repo id (any case) or a short name")
    p.add_argument(
        "--format",
        required=True,
        choices=tuple(FORMATS),
        help="kube: Kubernetes with NVIDIA's device plugin and GPU feature discovery; "
        "podman-kube: podman kube play on one host (podman 5.4 or newer)",
    )
    p.add_argument("--card", metavar="ID", help="the card's recipe (needed when there are several)")
    p.add_argument(
        "--instances",
        metavar="N",
        help="pods, one GPU each (default 1): kube, replicas of one Deployment; podman-kube, "
        "one Deployment per card, cards 0..N-1 (or GPU indices/UUIDs: 0,1)",
    )
    p.add_argument("--port", type=int, metavar="N", help="the container's port (default 8080)")
    p.add_argument(
        "--bind",
        metavar="ADDR",
        help="podman-kube: the host address the port is published on (default 127.0.0.1)",
    )
    p.add_argument(
        "--context", type=int, metavar="N", help="context instead of the recipe's (untuned)"
    )
    p.add_argument("--allow-draft", action="store_true", help="accept a draft recipe")
    access_flags(
        p,
        "--bind (or any kube export)",
        key_help="the pod reads the key from the Secret tensorless-api-key (FILE: the key, "
        "checked here, never put in the manifest); needed on kube unless --insecure-open",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write the manifest to FILE")
    dry_run_flag(p)
    p.set_defaults(takes_extra=True)
    recipes_flag(p)
