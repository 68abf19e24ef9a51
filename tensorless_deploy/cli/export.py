"""export: a recipe's launch spec as a Kubernetes manifest (or one for `podman kube play`).

The same launch spec deploy builds (launch.spec.build_launch_spec), the same refusals (the
seed's state table; launcher-owned flags after --), and the init step runs the host's own
download script (operations/scripts/model-download.sh with lib.sh): nothing restated here but
the pod's paths. launch/kube.py renders; docs/kubernetes.md says what it covers and not.
"""

from __future__ import annotations

import argparse
import posixpath
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from tensorless_deploy.hub import DEFAULT_MODELS_DIR

if TYPE_CHECKING:
    from tensorless_deploy.cli import Command
    from tensorless_deploy.decisions.options import Flags
    from tensorless_deploy.launch.kube import InitStep, Target, Workload
    from tensorless_deploy.recipe.schema import Recipe

# In the pod the model volume holds the host layout under deploy's default models directory,
# its verification stamps beside it (hub.host_state_dir): the volume is their parent.
POD_VOLUME_ROOT = posixpath.dirname(DEFAULT_MODELS_DIR)


@dataclass(frozen=True)
class Export:
    """What one export renders: its documents, and the YAML text of them."""

    target: Target
    documents: list[dict[str, Any]]
    text: str
    workloads: tuple[Workload, ...]


def init_step(recipe: Recipe, models_dir: str) -> InitStep:
    """operations/scripts/model-download.sh (with lib.sh, as operations._run.script prepends
    it) bound to the pod's cache paths and the pinned revision's URL; auth is left to the
    init program (the token comes from a Secret at run time)."""
    from tensorless_deploy.hub import cache_paths, host_state_dir, resolve_url
    from tensorless_deploy.launch.kube import InitStep
    from tensorless_deploy.operations._run import bound
    from tensorless_deploy.operations.model import SECRETS_DIR, download_params

    m = recipe.model
    paths = cache_paths(
        models_dir, host_state_dir(models_dir), m.hf_repo, m.revision, m.file, m.sha256
    )
    url = resolve_url(m.hf_repo, m.revision, m.file)
    script = bound("model-download", **download_params(paths, m.sha256, m.size_bytes, url))
    return InitStep(
        script=script,
        volume_root=POD_VOLUME_ROOT,
        secrets_dir=SECRETS_DIR,
        auth_file=f"{SECRETS_DIR}/hf-auth",
    )


def _count(flags: Flags, target: Target) -> tuple[int, tuple[str, ...]]:
    """--instances: a count (default 1); for podman-kube also the cards' CDI names (index or
    UUID), since podman maps a named device. "all" needs a host to count the cards on."""
    choice = flags.instances
    if choice is None:
        return 1, ("0",) if target == "podman-kube" else ()
    if isinstance(choice, int):
        cards = tuple(str(i) for i in range(choice)) if target == "podman-kube" else ()
        return choice, cards
    if choice == "all":
        raise UsageError("--instances all: an export has no host to count cards on; give a number")
    if target == "kube":
        raise UsageError(
            "--instances: a number on Kubernetes (the device plugin picks the cards), "
            f"not {','.join(map(str, choice))}"
        )
    return len(choice), tuple(str(g) for g in choice)


def _refuse_keyless(flags: Flags, target: Target) -> None:
    """A pod on Kubernetes listens on its cluster address, and podman-kube publishes on --bind:
    beyond loopback the API needs a key, as deploy's api.key check says, unless the operator
    says --insecure-open."""
    from tensorless_deploy.decisions.checks import is_loopback
    from tensorless_deploy.decisions.options import DEFAULT_BIND
    from tensorless_deploy.launch.kube import OPERATOR_SECRETS

    bind = flags.bind or DEFAULT_BIND
    if (
        flags.api_key_file is not None
        or flags.insecure_open
        or (target == "podman-kube" and is_loopback(bind))
    ):
        return
    where = "every pod's cluster address" if target == "kube" else f"{bind} (--bind)"
    raise UsageError(
        f"--format {target}: {where} would take requests from anyone who reaches it: no API key",
        fix="pass --api-key-file FILE (the pod reads the key from the Secret "
        f"{OPERATOR_SECRETS['api-key'][0]}; make one: openssl rand -hex 32 > api.key), "
        "or --insecure-open",
    )


def build_export(recipe: Recipe, flags: Flags, target: Target, digest: str) -> Export:
    """The manifest for one recipe: refused as deploy refuses it, else rendered."""
    from tensorless_deploy.decisions.checks import state_refusal
    from tensorless_deploy.decisions.options import CORS_LOOPBACK, DEFAULT_BIND, DEFAULT_PORT
    from tensorless_deploy.hostplan.plan import instance_name
    from tensorless_deploy.hub import cache_paths, host_state_dir
    from tensorless_deploy.launch.kube import (
        GPU_RESOURCE,
        POD_BIND,
        Workload,
        render_documents,
        to_yaml,
    )
    from tensorless_deploy.launch.spec import build_launch_spec
    from tensorless_deploy.recipe.catalog import unit_name

    refusal = state_refusal(recipe, "run", flags.allow_draft)
    if refusal:
        raise UsageError(refusal)
    if flags.bind is not None and target == "kube":
        raise UsageError(
            "--bind: a pod's address is the cluster's (llama-server binds the pod's own); "
            "--bind is where podman-kube publishes the port on the host"
        )
    _refuse_keyless(flags, target)
    m = recipe.model
    models_dir = DEFAULT_MODELS_DIR
    blob = cache_paths(
        models_dir, host_state_dir(models_dir), m.hf_repo, m.revision, m.file, m.sha256
    ).blob
    count, cards = _count(flags, target)
    port = flags.port if flags.port is not None else DEFAULT_PORT
    base = unit_name(recipe)

    def spec_for(name: str, at: int) -> Any:
        return build_launch_spec(
            recipe,
            engine="podman",  # only the device options differ by engine; a pod has neither
            model_path=blob,
            gpu_uuids=(),  # the cluster's device plugin picks the card
            cpus=None,  # threads_max, as measured: the node's CPUs are not known here
            port=at,
            bind=POD_BIND,
            context=flags.context,
            extra_args=flags.extra_args,
            name=name,
            api_key=flags.api_key_file is not None,  # from the Secret, by reference
            tls=flags.tls_cert_file is not None,  # check_flags: both files or neither
            metrics=bool(flags.metrics),
            cors_origins=flags.cors_origins or CORS_LOOPBACK,  # checked by check_flags
        )

    workloads: list[Workload]
    if target == "kube":
        # one Deployment of N replicas: each pod one llama-server on one GPU, on its own
        # address and the same port; the cluster spreads them over its cards
        workloads = [Workload(spec_for(base, port), replicas=count)]
    else:
        # podman plays one replica of a Deployment: one Deployment per card, deploy's layout
        # (instance names base, base-1, ...; ports port + ordinal), each its CDI device
        workloads = [
            Workload(
                spec_for(instance_name(base, i), port + i),
                cdi_device=f"{GPU_RESOURCE}={card}",
                host_ip=flags.bind or DEFAULT_BIND,
            )
            for i, card in enumerate(cards)
        ]
        bad = [w.spec.port for w in workloads if w.spec.port > 65535]
        if bad:
            raise UsageError(f"--port {port}: instance port {bad[0]} is beyond 65535")
    init = init_step(recipe, models_dir)
    docs = render_documents(recipe, workloads, init, target)
    return Export(
        target, docs, to_yaml(docs, _comments(recipe, target, digest, flags)), tuple(workloads)
    )


def _comments(recipe: Recipe, target: Target, digest: str, flags: Flags) -> list[str]:
    from tensorless_deploy.launch.kube import HF_TOKEN_KEY, HF_TOKEN_SECRET, OPERATOR_SECRETS

    apply = "kubectl apply -f FILE" if target == "kube" else "podman kube play FILE"
    create = (
        f"kubectl create secret generic {HF_TOKEN_SECRET} --from-literal={HF_TOKEN_KEY}=hf_..."
        if target == "kube"
        else f"a podman secret {HF_TOKEN_SECRET} (podman kube play of a Secret with "
        f"stringData {HF_TOKEN_KEY})"
    )
    lines = [
        f"Generated by tensorless-deploy export --format {target}: "
        f"{recipe.model.hf_repo} on {recipe.card.id}, recipe {digest}.",
        f"Do not edit: export again. Apply: {apply}.",
        f"Gated models: the Hub token by Secret reference, never here: {create}.",
    ]
    key, _ = OPERATOR_SECRETS["api-key"]
    tls, _ = OPERATOR_SECRETS["tls.crt"]
    kube = target == "kube"
    if flags.api_key_file is not None:
        how = (
            f"kubectl create secret generic {key} --from-file=api-key=KEYFILE"
            if kube
            else f"a podman secret {key} (podman kube play of a Secret with stringData api-key)"
        )
        lines.append(f"The API key by Secret reference, never here: {how}.")
    if flags.tls_cert_file is not None:
        how = (
            f"kubectl create secret tls {tls} --cert=CERT --key=KEY"
            if kube
            else f"a podman secret {tls} (podman kube play of a kubernetes.io/tls Secret)"
        )
        lines.append(f"The TLS pair by Secret reference, never here: {how}.")
    return lines


def _write(path: Path, text: str) -> None:
    from tensorless_deploy.cli.output import write_atomic

    write_atomic(path, text)


def _summary(out: Export) -> Sequence[str]:
    lines = []
    for w in out.workloads:
        where = f"{w.replicas} pod(s)" if out.target == "kube" else f"{w.cdi_device}"
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
    if flags.api_key_file is not None:  # the manifest references it; the file must be a key
        from tensorless_deploy.decisions.options import api_key_text

        try:
            api_key_text(flags.api_key_file)
        except ValueError as exc:
            raise UsageError(f"--api-key-file: {exc}") from None
    out = build_export(entry.recipe, flags, args.format, entry.digest)
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
        choices=("kube", "podman-kube"),
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
