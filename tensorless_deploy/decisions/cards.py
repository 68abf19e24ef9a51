"""Facts of the cards themselves, beside the card rules of decisions.checks: the newest driver
branch, kernel-module flavour and CUDA major a compute capability can have (the ceilings), and
what a card's health readings must stay within (the thresholds). Data with their sources
(docs/field-notes.md#pascal); pure, and light enough for ``info`` to import.

The recipe schema does not carry these (it stays schema 1): they are the same for every recipe
of a card, and they change when NVIDIA retires a family, not when a recipe is measured.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Ceiling:
    """What cards below ``below`` (a compute capability) can run at most."""

    below: tuple[int, int]  # cards with a compute capability under this
    family: str  # who they are, in the operator's words
    max_branch: int  # the last driver branch that drives them
    proprietary_only: bool  # the open kernel modules do not drive them (no GSP)
    max_cuda_major: int  # the newest CUDA major that can target them
    legacy_name: str  # the driver's own name for that branch ("580.xx Legacy")


# Newest first; a card takes the first row whose bound it is under, so the lowest bound wins.
CEILINGS: tuple[Ceiling, ...] = (
    # NVIDIA: R580 is the last branch for Maxwell, Pascal and Volta (a long-term branch,
    # supported to 2028); 590 and later load and ignore them ("supported through the NVIDIA
    # 580.xx Legacy drivers"). The open kernel modules need a GSP, which starts at Turing.
    # CUDA 13 removed compute capability < 7.5; CUDA 12.x is the last that targets them.
    Ceiling((7, 5), "Maxwell, Pascal, Volta (compute < 7.5)", 580, True, 12, "580.xx Legacy"),
    # Kepler: the 470.xx Legacy branch; CUDA 12 dropped compute 3.x (11.x is its last).
    Ceiling((5, 0), "Kepler (compute < 5.0)", 470, True, 11, "470.xx Legacy"),
)


def cc_tuple(compute_capability: str) -> tuple[int, int] | None:
    match = re.fullmatch(r"([0-9]+)\.([0-9]+)", compute_capability.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


@functools.lru_cache(maxsize=64)  # a fleet has a few kinds of card; a plan asks for each card
def ceiling_for(compute_capability: str) -> Ceiling | None:
    """The ceilings of a card of this compute capability ("6.0"); None: none known (a card
    that every current branch, both module flavours and every CUDA major still serve)."""
    cc = cc_tuple(compute_capability)
    if cc is None:
        return None
    hits = [c for c in CEILINGS if cc < c.below]
    return min(hits, key=lambda c: c.below) if hits else None


def describe(ceiling: Ceiling) -> str:
    """One line, as ``info`` and ``plan`` show it."""
    modules = "proprietary kernel modules only" if ceiling.proprietary_only else "any modules"
    return (
        f"driver branch {ceiling.max_branch} or older ({ceiling.legacy_name}), {modules}, "
        f"CUDA {ceiling.max_cuda_major}.x images at most: {ceiling.family}"
    )


def branch_of(version: str) -> int | None:
    """A driver's branch: its major version ("535.183.01" -> 535)."""
    match = re.match(r"([0-9]+)\.", version)
    return int(match.group(1)) if match else None


# --- card health ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthRule:
    """One reading of nvidia-smi -q -x or the kernel log: its check, how bad it is past its
    threshold, and the fix."""

    check: str
    status: Literal["warn", "fail"]
    fix: str


# NVIDIA's dynamic page retirement guide: a page with a double-bit error (Xid 48) is retired
# when the driver next loads (Xid 63: "reload the driver to activate"); until then it can be
# handed out again.
REBOOT_FIX = (
    "reboot the host (or reload the driver) in a window you choose (tensorless-deploy maintain "
    "begin/end stops and starts its units around it): the driver retires the pending pages "
    "when it loads; if double-bit errors or retirements come back, replace the card"
)
HEALTH_RULES: dict[str, HealthRule] = {
    # a double-bit error since the driver loaded: data was corrupted; its page retires at boot
    "double_bit": HealthRule("card.ecc", "fail", REBOOT_FIX),
    # pages (or rows) waiting for the next boot to be retired: until then they can be reused
    "pending": HealthRule("card.pages", "fail", REBOOT_FIX),
    # the driver itself asks for a reset or a reboot (gpu_recovery_action, 580 and later)
    "recovery": HealthRule(
        "card.recovery",
        "fail",
        "do what the driver asks (a GPU reset: sudo nvidia-smi -r -i INDEX, with nothing on the "
        "card; a node reboot: reboot the host), then run doctor again; replace the card if it "
        "keeps asking",
    ),
    # kernel log events that mean the card lost data or the bus (see XID_FAIL)
    "xid_fatal": HealthRule(
        "card.xid",
        "fail",
        "read the card's Xid lines (sudo journalctl -k -b | grep Xid), reboot the host, and "
        "replace the card if they come back",
    ),
    "xid": HealthRule(
        "card.xid",
        "warn",
        "read them (sudo journalctl -k -b | grep Xid; NVIDIA's Xid catalog says what each "
        "means); a card that keeps logging them is failing",
    ),
    "lifetime_double_bit": HealthRule(
        "card.ecc",
        "warn",
        "the card has had double-bit errors in its life (their pages are retired): watch the "
        "counts (nvidia-smi -q -d ECC,PAGE_RETIREMENT) and replace the card when they grow",
    ),
    "single_bit": HealthRule(
        "card.ecc",
        "warn",
        "corrected errors: the card still serves; watch the counts (nvidia-smi -q -d ECC) and "
        "plan a replacement if they grow",
    ),
    "ecc_off": HealthRule(
        "card.ecc",
        "warn",
        "turn ECC on (sudo nvidia-smi -i INDEX -e 1, then reboot): without it memory errors go "
        "unseen",
    ),
    "retired": HealthRule(
        "card.pages",
        "warn",
        "retired pages are out of use and harmless, but a count that grows is a failing card: "
        "watch it (nvidia-smi -q -d PAGE_RETIREMENT) and plan a replacement",
    ),
    "throttle": HealthRule(
        "card.throttle",
        "warn",
        "check the card's cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER): "
        "a thermal or power-brake slowdown lowers its speed",
    ),
    "pcie": HealthRule(
        "card.pcie",
        "warn",
        "reseat the card (or move it to a full-width slot) and check the riser: the link "
        "trained below its maximum",
    ),
    "persistence": HealthRule(
        "card.persistence",
        "warn",
        "turn persistence mode on (sudo systemctl enable --now nvidia-persistenced, or "
        "sudo nvidia-smi -pm 1): without it the driver tears the card down between uses",
    ),
}
# Xid codes that mean lost data or a lost card (NVIDIA's Xid catalog); every other Xid warns.
XID_FAIL: dict[int, str] = {
    48: "double-bit ECC error",
    64: "page retirement failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
}
# Reasons that slow a card for heat or power hardware (not idle, application clocks or its cap).
THROTTLE_WARN = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
)
HEALTH_CHECKS = (
    "card.health",
    "card.ecc",
    "card.pages",
    "card.recovery",
    "card.xid",
    "card.throttle",
    "card.pcie",
    "card.persistence",
)
