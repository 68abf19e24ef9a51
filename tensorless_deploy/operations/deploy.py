"""The @deploy that serves a model on a host: image by digest -> verified model -> one unit per
instance -> (re)start -> /health.

``serve`` is the public form for an operator's own pyinfra deploy file: it reads the host's
facts itself, chooses the recipe and lays out the instances through the one host plan
(hostplan.plan) that every command of the tool computes. ``serve_plan`` applies a host plan the
controller already made (the tool's own fleet runner, which surveyed every host first).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any, Protocol

from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host
from pyinfra.operations import python
from pyinfra.operations.util import any_changed

from tensorless_deploy.decisions.options import DATA_PREFIX, Flags, resolve
from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.facts.pyinfra import HostSurvey
from tensorless_deploy.gguf.sizing import read_sizings
from tensorless_deploy.hostplan.plan import HostPlan, plan_host, secret_sources
from tensorless_deploy.launch.spec import api_key_path, secrets_dir
from tensorless_deploy.operations.image import image
from tensorless_deploy.operations.model import model as model_file
from tensorless_deploy.operations.secrets import secrets, secrets_absent
from tensorless_deploy.operations.unit import removed, serving, unit
from tensorless_deploy.recipe.catalog import load_catalog

Steps = MutableMapping[str, dict[str, Any]]  # host -> step name -> OperationMeta
Said = MutableMapping[str, list[str]]  # host -> what the door answered, in order


class Door(Protocol):
    """A front door before the instances (a load balancer): each instance that is about to
    change is taken out of it first, and put back once it is healthy and on its card again.
    Each call answers None (done: take_out drained it) or a line saying what it could not do;
    the change goes on either way (the instance's own /slots idle wait still comes first).
    fronts: whether a door fronts the host's instances at all (no: nothing is asked or said)."""

    def fronts(self, host_name: str) -> bool: ...

    def take_out(self, host_name: str, port: int, timeout_s: float) -> str | None: ...

    def put_back(self, host_name: str, port: int) -> str | None: ...


def _door_call(
    door: Door, said: Said, host_name: str, port: int, timeout_s: float | None
) -> Callable[[], None]:
    """One of the door's calls as a pyinfra python.call function, its answer kept in said."""

    def call() -> None:
        if not door.fronts(host_name):
            return
        if timeout_s is None:
            why, what = door.put_back(host_name, port), "put back"
        else:
            why, what = door.take_out(host_name, port, timeout_s), "taken out"
        said.setdefault(host_name, []).append(f"{port}: {why or what}")

    return call


def _step(name: str, instance: int, count: int) -> str:
    return name if count == 1 else f"{name} {instance}"


def _none_changed(*metas: Any) -> Callable[[], bool]:
    return lambda: not any(m.did_change() for m in metas)


@deploy("tensorless-deploy: serve a host plan")
def serve_plan(
    plan: HostPlan,
    token: str | None = None,
    transfer: str = "pull",
    archive: str | None = None,
    model_sent: bool = False,
    steps: Steps | None = None,
    owner: int | None = None,
    door: Door | None = None,
    said: Said | None = None,
) -> None:
    """
    Apply a host plan that passed its checks (the tool's own fleet runner calls this).

    + plan: the host's ``hostplan.plan.HostPlan``, made from facts the controller surveyed
    + token: a Hub token for a gated repository (not used when the model is pushed)
    + transfer: ``pull`` (the host downloads) or ``push`` (the controller sent the bytes)
    + archive: with push, the engine image's OCI archive already on the host
    + model_sent: the model's bytes were sent into its partial file (a pull run's relay,
      fleet.seed): verify them, download nothing (a push implies it)
    + steps: each step's OperationMeta lands in ``steps[host][step]`` for the caller's report
    + owner: the pid on the host of the run's lock holder: a download stops once it is gone
    + door: a front door: an instance that changes is taken out of it before its restart and
      put back once healthy and on its card (its answers land in ``said[host]``)
    + said: where the door's answers go

    Each instance that changes is restarted only once the one before it is healthy and on its
    card again (pyinfra runs a host's operations in order), after its requests in flight
    finished (``/slots`` idle, bounded by the host's ``drain_timeout``).
    """
    if not plan.ok or plan.paths is None or plan.recipe is None or plan.engine_bin is None:
        raise OperationError(f"{plan.host}: {plan.why()}")
    recipe = plan.recipe
    m = recipe.model
    pushed = transfer == "push"
    sent = pushed or model_sent
    metas: dict[str, Any] = {}
    metas["image"] = image(
        name="engine image by digest",
        engine_bin=plan.engine_bin,
        image=recipe.engine.image,
        archive=archive if pushed else None,
    )
    metas["model"] = model_file(
        name="model file, sha256-verified",
        models_dir=plan.options.models_dir,
        repo=m.hf_repo,
        revision=m.revision,
        filename=m.file,
        sha256=m.sha256,
        size=m.size_bytes,
        url=plan.url,
        token=None if sent else token,
        pushed=sent,
        owner=owner,
    )
    count = len(plan.instances)
    answers: Said = said if said is not None else {}
    for inst in plan.instances:
        assert inst.unit is not None  # a serving plan renders its units
        path = inst.unit.path
        where = secrets_dir(inst.name)
        changes: list[Any] = []
        if inst.spec.secrets:  # the key and TLS files first: the unit's mounts name them
            installed = secrets(
                name=f"secrets {inst.name}",
                directory=where,
                sources=secret_sources(plan.options, inst.spec),
            )
            metas[_step("secrets", inst.ordinal, count)] = installed
            changes.append(installed)
        written = unit(
            name=f"unit {inst.name}",
            path=path,
            content=inst.unit.content,
            quadlet_bin=plan.quadlet_bin,
            model=plan.model,
        )
        metas[_step("unit", inst.ordinal, count)] = written
        changes.append(written)
        drain = plan.options.drain_timeout
        if door is not None:
            python.call(
                name=f"take {inst.name} out of the door",
                function=_door_call(door, answers, plan.host, inst.spec.port, float(drain)),
                _if=any_changed(*changes),
            )
        # a new key (or certificate) restarts the instance even when the unit text is the same
        metas[_step("restart", inst.ordinal, count)] = restarted = serving(
            name=f"restart {inst.name} and /health",
            path=path,
            health_url=inst.spec.health_url,
            timeout_s=inst.spec.start_timeout_s,
            restart=True,
            idle_s=drain,
            key=api_key_path(inst.name),  # sent where the file exists
            _if=any_changed(*changes),
        )
        if door is not None:
            python.call(
                name=f"put {inst.name} back in the door",
                function=_door_call(door, answers, plan.host, inst.spec.port, None),
                _if=restarted.did_change,
            )
        metas[_step("serving", inst.ordinal, count)] = serving(
            name=f"{inst.name} running and /health",
            path=path,
            health_url=inst.spec.health_url,
            timeout_s=inst.spec.start_timeout_s,
            restart=False,
            _if=_none_changed(*changes),
        )
        if not inst.spec.secrets:  # a key or TLS files it had before: gone once it serves
            secrets_absent(name=f"no secrets for {inst.name}", directory=where)
    for u in plan.surplus:  # instances the plan no longer has (the count went down)
        metas[f"remove {u.name}"] = removed(
            name=f"remove surplus instance {u.name}",
            service=u.name,
            paths=(u.path,),
            secrets=secrets_dir(u.name),
        )
    if steps is not None:
        steps[host.name] = metas


def _host_data() -> dict[str, object]:
    """The host's tensorless_* data, a mistyped key included (resolve refuses it)."""
    return {k: v for k, v in host.data.dict().items() if k.startswith(DATA_PREFIX)}


@deploy("tensorless-deploy: serve a model")
def serve(
    model: str,
    recipes: str | None = None,
    port: int | None = None,
    bind: str | None = None,
    context: int | None = None,
    models_dir: str | None = None,
    engine: str | None = None,
    allow_draft: bool = False,
    token: str | None = None,
) -> None:
    """
    Serve a model on this host, with the recipe for the card it has.

    Reads the host's facts (``HostSurvey``), chooses the recipe and lays out the instances as
    every command of the tool does, then: the engine image by digest, the model file verified
    by sha256, a unit per instance, a restart when it changed, ``/health``. A second run
    changes nothing. The host's own inventory data (``tensorless_port``, ``tensorless_ports``,
    ``tensorless_bind``, ``tensorless_models_dir``, ``tensorless_engine``,
    ``tensorless_instances``) applies; an argument given here wins. A host that cannot serve the
    model fails with the reason (see docs/pyinfra.md).

    + model: a repo id (any case) or a recipe's short name, e.g. ``pn3``
    + recipes: a recipes directory (``<org>/<repo>/<card>.toml``); default: the built-in catalog
    + port: the API port (default: ``tensorless_port``, else 8080)
    + bind: the API address, an IP literal (default: ``tensorless_bind``, else 127.0.0.1)
    + context: a context other than the recipe's (the run is then untuned)
    + models_dir: where model files live on the host (default: ``tensorless_models_dir``, else
      /var/lib/tensorless/models)
    + engine: ``podman`` or ``docker`` (default: ``tensorless_engine``, else podman where
      present)
    + allow_draft: accept a draft recipe
    + token: a Hub token for a gated repository (default: none)

    **Example:**

    .. code:: python

        from tensorless_deploy.operations.deploy import serve

        serve(model="pn3", port=8080)  # in a deploy file: pyinfra inventory.py deploy.py
    """
    try:
        catalog = load_catalog(Path(recipes) if recipes else None)
        entries = catalog.find(model)
        flags = Flags(
            port=port,
            bind=bind,
            context=context,
            models_dir=models_dir,
            engine=engine,
            allow_draft=allow_draft,
            # an error names serve()'s own argument, not a command-line flag
            flag_names={n: f"serve({n}=...)" for n in ("port", "bind", "context", "engine")}
            | {"models_dir": "serve(models_dir=...)"},
            offered=frozenset(("port", "bind", "context", "models_dir", "engine")),
        )
        options = resolve(flags, _host_data(), host.name)
        facts = HostSurvey.typed(host.get_fact(HostSurvey, models_dir=options.models_dir))
        sizing = read_sizings([(e.path, e.recipe) for e in entries])
        plan = plan_host(host.name, facts, entries, options, sizing=sizing)
    except TensorlessError as exc:
        raise OperationError(f"{host.name}: {exc.lines()[0]}") from None
    if not plan.ok:
        raise OperationError(
            f"{host.name}: {plan.entry.path if plan.entry else model}: {plan.why()}"
        )
    # the inner function: one deploy name on every step, not serve's and serve_plan's joined
    serve_plan._inner(plan=plan, token=token)
