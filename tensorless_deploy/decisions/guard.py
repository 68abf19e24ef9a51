"""The Pascal guard (pure): the checks of what breaks old-card fleets, each with its id and fix.

* ``driver.branch``: the loaded driver's branch against the card's ceiling (decisions.cards),
  read from the kernel module itself, so that "No devices were found" under a 590 driver is named
  for what it is; the kernel log's ``NVRM ... Legacy drivers`` notice is its evidence;
* ``driver.module``: the kernel module's flavour (the open modules drive Turing and later only);
* ``card.*``: each card's health from ``nvidia-smi -q -x`` and the kernel log's Xid lines,
  judged by the thresholds of decisions.cards;
* ``engine.code``: whether the recipe's engine image holds machine code for the card.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tensorless_deploy.decisions.cards import (
    CEILINGS,
    HEALTH_RULES,
    THROTTLE_WARN,
    XID_FAIL,
    Ceiling,
    HealthRule,
    branch_of,
    cc_tuple,
    ceiling_for,
)
from tensorless_deploy.decisions.checks import Check
from tensorless_deploy.facts.nvidia import DRIVER_PIN_FILE as PIN_FILE
from tensorless_deploy.facts.values import (
    CardHealth,
    EngineImage,
    Gpu,
    HealthReport,
    HostFacts,
    KernelLog,
    XidEvent,
)

# The kernel-module and engine checks' ids (docs/doctor.md lists each with its fix).
BRANCH = "driver.branch"
MODULE = "driver.module"
ENGINE_CODE = "engine.code"


@dataclass(frozen=True)
class Concerned:
    """A card whose ceilings apply here: what it is, where that was seen, and its ceiling."""

    what: str  # "GPU 0 Tesla P100-PCIE-16GB (compute 6.0)", "the recipe's card p100 (...)"
    ceiling: Ceiling


def _concerned(facts: HostFacts, card_cc: str | None, card_id: str | None) -> list[Concerned]:
    """Every card here (or asked for) that a ceiling covers: the GPUs nvidia-smi lists, the
    recipe's card, and the cards the kernel log says the driver ignored."""
    out: list[Concerned] = []
    for gpu in facts.gpus.gpus:
        c = ceiling_for(gpu.compute_cap) if gpu.compute_cap else None
        if c is not None:
            out.append(Concerned(f"GPU {gpu.index} {gpu.name} (compute {gpu.compute_cap})", c))
    log = facts.kernel_log
    if log is not None:
        for notice in log.legacy:
            # the notice names the branch that still drives the card: "580.xx"
            branch = branch_of(notice.legacy_branch.replace("xx", "0"))
            hit = next((c for c in CEILINGS if branch is not None and c.max_branch == branch), None)
            if hit is not None:
                out.append(Concerned(f"{notice.card} (the kernel log's NVRM notice)", hit))
    if card_cc is not None and not out:
        c = ceiling_for(card_cc)
        if c is not None:
            out.append(Concerned(f"the recipe's card {card_id} (compute {card_cc})", c))
    return out


def _driver(facts: HostFacts) -> tuple[str | None, str]:
    """The loaded driver's version and where it was read: the kernel module first."""
    module = facts.module
    if module is not None and module.loaded and module.version:
        return module.version, f"kernel module, {module.flavour}"
    if facts.gpus.driver_version is not None:
        return facts.gpus.driver_version, "nvidia-smi"
    log = facts.kernel_log
    if log is not None and log.legacy:
        return log.legacy[0].driver_version, "the kernel log"
    return None, ""


def loaded_driver(facts: HostFacts) -> str | None:
    """The loaded driver's version (the kernel module's first): what driver.lock keeps."""
    return _driver(facts)[0]


def _names(concerned: Sequence[Concerned]) -> str:
    return "; ".join(dict.fromkeys(c.what for c in concerned))


def branch_fix(ceiling: Ceiling) -> str:
    b = ceiling.max_branch
    return (
        f"install the {b} branch of the driver (Ubuntu: sudo apt install nvidia-driver-{b}-server; "
        f"Debian or RHEL: the {b} driver packages of NVIDIA's CUDA repository; or NVIDIA's .run "
        f"installer of a {b}.xx release), reboot, then tensorless-deploy prepare keeps it on "
        f"{b} (driver.lock)"
    )


def branch_checks(
    facts: HostFacts, card_cc: str | None = None, card_id: str | None = None
) -> list[Check]:
    """driver.branch and driver.module for the cards a ceiling covers (none: no rows)."""
    concerned = _concerned(facts, card_cc, card_id)
    log = facts.kernel_log
    refusals = log.open_refusals if log is not None else ()
    if not concerned and not refusals:
        return []
    checks: list[Check] = []
    version, source = _driver(facts)
    branch = branch_of(version) if version else None
    if concerned and branch is not None:
        ceiling = min((c.ceiling for c in concerned), key=lambda c: c.max_branch)
        if branch > ceiling.max_branch:
            parts = [
                f"driver {version} ({source}) is past {ceiling.max_branch}, the last branch "
                f"that drives {_names(concerned)}: it loads and ignores the card"
            ]
            if log is not None and log.legacy:
                n = log.legacy[0]
                parts.append(
                    f"the kernel log says so (NVRM: The NVIDIA {n.card} GPU ... is supported "
                    f"through the NVIDIA {n.legacy_branch} Legacy drivers ... The "
                    f"{n.driver_version} NVIDIA driver will ignore this GPU)"
                )
            if facts.gpus.state == "no_devices":
                parts.append("hence nvidia-smi's 'No devices were found'")
            checks.append(Check(BRANCH, "fail", "; ".join(parts), branch_fix(ceiling)))
        else:
            checks.append(
                Check(
                    BRANCH,
                    "ok",
                    f"driver {version} ({source}): within {ceiling.max_branch}, the last branch "
                    f"for {_names(concerned)}",
                )
            )
    module = facts.module
    needs_proprietary = any(c.ceiling.proprietary_only for c in concerned) or bool(refusals)
    if needs_proprietary and module is not None and module.loaded:
        if module.flavour == "open" or refusals:
            what = _names(concerned) or ", ".join(f"the GPU at {r.pci}" for r in refusals)
            seen = (
                f"the open kernel module is loaded ({module.text}); it drives only cards with a "
                f"GSP (Turing, compute 7.5, and later), not {what}"
            )
            if refusals:
                r = refusals[0]
                seen += (
                    f"; the kernel log says so (NVRM: The NVIDIA GPU {r.pci} (PCI ID: {r.pci_id}) "
                    "... is not supported by open nvidia.ko ... GPU System Processor (GSP))"
                )
            b = branch_of(module.version or "") or 580
            checks.append(
                Check(
                    MODULE,
                    "fail",
                    seen,
                    f"install the proprietary kernel module of the same branch and reboot "
                    f"(Ubuntu: nvidia-driver-{b}-server, not nvidia-driver-{b}-server-open; "
                    "Debian: nvidia-kernel-dkms, not nvidia-open-kernel-dkms; NVIDIA's .run "
                    "installer: without -m=kernel-open)",
                )
            )
        else:
            checks.append(Check(MODULE, "ok", f"proprietary kernel module {module.version}"))
    return checks


# --- card health ---------------------------------------------------------------------------


def _pci_key(pci: str | None) -> str | None:
    """0000:07:00 from nvidia-smi's "00000000:07:00.0" and the Xid line's "PCI:0000:07:00"."""
    if pci is None:
        return None
    match = re.search(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})", pci)
    if match is None:
        return None
    return f"{match.group(1)[-4:]}:{match.group(2)}:{match.group(3)}".lower()


def _on(mode: str | None) -> str:
    return {"Enabled": "on", "Disabled": "off"}.get(mode or "", mode or "?")


def _label(card: CardHealth, gpu: Gpu | None) -> str:
    index = gpu.index if gpu is not None else card.index
    return f"GPU {index} {card.name}"


# (rule of decisions.cards.HEALTH_RULES, card, what was read): one reading that is not ok
Note = tuple[str, str, str]


def _no_health(report: HealthReport) -> Check:
    """nvidia-smi -q -x gave no readings (the cards' health is unknown, not failed)."""
    return Check(
        "card.health",
        "warn",
        f"nvidia-smi -q -x gave no health ({report.state}, exit {report.exit_code}): "
        f"{report.message[:200]}",
        "run nvidia-smi -q -x on the host and fix what it reports",
    )


def _xids_by_pci(log: KernelLog | None) -> dict[str | None, list[XidEvent]]:
    """The kernel log's Xid lines by the card's PCI address (_pci_key)."""
    xids: dict[str | None, list[XidEvent]] = {}
    for x in log.xids if log is not None else ():
        xids.setdefault(_pci_key(x.pci), []).append(x)
    return xids


def _xid_rule(x: XidEvent) -> str:
    return "xid_fatal" if x.code in XID_FAIL else "xid"


def _ecc_notes(card: CardHealth, name: str) -> list[Note]:
    """Double-bit errors (since boot, else in its life), single-bit errors, ECC off."""
    out: list[Note] = []
    if card.volatile_dbe:
        out.append(("double_bit", name, f"{card.volatile_dbe} double-bit ECC error(s) since boot"))
    elif card.aggregate_dbe:
        out.append(("lifetime_double_bit", name, f"{card.aggregate_dbe} double-bit ECC error(s)"))
    if card.volatile_sbe or card.aggregate_sbe:
        out.append(
            (
                "single_bit",
                name,
                f"{card.volatile_sbe or 0} single-bit ECC error(s) since boot, "
                f"{card.aggregate_sbe or 0} in its life",
            )
        )
    if card.ecc_mode == "Disabled":
        out.append(("ecc_off", name, "ECC is off"))
    return out


def _memory_notes(card: CardHealth, name: str) -> list[Note]:
    """Pages pending retirement or a failed row remap, pages retired, the driver's recovery
    action, clocks slowed by a reason that warns."""
    out: list[Note] = []
    if card.retirement_pending or card.remap_failed:
        what = "pages pending retirement" if card.retirement_pending else "a row remap failed"
        out.append(("pending", name, f"{what} (until the driver reloads they can be reused)"))
    retired = (card.retired_sbe_pages or 0) + (card.retired_dbe_pages or 0)
    if retired:
        out.append(("retired", name, f"{retired} page(s) retired"))
    if card.recovery_action not in (None, "None"):
        out.append(("recovery", name, f"the driver asks for: {card.recovery_action}"))
    slow = [r for r in card.throttle_active if r in THROTTLE_WARN]
    if slow:
        out.append(("throttle", name, "clocks slowed: " + ", ".join(slow)))
    return out


def _pcie(card: CardHealth, name: str) -> tuple[str, list[Note]]:
    """The PCIe link as trained, of its most ("" when not read), and a link narrower than its
    most, or slower under load."""
    if not (card.pcie_width and card.pcie_width_max):
        return "", []
    link = (
        f"PCIe gen{card.pcie_gen} x{card.pcie_width} of "
        f"gen{card.pcie_gen_max} x{card.pcie_width_max}"
    )
    if card.pcie_width < card.pcie_width_max:
        return link, [
            ("pcie", name, f"link trained at x{card.pcie_width} of x{card.pcie_width_max}")
        ]
    if (
        card.pcie_gen
        and card.pcie_gen_max
        and card.pcie_gen < card.pcie_gen_max
        and card.performance_state == "P0"
    ):
        # an idle card drops its link speed to save power; at P0 it should not
        gens = f"gen{card.pcie_gen} of gen{card.pcie_gen_max}"
        return link, [("pcie", name, f"link at {gens} under load")]
    return link, []


def _card_notes(card: CardHealth, name: str, xids: Sequence[XidEvent]) -> tuple[list[Note], str]:
    """Every reading of one card that is not ok, in the order of the rows; and its line of the
    all-well summary."""
    pcie, link_notes = _pcie(card, name)
    notes = [*_ecc_notes(card, name), *_memory_notes(card, name), *link_notes]
    if card.persistence_mode == "Disabled":
        notes.append(("persistence", name, "persistence mode off"))
    for x in xids:
        why = XID_FAIL.get(x.code, "")
        what = f"Xid {x.code}" + (f" ({why})" if why else "") + f": {x.text[:120]}"
        notes.append((_xid_rule(x), name, what))
    summary = (
        f"{name}: ECC {_on(card.ecc_mode)}, {pcie or 'PCIe ?'}, persistence mode "
        f"{_on(card.persistence_mode)}"
    )
    return notes, summary


def _rows(notes: Sequence[Note]) -> list[Check]:
    """The cards nvidia-smi -q -x left out first, then one row per check id, its worst rule
    first (check ids in the order their first reading came)."""
    found: dict[str, list[tuple[str, str]]] = {}  # rule name -> (card, what)
    for rule, card, what in notes:
        found.setdefault(rule, []).append((card, what))
    checks: list[Check] = []
    if "unread" in found:
        unread = "; ".join(f"{c}: {w}" for c, w in found.pop("unread"))
        checks.append(Check("card.health", "warn", unread, "run nvidia-smi -q -x on the host"))
    by_check: dict[str, list[tuple[HealthRule, str, str]]] = {}
    for rule, noted in found.items():
        r = HEALTH_RULES[rule]
        for card_name, what in noted:
            by_check.setdefault(r.check, []).append((r, card_name, what))
    for check_id, rows in by_check.items():
        rows.sort(key=lambda row: row[0].status != "fail")
        worst = rows[0][0]
        evidence = "; ".join(f"{card_name}: {what}" for _, card_name, what in rows)
        checks.append(Check(check_id, worst.status, evidence, worst.fix))
    return checks


def _all_well(summary: Sequence[str], log: KernelLog | None) -> Check:
    """The one card.health row when every reading is ok: a warning when the kernel log (the
    Xid lines) could not be read."""
    read = log is not None and log.source is not None
    xid_note = "no Xid since boot" if read else "the kernel log could not be read (Xid unknown)"
    return Check(
        "card.health",
        "ok" if read else "warn",
        "; ".join(summary) + f"; no ECC errors, no retired or pending pages, {xid_note}",
        None if read else "let this login read the kernel log (root, or the systemd-journal group)",
    )


def health_checks(facts: HostFacts, gpus: Sequence[Gpu], all_cards: bool = True) -> list[Check]:
    """The health of these cards (the recipe's matching cards, or all), one row per reading
    that is not ok; one ``card.health`` ok row when every reading is. all_cards: an Xid of a
    card not in ``gpus`` (one fallen off the bus is in no list) counts too."""
    report = facts.health
    if report is None or not gpus:
        return []
    if report.state == "hung":
        return []  # gpu.responsive says it (the first nvidia-smi hung too, or will)
    if report.state != "ok":
        return [_no_health(report)]
    by_uuid = {c.uuid: c for c in report.cards if c.uuid}
    cards = [(g, by_uuid.get(g.uuid) if g.uuid else None) for g in gpus]
    xids = _xids_by_pci(facts.kernel_log)
    notes: list[Note] = []
    summary: list[str] = []
    for gpu, card in cards:
        if card is None:
            notes.append(("unread", f"GPU {gpu.index} {gpu.name}", "not in nvidia-smi -q -x"))
            continue
        name = _label(card, gpu)
        card_notes, line = _card_notes(card, name, xids.get(_pci_key(card.pci_bus_id), ()))
        notes += card_notes
        summary.append(line)
    seen_keys = {_pci_key(c.pci_bus_id) for _, c in cards if c is not None}
    loose = [x for k, xs in xids.items() if k not in seen_keys for x in xs] if all_cards else []
    notes += [(_xid_rule(x), x.pci, f"Xid {x.code}: {x.text[:120]}") for x in loose]
    return _rows(notes) or [_all_well(summary, facts.kernel_log)]


# --- the engine's code for the card --------------------------------------------------------

LABEL_ARCH = "io.tensorless.engine.arch"
LABEL_CUDA_ARCHS = "io.tensorless.engine.cuda-architectures"
LABEL_CUDA = "io.tensorless.engine.cuda"
_ARCH_ITEM = re.compile(r"([0-9]{2,3})(?:-(real|virtual))?")


def label_code(labels: dict[str, str]) -> tuple[set[int], set[int]] | None:
    """(machine-code archs, PTX archs) from the engine labels engine/build.sh writes:
    ``io.tensorless.engine.cuda-architectures`` in CMAKE_CUDA_ARCHITECTURES' words, where a bare
    ``NN`` is machine code (the image contract builds ``NN-real``) and ``NN-virtual`` is PTX;
    None: the image carries no such label."""
    raw = labels.get(LABEL_CUDA_ARCHS)
    if raw is None:
        return None
    real: set[int] = set()
    virtual: set[int] = set()
    for item in re.split(r"[;,\s]+", raw.strip()):
        match = _ARCH_ITEM.fullmatch(item)
        if match is None:
            continue
        arch = int(match.group(1))
        (virtual if match.group(2) == "virtual" else real).add(arch)
    return real, virtual


def short_image(image: str) -> str:
    """name@sha256:<first 12 hex>: enough to tell images apart in a line of evidence."""
    name, at, digest = image.partition("@sha256:")
    return f"{name}@sha256:{digest[:12]}" if at else image


def runs_on(arch: int, cc: tuple[int, int]) -> bool:
    """Machine code for sm_NN runs on a card of the same major and a minor at least its own."""
    major, minor = divmod(arch, 10)
    return major == cc[0] and minor <= cc[1]


def engine_code_check(arch: str, card_cc: str, image: str, known: EngineImage | None) -> Check:
    """engine.code: the recipe's engine (arch "cpu"; else the image's labels, or the fatbins of
    its contents, as read on the host or from the registry) against the card."""
    image = short_image(image)
    labels = known.labels if known is not None else None
    where = known.where if known is not None else "its labels were not read"
    code = label_code(labels) if labels is not None else None
    if code is None and known is not None and known.fatbin is not None:
        code = (
            {a for k, a in known.fatbin if k == "ELF"},
            {a for k, a in known.fatbin if k == "PTX"},
        )
        where += ", the fatbins of its libggml-cuda"
    if arch == "cpu":
        return Check(
            ENGINE_CODE,
            "ok",
            "the recipe's engine is a CPU build (engine.arch = cpu): it has no device code to "
            "check, and it serves on the CPU",
        )
    cc = cc_tuple(card_cc)
    sm = f"sm_{card_cc.replace('.', '')}"
    if labels is None or cc is None:
        return Check(
            ENGINE_CODE,
            "fail",
            f"cannot tell whether {image} holds machine code for {sm}: {where}",
            "make the registry reachable from this machine (or run: podman pull IMAGE on the "
            "host, so its labels are read there), then run doctor again",
        )
    if code is None:
        return Check(
            ENGINE_CODE,
            "fail",
            f"{image} names no CUDA architectures ({LABEL_CUDA_ARCHS} label) and holds no "
            f"readable fatbin: its code for {sm} is unknown",
            f"use an engine built for the card (engine/build.sh sm{card_cc.replace('.', '')}, "
            "which labels it) or check it with engine/inspect.sh IMAGE --arch smNN",
        )
    real, virtual = code
    cuda = labels.get(LABEL_CUDA, "")
    ceiling = ceiling_for(card_cc)
    major = re.match(r"([0-9]+)\.", cuda)
    if ceiling is not None and major and int(major.group(1)) > ceiling.max_cuda_major:
        return Check(
            ENGINE_CODE,
            "fail",
            f"{image} is built with CUDA {cuda}, which cannot target compute {card_cc} "
            f"(CUDA {ceiling.max_cuda_major}.x is the last for {ceiling.family})",
            f"use an engine built with CUDA {ceiling.max_cuda_major}.x for {sm} (the CUDA "
            "version nvidia-smi prints is the driver's, not the card's)",
        )
    hits = sorted(a for a in real if runs_on(a, cc))
    names = ", ".join(
        [f"sm_{a}" for a in sorted(real)] + [f"compute_{a} (PTX)" for a in sorted(virtual)]
    )
    if hits:
        return Check(
            ENGINE_CODE,
            "ok",
            f"{image}: machine code for sm_{hits[-1]} ({where}: {names or 'none'})",
        )
    ptx = sorted(a for a in virtual if (a // 10, a % 10) <= cc)
    if ptx:
        seen = (
            f"{image} holds only PTX for {sm} ({where}: {names}): the card would JIT-compile it "
            "at every start, untested, with the slow paths of a generic build"
        )
    else:
        seen = f"{image} has no code that runs on {sm} ({where}: {names or 'none'})"
    return Check(
        ENGINE_CODE,
        "fail",
        seen,
        f"use an engine built with machine code for {sm} (engine/build.sh "
        f"sm{card_cc.replace('.', '')}: CMAKE_CUDA_ARCHITECTURES={card_cc.replace('.', '')}-real)",
    )


# --- the driver's branch, locked ---------------------------------------------------------------

LOCK = "driver.lock"


def _other_branches(branch: int) -> str:
    """A POSIX ERE for every three-digit number but ``branch`` (apt's regexes have no
    lookahead): 535 -> (5[0-24-9][0-9]|53[0-46-9]|[0-46-9][0-9][0-9])."""
    digits = str(branch)
    a, b, c = digits[0], digits[1], digits[2]
    alts = [
        f"{a}{b}[0-{int(c) - 1}{int(c) + 1}-9]".replace("[0--1", "[").replace("10-9]", "]"),
        f"{a}[0-{int(b) - 1}{int(b) + 1}-9][0-9]".replace("[0--1", "[").replace("10-9]", "]"),
        f"[0-{int(a) - 1}{int(a) + 1}-9][0-9][0-9]".replace("[0--1", "[").replace("10-9]", "]"),
    ]
    return "(" + "|".join(alts) + ")"


def apt_pin(packages: Sequence[str], branch: int) -> str:
    """The apt preferences that keep the driver on ``branch``: its installed packages take any
    version of the branch (updates within it install) and no other; the packages of other
    branches by name (Ubuntu's nvidia-driver-NNN, Debian's nvidia-tesla-NNN-driver) never install.
    apt uses the first entry that matches a version (checked with the real apt on the test
    hosts, tests/test_pascal_hosts.py)."""
    names = " ".join(packages)
    other = _other_branches(branch) if 100 <= branch <= 999 else None
    by_name = (
        ""
        if other is None
        else (
            "\n"
            f"Package: /^(lib)?nvidia-[a-z0-9-]*-{other}(-server)?(-open)?$/ "
            f"/^nvidia-tesla-{other}(-.*)?$/\n"
            "Pin: version *\n"
            "Pin-Priority: -1\n"
        )
    )
    return (
        "# Written by tensorless-deploy prepare (check driver.lock): keep the NVIDIA driver on\n"
        f"# branch {branch}, where prepare found it. Updates within the branch install; another\n"
        "# branch never does. To change branches, remove this file (in a maintenance window).\n"
        f"Package: {names}\n"
        f"Pin: version /^([0-9]+:)?{branch}\\./\n"
        "Pin-Priority: 990\n"
        "\n"
        f"Package: {names}\n"
        "Pin: version *\n"
        "Pin-Priority: -1\n" + by_name
    )


def dnf_locks(entry: str, name: str) -> bool:
    """Whether a line of dnf's version-lock list locks package ``name``: dnf 4's
    ``NAME-EPOCH:VERSION-RELEASE.*``, dnf 5's ``name = "NAME"`` (versionlock.toml)."""
    bare = entry.strip()
    if bare.replace(" ", "") == f'name="{name}"':
        return True
    return bare.startswith(f"{name}-") and bare[len(name) + 1 : len(name) + 2].isdigit()


def driver_lock_check(facts: HostFacts) -> Check | None:
    """driver.lock: the loaded driver's packages are kept on its branch (apt: prepare's pin, or
    apt-mark holds; dnf: version locks). None: no package of the driver to lock."""
    pk = facts.driver_packages
    version, _ = _driver(facts)
    branch = branch_of(version) if version else None
    if pk is None or pk.manager is None or version is None or branch is None:
        return None
    mine = pk.of_driver(version)
    if not mine:
        return None
    listed = ", ".join(mine)
    fix = (
        "tensorless-deploy prepare -i INVENTORY --limit HOST (it locks the branch it finds and "
        "never installs, upgrades or removes the driver)"
    )
    if pk.manager == "apt":
        if pk.pin == apt_pin(mine, branch):
            return Check(LOCK, "ok", f"{listed} {version}: pinned to branch {branch} ({PIN_FILE})")
        if set(mine) <= set(pk.held):
            return Check(LOCK, "ok", f"{listed} {version}: held (apt-mark hold)")
        seen = (
            f"{listed} {version}: not locked; apt may move them to another branch (a "
            "transitional package of one branch can install the next)"
        )
        if pk.pin is not None:
            seen = f"{PIN_FILE} does not cover {listed} {version} on branch {branch}"
        return Check(LOCK, "warn", seen, fix)
    locked = [n for n in mine if any(dnf_locks(entry, n) for entry in pk.locks)]
    if len(locked) == len(mine):
        return Check(LOCK, "ok", f"{listed} {version}: version-locked (dnf versionlock)")
    return Check(LOCK, "warn", f"{listed} {version}: not version-locked (dnf)", fix)
