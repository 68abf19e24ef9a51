"""export: the plan of an export target (hostplan.export) rendered as manifests (launch/kube.py),
with the init step that runs the host's own download script (operations/scripts/
model-download.sh with the libraries it needs): nothing restated here but the pod's paths.
docs/kubernetes.md says what the manifests cover and not.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.hostplan.export import ExportPlan, plan_export, refuse_files
from tensorless_deploy.hub import DEFAULT_MODELS_DIR, resolve_url
from tensorless_deploy.launch.kube import (
    InitStep,
    Target,
    Workload,
    comments,
    render_documents,
    to_yaml,
)
from tensorless_deploy.operations._run import bound
from tensorless_deploy.operations.model import SECRETS_DIR, download_params
from tensorless_deploy.recipe.catalog import model_paths
from tensorless_deploy.recipe.schema import Recipe

# In the pod the model volume holds the host layout under deploy's default models directory,
# its verification stamps beside it (hub.host_state_dir): the volume is their parent.
POD_VOLUME_ROOT = posixpath.dirname(DEFAULT_MODELS_DIR)


@dataclass(frozen=True)
class Export:
    """What one export renders: its plan, its documents, and the YAML text of them."""

    plan: ExportPlan
    documents: list[dict[str, Any]]
    text: str

    @property
    def target(self) -> Target:
        return self.plan.target

    @property
    def workloads(self) -> tuple[Workload, ...]:
        return self.plan.workloads


def init_step(recipe: Recipe, models_dir: str) -> InitStep:
    """operations/scripts/model-download.sh (with the libraries it needs, as shell.program
    prepends them) bound to the pod's cache paths and the pinned revision's URL; auth is left to the
    init program (the token comes from a Secret at run time)."""
    m = recipe.model
    paths = model_paths(models_dir, recipe)
    url = resolve_url(m.hf_repo, m.revision, m.file)
    script = bound("model-download", **download_params(paths, m.sha256, m.size_bytes, url))
    return InitStep(
        script=script,
        volume_root=POD_VOLUME_ROOT,
        secrets_dir=SECRETS_DIR,
        auth_file=f"{SECRETS_DIR}/hf-auth",
    )


Rendered = tuple[list[dict[str, Any]], str]  # the documents, and the text written


def _kube(plan: ExportPlan, init: InitStep, digest: str) -> Rendered:
    recipe, options = plan.recipe, plan.options
    docs = render_documents(recipe, plan.workloads, init, plan.target)
    notes = comments(
        recipe, plan.target, digest, api_key=options.api_key_file is not None, tls=options.tls
    )
    return docs, to_yaml(docs, notes)


# Every --format's renderer (hostplan.export.FORMATS says how each places its instances;
# docs/architecture.md, "Adding an export target")
RENDERERS: dict[Target, Callable[[ExportPlan, InitStep, str], Rendered]] = {
    "kube": _kube,
    "podman-kube": _kube,
}


def render(plan: ExportPlan, digest: str) -> Export:
    """The plan's manifest, by its format's renderer, with the init step that downloads the
    model where the pod runs."""
    init = init_step(plan.recipe, plan.options.models_dir)
    docs, text = RENDERERS[plan.target](plan, init, digest)
    return Export(plan, docs, text)


def build_export(recipe: Recipe, flags: Flags, target: Target, digest: str) -> Export:
    """The manifest for one recipe: refused as deploy refuses it, else rendered (the
    operator's files, which the manifest only names, are not read: see export)."""
    return render(plan_export(recipe, flags, target), digest)


def export(recipe: Recipe, flags: Flags, target: Target, digest: str) -> Export:
    """build_export, and the operator's key and TLS files checked as deploy checks them."""
    plan = plan_export(recipe, flags, target)
    refuse_files(plan.options)
    return render(plan, digest)
