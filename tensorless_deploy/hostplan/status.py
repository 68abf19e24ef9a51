"""status: what each unit on a host serves, healthy or not, tuned or not, and how it drifted,
field by field, from what the host plan renders for the catalog's recipe now (pure)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tensorless_deploy.decisions.checks import GPU_HUNG_FIX, Check
from tensorless_deploy.decisions.device import CPU_DEVICE, DeviceVerdict, device_verdict
from tensorless_deploy.decisions.guard import branch_checks, health_checks
from tensorless_deploy.decisions.options import DEFAULT_BIND, address
from tensorless_deploy.facts.device import parse_device_log
from tensorless_deploy.facts.survey import PROBE_TIMEOUT_S
from tensorless_deploy.facts.values import (
    LABEL_BIND,
    LABEL_CARD,
    LABEL_DEVICE,
    LABEL_MODEL,
    LABEL_PORT,
    LABEL_RECIPE_DIGEST,
    LABEL_TUNED,
    DeployedUnit,
    HostFacts,
)
from tensorless_deploy.hostplan.plan import HostPlan
from tensorless_deploy.launch.read import FieldDrift, drift, read_unit

State = Literal["serving", "loading", "unhealthy", "crash loop", "failed", "stopped"]
# status's exit codes (docs/commands.md, docs/day-two.md): the worst host decides, in the order
# 1, 4, 3, 0 (2 is every command's usage error)
EXIT_OK, EXIT_UNHEALTHY, EXIT_DRIFT, EXIT_NOTHING = 0, 1, 3, 4


@dataclass(frozen=True)
class Load:
    """What llama-server's /metrics says of one instance now (its llamacpp: samples)."""

    busy_slots: int  # requests_processing: slots working on a request
    queued: int  # requests_deferred: requests waiting for a free slot
    # generation speed since the server started: tokens_predicted_total over
    # tokens_predicted_seconds_total (the predicted_tokens_seconds gauge covers only the time
    # since the last read of /metrics by anyone, and each read resets it)
    tokens_per_second: float
    tokens_predicted: int  # tokens_predicted_total: generated since the server started
    prompt_tokens: int  # prompt_tokens_total: prompt tokens processed since it started

    def json(self) -> dict[str, Any]:
        return {
            "busy_slots": self.busy_slots,
            "queued_requests": self.queued,
            "tokens_per_second": self.tokens_per_second,
            "tokens_predicted_total": self.tokens_predicted,
            "prompt_tokens_total": self.prompt_tokens,
        }

    def text(self) -> str:
        return (
            f"{self.busy_slots} busy, {self.queued} queued, {self.tokens_per_second:.1f} tok/s gen"
        )


def load(u: DeployedUnit) -> tuple[Load | None, str | None]:
    """The unit's load from the /metrics it answered, or why there is none (None, None: the unit
    does not enable metrics, or they were not asked for)."""
    if u.metrics_status is None:
        return None, None
    if u.metrics_status != 200:
        why = {
            0: "/metrics did not answer",
            401: "/metrics answered 401: the unit's API key on the host is readable by root "
            "only (status as root, or with _sudo)",
        }.get(u.metrics_status, f"/metrics answered {u.metrics_status}")
        return None, why
    m = u.metrics
    tokens, seconds = (
        m.get("tokens_predicted_total", 0.0),
        m.get("tokens_predicted_seconds_total", 0.0),
    )
    return (
        Load(
            busy_slots=int(m.get("requests_processing", 0)),
            queued=int(m.get("requests_deferred", 0)),
            tokens_per_second=round(tokens / seconds, 2) if seconds > 0 else 0.0,
            tokens_predicted=int(tokens),
            prompt_tokens=int(m.get("prompt_tokens_total", 0)),
        ),
        None,
    )


@dataclass(frozen=True)
class UnitStatus:
    unit: str
    kind: str
    model: str | None
    card: str | None
    address: str | None
    active: str
    state: State
    healthy: bool
    tuned: bool | None
    recipe_digest: str | None  # what the running container was started from
    image: str | None
    drift: tuple[FieldDrift, ...]
    restarts: int | None = None
    rollback: bool = False  # a previous unit is kept: `rollback` can bring it back
    load: Load | None = None  # from /metrics, where the unit enables it
    load_error: str | None = None  # why a metrics-enabled unit's /metrics could not be read
    engine_code: Check | None = None  # the plan's engine.code: the image's code for the card

    @property
    def code(self) -> str:
        """The engine's device code in a word or two (status's CODE column)."""
        c = self.engine_code
        if c is None:
            return "-"
        if "CPU build" in c.evidence:
            return "cpu"
        hit = re.search(r"machine code for (sm_[0-9]+)", c.evidence)
        if c.status == "ok" and hit:
            return hit.group(1)
        return "PTX only" if "only PTX" in c.evidence else c.status.upper()

    device: str | None = None  # what it runs on, as its start log says (None: not known)
    door: str | None = None  # its state at the front door that fronts its host (None: none)

    def json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "kind": self.kind,
            "model": self.model,
            "card": self.card,
            "address": self.address,
            "active": self.active,
            "state": self.state,
            "healthy": self.healthy,
            "tuned": self.tuned,
            "recipe_digest": self.recipe_digest,
            "image": self.image,
            "restarts": self.restarts,
            "rollback_available": self.rollback,
            "metrics": self.load.json() if self.load is not None else None,
            "metrics_error": self.load_error,
            "engine_code": None
            if self.engine_code is None
            else {"status": self.engine_code.status, "evidence": self.engine_code.evidence},
            "device": self.device,
            "door": self.door,
            "drift": [
                {"field": d.field, "deployed": d.deployed, "wanted": d.wanted} for d in self.drift
            ],
        }


def device_of(u: DeployedUnit) -> DeviceVerdict | None:
    """What a running unit's start log says it runs on, judged by its io.tensorless.device
    label (None: no label, not running, or the start log is no longer in the journal)."""
    label = u.unit_labels.get(LABEL_DEVICE)
    if label is None or u.active != "active":
        return None
    report = parse_device_log(u.device_log)
    if label != CPU_DEVICE and not report.said_anything:
        return None
    return device_verdict(label, report)


def _state(u: DeployedUnit) -> State:
    if u.health == 200:
        return "serving"
    # Restart=always with no start limit: a dying server waits out RestartSec (auto-restart)
    # and starts again, restart after restart, NRestarts counting; units of older versions
    # (Restart=on-failure and a start limit) end failed with Result start-limit-hit, or on
    # systemd 257 the last run's Result with NRestarts > 0
    restarts = u.restarts or 0
    if u.sub_state == "auto-restart" or u.result == "start-limit-hit":
        return "crash loop"
    if (u.active == "failed" or (u.active == "activating" and u.health != 503)) and restarts:
        return "crash loop"
    # restarted, and its run now answers nothing at all (not even 503 loading): between two
    # starts of a loop the service is active for the while its server takes to die again
    if u.active == "active" and u.health == 0 and restarts:
        return "crash loop"
    if u.active == "failed":
        return "failed"
    if u.active in ("inactive", "unknown") and u.sub_state in (None, "dead"):
        return "stopped"
    if u.health == 503 or u.active == "activating":
        return "loading"
    return "unhealthy"


def _address(labels: dict[str, str]) -> str | None:
    """Where the unit serves, from its port and bind labels (None: no port label)."""
    port = labels.get(LABEL_PORT, "")
    return address(labels.get(LABEL_BIND) or DEFAULT_BIND, int(port)) if port.isdigit() else None


def _host_drift(u: DeployedUnit) -> list[FieldDrift]:
    """How the unit drifted on the host itself: edited by hand, a container started from
    another recipe than its unit file says (a restart pending), or an active service with no
    container."""
    found: list[FieldDrift] = []
    if u.edited:
        found.append(
            FieldDrift(
                "unit",
                f"edited on the host (sha256 {str(u.sha256)[:12]})",
                f"as tensorless-deploy wrote it (sha256 {str(u.written_sha256)[:12]})",
            )
        )
    running = u.container_labels.get(LABEL_RECIPE_DIGEST)
    written = u.unit_labels.get(LABEL_RECIPE_DIGEST)
    if running and written and running != written:
        found.append(
            FieldDrift(
                "container",
                f"started from {running[:19]}",
                f"unit file says {written[:19]}: restart pending",
            )
        )
    if u.container_labels == {} and u.active == "active":
        found.append(FieldDrift("container", "none found", "the service is active"))
    return found


def _unplanned_drift(u: DeployedUnit, in_catalog: bool) -> list[FieldDrift]:
    """No plan for the unit's model: a model label the catalog does not have is drift."""
    model, card = u.unit_labels.get(LABEL_MODEL), u.unit_labels.get(LABEL_CARD)
    if model and not in_catalog:
        return [FieldDrift("recipe", f"{model} on {card}", "not in the catalog")]
    return []


def _plan_drift(u: DeployedUnit, plan: HostPlan) -> list[FieldDrift]:
    """How the unit differs from the plan's instance of its name: not planned now, the unit
    file field by field, the image."""
    inst = next((i for i in plan.instances if i.name == u.name), None)
    if plan.recipe is None or inst is None or inst.unit is None:
        why = plan.why() if not plan.ok else "not one of the plan's instances"
        return [FieldDrift("instance", "deployed", f"not planned now: {why}")]
    found: list[FieldDrift] = []
    wanted = inst.unit
    if wanted.content != u.text:
        fields = drift(
            read_unit(u.path, u.text),
            read_unit(wanted.path, wanted.content),
            u.text,
            wanted.content,
        )
        # an edit by hand is already said; the fields say what it changed
        found += [d for d in fields if not (u.edited and d.field == "unit")]
    if u.image and u.image != plan.recipe.engine.image:
        found.append(FieldDrift("image", u.image, plan.recipe.engine.image))
    return found


def _device_drift(u: DeployedUnit, where_on: DeviceVerdict | None) -> list[FieldDrift]:
    """A running unit whose start log says it is not on the device its label names."""
    if where_on is None or where_on.ok:
        return []
    label = u.unit_labels.get(LABEL_DEVICE, "?")
    return [FieldDrift("device", f"{where_on.device}: {where_on.why}", f"on {label}")]


def _engine_code(plan: HostPlan | None) -> Check | None:
    """The plan's engine.code row (None: no plan, or no such row)."""
    if plan is None:
        return None
    return next((c for c in plan.verdict.checks if c.id == "engine.code"), None)


def unit_status(u: DeployedUnit, plan: HostPlan | None, in_catalog: bool) -> UnitStatus:
    """One unit against the host plan of its model (None: its model is not in the catalog,
    or it carries no model label)."""
    labels = u.container_labels or u.unit_labels
    running = u.container_labels.get(LABEL_RECIPE_DIGEST)
    written = u.unit_labels.get(LABEL_RECIPE_DIGEST)
    tuned = labels.get(LABEL_TUNED)
    found = _host_drift(u)
    found += _unplanned_drift(u, in_catalog) if plan is None else _plan_drift(u, plan)
    state = _state(u)
    now, unread = load(u)
    where_on = device_of(u)
    found += _device_drift(u, where_on)
    return UnitStatus(
        unit=u.name,
        kind=u.kind,
        model=u.unit_labels.get(LABEL_MODEL),
        card=u.unit_labels.get(LABEL_CARD),
        address=_address(labels),
        active=u.active,
        state=state,
        healthy=state == "serving",
        tuned=None if tuned is None else tuned == "true",
        recipe_digest=running or written,
        image=u.image,
        drift=_dedupe(found),
        restarts=u.restarts,
        rollback=u.previous_sha256 is not None,
        load=now,
        load_error=unread,
        engine_code=_engine_code(plan),
        device=where_on.device if where_on is not None else None,
    )


def host_card_checks(facts: HostFacts) -> tuple[Check, ...]:
    """What status says of a host's cards: nvidia-smi answering, the driver branch and module
    for the cards a ceiling covers, and every card's health (the doctor rows, all cards)."""
    out: list[Check] = []
    if facts.gpus.state == "hung":
        out.append(
            Check(
                "gpu.responsive",
                "fail",
                f"GPU hung: nvidia-smi did not answer within {PROBE_TIMEOUT_S} s",
                GPU_HUNG_FIX,
            )
        )
    out += branch_checks(facts)
    if facts.gpus.state == "ok":
        out += health_checks(facts, facts.gpus.gpus)
    return tuple(out)


def cards_word(checks: Sequence[Check]) -> str:
    """status's CARDS column: ok, or the worst status and the checks that have it."""
    bad = [c for c in checks if c.status == "fail"] or [c for c in checks if c.status == "warn"]
    if not bad:
        return "ok" if checks else "-"
    if bad[0].id == "gpu.responsive":
        return "GPU hung"
    return f"{bad[0].status.upper()} " + ", ".join(dict.fromkeys(c.id for c in bad))


def _dedupe(items: Sequence[FieldDrift]) -> tuple[FieldDrift, ...]:
    seen: set[tuple[str, str, str]] = set()
    out = []
    for d in items:
        key = (d.field, d.deployed, d.wanted)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return tuple(out)


def exit_code(
    unreachable: bool, units: Sequence[UnitStatus], cards_fail: bool = False, idle: bool = False
) -> int:
    """1: a host unreachable (or unreadable), a unit not serving or a card failing its health
    checks; 4: a host read serves nothing of this tool (idle), so a monitor can tell "nothing
    there" from "all well"; 3: all serving, something drifted; 0: everything serves as the
    catalog says."""
    if unreachable or cards_fail or any(not u.healthy for u in units):
        return EXIT_UNHEALTHY
    if idle:
        return EXIT_NOTHING
    if any(u.drift for u in units):
        return EXIT_DRIFT
    return EXIT_OK


def _label(content_labels: Sequence[str], key: str) -> str | None:
    for kv in content_labels:
        k, _, v = kv.partition("=")
        if k == key:
            return v
    return None


def rollback_preview(u: DeployedUnit) -> tuple[str, ...]:
    """What `rollback --dry-run` says a unit would go back to: the kept unit's recipe, and
    field by field how it differs from what runs now (pure)."""
    if not u.previous_text:
        return ()
    now, then = read_unit(u.path, u.text), read_unit(u.path, u.previous_text)
    digest = _label(then.values("label"), LABEL_RECIPE_DIGEST) or "unknown"
    current = _label(now.values("label"), LABEL_RECIPE_DIGEST) or "unknown"
    same = "the same recipe" if digest == current else f"now {current[:19]}"
    lines = [f"would go back to the unit kept from before: recipe {digest[:19]} ({same})"]
    changes = drift(now, then, u.text, u.previous_text)
    lines += [f"{d.field}: {d.deployed} -> {d.wanted}" for d in changes]
    return tuple(lines)


def model_file(u: DeployedUnit) -> str | None:
    """The model file on the host a unit mounts (what `stop --purge` would remove)."""
    volumes = read_unit(u.path, u.text).volumes(secrets=False)
    return volumes[0].split(":", 1)[0] if volumes else None
