"""prune: on every host, the model files and engine images that no unit of this tool references
(the current units and the previous ones kept for rollback), removed; nothing in use is touched.
Images are only ever this tool's engine images: their repository is one a unit of this tool or a
recipe of the catalog names; an operator's other images are never candidates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tensorless_deploy.decisions.options import Flags
from tensorless_deploy.facts.values import DeployedUnit, HostFacts
from tensorless_deploy.fleet.connect import disconnect, new_state, on_each_host, require_root
from tensorless_deploy.fleet.inventory import options_for
from tensorless_deploy.fleet.runner import HostResult
from tensorless_deploy.fleet.status import not_read
from tensorless_deploy.hostplan.plan import engine_bin
from tensorless_deploy.hub import host_state_dir
from tensorless_deploy.launch.read import read_unit
from tensorless_deploy.recipe.catalog import Catalog


@dataclass(frozen=True)
class Unused:
    """What prune would remove on one host, and what it keeps because a unit names it."""

    blobs: tuple[str, ...]
    images: tuple[str, ...]
    kept_blobs: tuple[str, ...]
    kept_images: tuple[str, ...]
    # images the engine holds whose repository no unit and no recipe of the catalog names:
    # never candidates (they may be the operator's own), and said so, not passed over in
    # silence (an engine image left by `stop` of a model whose catalog is not this one)
    other_images: tuple[str, ...] = ()


# podman's own infra image, built on the host the first time a pod starts (kube play): never
# an engine image, nor the operator's; naming it among the images left alone would be noise
PODMAN_INFRA_REPOSITORY = "localhost/podman-pause"


def _repository(image: str) -> str:
    return image.partition("@")[0]


def unused(facts: HostFacts, units: Sequence[DeployedUnit], catalog: Catalog) -> Unused:
    """The tool's model blobs and engine images on a host that no unit references (pure)."""
    blobs_in_use: set[str] = set()
    images_in_use: set[str] = set()
    for u in units:
        for text in (u.text, u.previous_text):
            if not text:
                continue
            content = read_unit(u.path, text)
            if content.image:
                images_in_use.add(content.image)
            for volume in content.values("volume"):
                blobs_in_use.add(volume.split(":", 1)[0])
    tool = facts.tool
    if tool is None:
        return Unused((), (), (), ())
    repos = {_repository(i) for i in images_in_use} | {
        _repository(e.recipe.engine.image) for e in catalog.entries
    }
    ours = [i for i in (tool.images or ()) if _repository(i) in repos]
    return Unused(
        blobs=tuple(b.path for b in tool.blobs if b.path not in blobs_in_use),
        images=tuple(i for i in ours if i not in images_in_use),
        kept_blobs=tuple(b.path for b in tool.blobs if b.path in blobs_in_use),
        kept_images=tuple(i for i in ours if i in images_in_use),
        other_images=tuple(
            i
            for i in (tool.images or ())
            if i not in ours and _repository(i) != PODMAN_INFRA_REPOSITORY
        ),
    )


def prune(
    inventory: Any,
    hosts: Sequence[Any],
    catalog: Catalog,
    flags: Flags | None = None,
    *,
    dry: bool = False,
) -> tuple[list[HostResult], dict[str, Unused]]:
    """Remove what no unit references, every host in parallel; with dry, only say it."""
    from tensorless_deploy.facts.pyinfra import DeployedUnits, HostSurvey
    from tensorless_deploy.fleet.runner import Step, apply_steps
    from tensorless_deploy.operations.prune import image_removed, model_removed

    state = new_state(inventory, flags, lock=None if dry else "prune")
    options = {h.name: options_for(h, flags or Flags()) for h in hosts}

    def read(h: Any) -> tuple[HostFacts, tuple[DeployedUnit, ...]]:
        facts = HostSurvey.typed(h.get_fact(HostSurvey, models_dir=options[h.name].models_dir))
        require_root(facts)  # another user would see neither root's images nor remove a file
        return facts, DeployedUnits.typed(h.get_fact(DeployedUnits))

    found = dict(
        zip(
            [h.name for h in hosts],
            on_each_host(state, hosts, read, keep_connected=True),
            strict=True,
        )
    )
    live = [h for h in hosts if not isinstance(found[h.name], str)]
    steps: dict[str, list[Step]] = {}
    lists: dict[str, Unused] = {}
    for h in live:
        got = found[h.name]
        assert not isinstance(got, str)
        facts, units = got
        todo = unused(facts, units, catalog)
        lists[h.name] = todo
        state_dir = host_state_dir(options[h.name].models_dir)
        engine = facts.tool.images_engine if facts.tool is not None else None
        binary = engine_bin(facts, "docker" if engine == "docker" else "podman")
        steps[h.name] = [
            *(
                Step(
                    f"remove model {b}",
                    model_removed,
                    dict(blob=b, stamp=f"{state_dir}/verified/{b.rsplit('/', 1)[-1]}"),
                )
                for b in todo.blobs
            ),
            *(
                Step(f"remove image {i}", image_removed, dict(engine_bin=binary, image=i))
                for i in todo.images
            ),
        ]
    try:
        done = apply_steps(state, live, steps, dry=dry, nothing="nothing unused")
    finally:
        disconnect(hosts)
    results = [done[h.name] if h.name in done else not_read(h.name, found[h.name]) for h in hosts]
    return results, lists
