"""The relay in a pull run (``deploy --relay``, or ``tensorless_relay = true``, on hosts that pull):
the model crosses the site's uplink once. Where no host of the run holds it verified yet, one
host that lacks it (the first in inventory order) downloads it itself, exactly as the model
operation would (``model-download.sh``: resumable, hashed as it arrives, never past
``size_bytes``); then every other such host gets it from the hosts that hold it through the
relay (fleet.relay, model only: its bytes land in the host's partial file, hashed on arrival,
and the model step admits them as pushed). Each host still pulls its image from the registry.

A seed whose download fails fails, and so do the hosts that waited for it (one line naming the
seed): they do not fall back to downloading each for itself, which is what the operator asked to
avoid. A dry run says who would seed and who would receive, and moves nothing.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tensorless_deploy.fleet.channel import host_command, ssh_transport
from tensorless_deploy.fleet.connect import fleet_of, in_step
from tensorless_deploy.fleet.push import (
    DownloadWatch,
    Missing,
    Progress,
    Token,
    holders_of,
    needs_of,
    push,
)
from tensorless_deploy.hostplan.plan import HostPlan


@dataclass
class Seeded:
    """What the pull relay did: per host the error, what it got and how, and the hosts whose
    model arrived through the relay (their model step admits pushed bytes)."""

    failed: dict[str, str] = field(default_factory=dict)
    said: dict[str, str] = field(default_factory=dict)
    relayed: set[str] = field(default_factory=set)
    seeds: set[str] = field(default_factory=set)


def wanting(plans: dict[str, HostPlan], modes: dict[str, tuple[str, str]]) -> dict[str, HostPlan]:
    """The hosts of a run that pull and whose own options ask for the relay."""
    return {
        n: p
        for n, p in plans.items()
        if modes[n][0] == "pull" and p.options.relay and p.recipe is not None
    }


def relay_pulls(
    state: Any,
    by_name: dict[str, Any],
    plans: dict[str, HostPlan],
    missing: Missing,
    held: dict[str, HostPlan],
    token: Token,
    progress: Progress | None,
    dry: bool,
) -> Seeded:
    """The model to every host of plans (wanting's) that lacks it, from a host that holds it
    verified (held: the run's holders; a seed that downloads it joins them). missing is updated
    with what the hosts turned out to lack."""
    out = Seeded()
    needs = needs_of(state, by_name, plans, missing)
    missing.update(needs)
    lacking = {n: p for n, p in plans.items() if needs[n][0]}
    for sha in dict.fromkeys(p.recipe.model.sha256 for p in lacking.values() if p.recipe):
        group = {n: p for n, p in lacking.items() if p.recipe and p.recipe.model.sha256 == sha}
        seed = None if holders_of(held, sha, list(group)) else next(iter(group))
        if dry:
            _said_dry(out, group, seed, held, sha)
            continue
        if seed is not None:
            error = download(state, by_name[seed], group[seed], token, progress)
            if error is not None:
                out.failed[seed] = f"the relay's first download of the model: {error}"
                line = f"the relay's first sender {seed} could not download the model: {error}"
                out.failed.update({n: line for n in group if n != seed})
                continue
            held[seed] = group.pop(seed)
            missing[seed] = (False, needs[seed][1])
            out.seeds.add(seed)
            out.said[seed] = "model: downloaded here, the relay's first sender"
        if not group:
            continue
        errors, sent = push(
            state, by_name, group, token, {n: (True, False) for n in group}, progress, held=held
        )
        out.failed.update(errors)
        out.said.update(sent)
        out.relayed.update(n for n in group if n not in errors)
    return out


def _said_dry(
    out: Seeded,
    group: dict[str, HostPlan],
    seed: str | None,
    held: dict[str, HostPlan],
    sha: str,
) -> None:
    senders = sorted(holders_of(held, sha, list(group))) or [str(seed)]
    for name in group:
        out.said[name] = (
            "model: would download here, the relay's first sender"
            if name == seed
            else f"model: would come through the relay (first senders: {', '.join(senders)})"
        )


def download(
    state: Any,
    host: Any,
    plan: HostPlan,
    token: Callable[[], str | None],
    progress: Progress | None,
) -> str | None:
    """The model downloaded on host itself, as its model operation would download it (the same
    script, parameters, token file and lock owner), before the run's operations: None, or why
    it failed."""
    from tensorless_deploy.fleet.relay import run_channel
    from tensorless_deploy.operations._run import script
    from tensorless_deploy.operations.model import SECRETS_DIR, download_params
    from tensorless_deploy.operations.secrets import secret_command

    assert plan.paths is not None and plan.recipe is not None and plan.url is not None
    m = plan.recipe.model
    transport = ssh_transport(host)
    if transport is None or not transport.is_active():
        return "no SSH connection to download the model over"
    in_step(state, host, "the relay's first download of the model")
    auth = ""
    secret = token()
    if secret:
        auth = posixpath.join(SECRETS_DIR, f"hf-auth-{m.sha256[:16]}")
        header = f"Authorization: Bearer {secret}\n"  # through stdin, never argv
        write = host_command(state, host, secret_command(auth, header))
        rc, _, err = run_channel(transport, write, stdin=header.encode(), timeout=60)
        if rc != 0:
            return f"writing the Hub token file failed: {' '.join(err.split())[-300:]}"
    held = fleet_of(state).locks.get(host.name)
    command = script(
        "model-download",
        **download_params(plan.paths, m.sha256, m.size_bytes, plan.url),
        auth=auth,
        owner=held.pid if held is not None else "",
    )
    p = plan.paths
    with DownloadWatch({host.name: host}, {host.name: (p.partial, p.blob, m.size_bytes)}, progress):
        rc, _, err = run_channel(transport, host_command(state, host, command))
    if rc != 0:
        return " ".join(err.split())[-300:] or f"model-download exited {rc}"
    return None
