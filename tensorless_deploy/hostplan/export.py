"""The plan of an export target: a Kubernetes node or a `podman kube play` host, decided as
deploy decides a host's (hostplan.plan): the options by decisions.options.resolve, the
instances by hostplan.plan.layout, each launch spec by hostplan.plan.instance_spec, the
refusals by the same checks (the recipe's state, api.key, the operator's key and TLS files).

Nothing is surveyed: the target's cards are the recipe's own card, as many as asked (the cluster
or the host picks the real ones: GPU feature discovery's labels, a CDI device name). A renderer
(launch/kube.py) turns the plan into documents; fleet/export.py adds the init step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tensorless_deploy.decisions.checks import (
    EngineName,
    api_check,
    secret_file_checks,
    state_refusal,
)
from tensorless_deploy.decisions.options import Flags, Instances, Options, resolve
from tensorless_deploy.errors import UsageError
from tensorless_deploy.facts.values import Gpu
from tensorless_deploy.hostplan.plan import instance_spec, layout, recipe_card
from tensorless_deploy.hub import CachePaths
from tensorless_deploy.launch.kube import GPU_RESOURCE, OPERATOR_SECRETS, POD_BIND, Target, Workload
from tensorless_deploy.recipe.catalog import model_paths, unit_name
from tensorless_deploy.recipe.schema import Recipe

Placement = Literal["cluster", "host"]
# Every --format and how its instances are placed (docs/architecture.md, "Adding an export
# target"). cluster: the scheduler picks each replica's node and card, so one workload of N
# replicas on one port, each pod on its own address (--bind means nothing there); host: one
# host plays one workload per named card, deploy's layout (names base, base-1, ...; ports port
# + ordinal), its ports published on --bind.
FORMATS: dict[Target, Placement] = {"kube": "cluster", "podman-kube": "host"}
ENGINE: EngineName = "podman"  # only the device options differ by engine; a pod has neither


@dataclass(frozen=True)
class ExportPlan:
    """What one export renders: the recipe, the resolved options, its workloads."""

    target: Target
    recipe: Recipe
    options: Options
    paths: CachePaths
    workloads: tuple[Workload, ...]


def _host_cards(recipe: Recipe, choice: int | tuple[int | str, ...]) -> tuple[Gpu, ...]:
    """A host's cards: 0..N-1 for a count, else the ones named (GPU indices or UUIDs; a card
    named by UUID is numbered after every index named, so that none is taken for another)."""
    named: Sequence[int | str] = tuple(range(choice)) if isinstance(choice, int) else choice
    after = 1 + max((w for w in named if isinstance(w, int)), default=-1)
    cards = []
    for i, want in enumerate(named):
        if isinstance(want, int):
            cards.append(recipe_card(recipe, want))
        else:
            cards.append(recipe_card(recipe, after + i, want))
    return tuple(cards)


def _cards(recipe: Recipe, choice: Instances, target: Target) -> tuple[tuple[Gpu, ...], int]:
    """The cards the layout places instances on, and the replicas of each instance."""
    if choice == "all" or isinstance(choice, str):
        raise UsageError("--instances all: an export has no host to count cards on; give a number")
    if FORMATS[target] == "host":
        return _host_cards(recipe, choice), 1
    if not isinstance(choice, int):
        raise UsageError(
            "--instances: a number on Kubernetes (the device plugin picks the cards), "
            f"not {','.join(map(str, choice))}"
        )
    return (recipe_card(recipe, 0),), choice  # one pod's card, as many pods as asked


def _refuse_open(options: Options, target: Target) -> None:
    """deploy's api.key check on the address the target serves: the pod's own on a cluster
    (every pod's cluster address), --bind on a host. Refused as there, in export's words."""
    if all(c.status != "fail" for c in api_check(options)):
        return
    cluster = FORMATS[target] == "cluster"
    where = "every pod's cluster address" if cluster else f"{options.bind} (--bind)"
    raise UsageError(
        f"--format {target}: {where} would take requests from anyone who reaches it: no API key",
        fix="pass --api-key-file FILE (the pod reads the key from the Secret "
        f"{OPERATOR_SECRETS['api-key'][0]}; make one: openssl rand -hex 32 > api.key), "
        "or --insecure-open",
    )


def export_options(flags: Flags, target: Target) -> Options:
    """The target's options, resolved as every host's are: from the command line only (an
    export reads no inventory); one instance unless --instances says more (there is no host to
    count cards on); on a cluster, llama-server binds the pod's own address."""
    if FORMATS[target] == "cluster":
        if flags.bind is not None:
            raise UsageError(
                "--bind: a pod's address is the cluster's (llama-server binds the pod's own); "
                "--bind is where podman-kube publishes the port on the host"
            )
        flags = dataclasses.replace(flags, bind=POD_BIND)
    instances = 1 if flags.instances is None else flags.instances
    return resolve(dataclasses.replace(flags, instances=instances))


def plan_export(recipe: Recipe, flags: Flags, target: Target) -> ExportPlan:
    """The export target's plan for one recipe: refused as deploy refuses it, else laid out
    (pure: the operator's files are not read here, see refuse_files)."""
    refusal = state_refusal(recipe, "run", flags.allow_draft)
    if refusal:
        raise UsageError(refusal)
    options = export_options(flags, target)
    _refuse_open(options, target)
    cards, replicas = _cards(recipe, options.instances, target)
    host = FORMATS[target] == "host"
    lay = layout(
        cards, unit_name(recipe), options if host else dataclasses.replace(options, instances=1)
    )
    if lay.problem is not None:
        raise UsageError(f"--port {options.port}: {lay.problem}")
    paths = model_paths(options.models_dir, recipe)
    workloads = tuple(
        Workload(
            instance_spec(
                recipe,
                options,
                engine=ENGINE,
                model_path=paths.blob,
                gpus=(),  # the cluster's device plugin, or the host's CDI device, picks it
                cpus=None,  # threads_max, as measured: the node's CPUs are not known here
                name=name,
                port=port,
                bind=POD_BIND,  # in a pod, its own address; a host publishes it on --bind
            ),
            replicas=replicas,
            cdi_device=f"{GPU_RESOURCE}={gpu.uuid or gpu.index}" if host else None,
            host_ip=options.bind if host else None,
        )
        for name, port, gpu in lay.instances
    )
    return ExportPlan(target, recipe, options, paths, workloads)


def refuse_files(options: Options) -> None:
    """deploy's api.key_file and api.tls_files checks of the operator's files on this machine:
    the manifest references them (the Secrets the operator makes from them), so they must be
    what they say. A failed one is a usage error naming the flag."""
    for c in secret_file_checks(options):
        if c.status == "fail":
            flag = "--api-key-file" if c.id == "api.key_file" else "--tls-cert-file/--tls-key-file"
            raise UsageError(f"{flag}: {c.evidence}")
