"""Pure parsers of what the NVIDIA driver says about itself and its cards: the loaded kernel
module (``/proc/driver/nvidia/version``), the NVRM lines of the kernel log, and the cards' health
(``nvidia-smi -q -x``); and of what an engine image says of its device code (its labels). Text
in, typed values out; the formats and where each was seen are in tests/fixtures/nvidia-smi and
tests/fixtures/nvidia-driver (their READMEs) and docs/field-notes.md."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable

from .errors import FactError
from .parsers import COMMAND_NOT_FOUND, nvidia_smi_state
from .values import (
    CardHealth,
    DriverModule,
    DriverPackages,
    EngineImage,
    HealthReport,
    KernelLog,
    KernelLogSource,
    LegacyNotice,
    OpenModuleRefusal,
    PackageManager,
    XidEvent,
)

# --- /proc/driver/nvidia/version ---------------------------------------------------------------

# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.07  Sat Feb 17 22:55:48 UTC 2024"
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (...)"
_MODULE = re.compile(
    r"NVRM version: NVIDIA UNIX (?:(?P<open>Open) |\S+ )?Kernel Module(?: for \S+)?\s+"
    r"(?P<version>[0-9]+(?:\.[0-9]+)+)"
)
MODULE_ABSENT = 2  # the survey's exit status when the file does not exist


def parse_module_version(output: str, exit_code: int) -> DriverModule:
    """The survey's ``nvidia-module`` section: the file's text, or exit 2 when it is absent."""
    if exit_code == MODULE_ABSENT:
        return DriverModule(loaded=False)
    first = next((line.strip() for line in output.splitlines() if line.strip()), "")
    match = _MODULE.search(output) if exit_code == 0 else None
    if match is None:
        raise FactError(f"/proc/driver/nvidia/version: unreadable (exit {exit_code}): {first!r}")
    return DriverModule(
        loaded=True,
        version=match.group("version"),
        flavour="open" if match.group("open") else "proprietary",
        text=first,
    )


# --- the kernel log's NVRM lines ---------------------------------------------------------------

SOURCE_MARKER = "@source "
_NVRM = re.compile(r"NVRM:\s*(.*)")
# The notices span several NVRM lines (one printk with newlines: dmesg and the journal print each
# line with its own "NVRM:"): they are matched in the NVRM text joined into one stream, with
# bounded gaps so that two unrelated messages never make one match.
_LEGACY = re.compile(
    r"The NVIDIA (?P<card>[^.]{1,80}?) GPU\b[^.]{0,80}? installed in this system is supported "
    r"through the NVIDIA (?P<branch>[0-9]+\.xx) Legacy drivers\..{0,200}? The "
    r"(?P<version>[0-9]+(?:\.[0-9]+)+) NVIDIA driver will ignore"
)
_OPEN_REFUSAL = re.compile(
    r"The NVIDIA GPU (?P<pci>\S+) \(PCI ID: (?P<id>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4})\) installed in "
    r"this system is not supported by open nvidia\.ko"
)
_XID = re.compile(r"^Xid \((?P<pci>PCI:[0-9A-Fa-f:.]+)\): (?P<code>[0-9]+),?\s*(?P<text>.*)$")


def _nvrm_texts(lines: Iterable[str]) -> list[str]:
    """The text after ``NVRM:`` of every line that has one, its whitespace collapsed."""
    texts = []
    for raw in lines:
        match = _NVRM.search(raw)
        if match is not None:
            texts.append(" ".join(match.group(1).split()))
    return texts


def parse_kernel_log(output: str, exit_code: int) -> KernelLog:
    """The survey's ``kernel-nvrm`` section: ``@source journal|dmesg`` then the NVRM lines
    since boot; exit 3 when neither the journal nor dmesg could be read."""
    lines = output.splitlines()
    source: KernelLogSource | None = None
    if lines and lines[0].startswith(SOURCE_MARKER):
        word = lines[0][len(SOURCE_MARKER) :].strip()
        source = "journal" if word == "journal" else "dmesg" if word == "dmesg" else None
        lines = lines[1:]
    if exit_code != 0 or source is None:
        why = " ".join(line.strip() for line in lines if line.strip())[:300]
        return KernelLog(source=None, message=why or f"exit {exit_code}")
    legacy: list[LegacyNotice] = []
    refusals: list[OpenModuleRefusal] = []
    xids: list[XidEvent] = []
    texts = _nvrm_texts(lines)
    stream = " ".join(texts)
    for hit in _LEGACY.finditer(stream):
        notice = LegacyNotice(
            card=hit.group("card").removeprefix("NVIDIA ").strip(),
            legacy_branch=hit.group("branch"),
            driver_version=hit.group("version"),
        )
        if notice not in legacy:
            legacy.append(notice)
    for hit in _OPEN_REFUSAL.finditer(stream):
        refusal = OpenModuleRefusal(pci=hit.group("pci"), pci_id=hit.group("id").lower())
        if refusal not in refusals:
            refusals.append(refusal)
    for text in texts:
        xid = _XID.match(text)
        if xid:
            xids.append(
                XidEvent(pci=xid.group("pci"), code=int(xid.group("code")), text=xid.group("text"))
            )
    return KernelLog(
        source=source, legacy=tuple(legacy), open_refusals=tuple(refusals), xids=tuple(xids)
    )


# --- nvidia-smi -q -x --------------------------------------------------------------------------

_INT = re.compile(r"[0-9]+")
_WIDTH = re.compile(r"([0-9]+)x")


def _text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    found = node.find(path)
    if found is None or found.text is None:
        return None
    value = " ".join(found.text.split())
    if not value or value == "N/A" or value.startswith("["):
        return None
    return value


def _int(node: ET.Element | None, path: str) -> int | None:
    value = _text(node, path)
    return int(value) if value is not None and _INT.fullmatch(value) else None


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _yes(value: str | None) -> bool | None:
    return None if value is None else value.lower() == "yes"


def _ecc(node: ET.Element | None, bits: str) -> int | None:
    """A counter of one timescale (volatile/aggregate): the Pascal/Volta layout
    (``single_bit/total``, ``double_bit/total``) or the later one (``sram_*``, ``dram_*``)."""
    if node is None:
        return None
    if node.find("single_bit") is not None or node.find("double_bit") is not None:
        return _int(node, f"{'single' if bits == 'sbe' else 'double'}_bit/total")
    if bits == "sbe":
        return _sum(_int(node, t) for t in ("sram_correctable", "dram_correctable"))
    return _sum(
        _int(node, t)
        for t in (
            "sram_uncorrectable",
            "sram_uncorrectable_parity",
            "sram_uncorrectable_secded",
            "dram_uncorrectable",
        )
    )


def _card(index: int, gpu: ET.Element) -> CardHealth:
    errors = gpu.find("ecc_errors")
    volatile = errors.find("volatile") if errors is not None else None
    aggregate = errors.find("aggregate") if errors is not None else None
    pages = gpu.find("retired_pages")
    rows = gpu.find("remapped_rows")
    pending = _yes(_text(pages, "pending_retirement"))
    blacklist = _yes(_text(pages, "pending_blacklist"))
    row_pending = _yes(_text(rows, "remapped_row_pending"))
    known = [v for v in (pending, blacklist, row_pending) if v is not None]
    reasons = gpu.find("clocks_event_reasons")
    if reasons is None:
        reasons = gpu.find("clocks_throttle_reasons")
    active: list[str] = []
    if reasons is not None:
        for child in reasons:
            if (child.text or "").strip() == "Active":
                name = child.tag
                for prefix in ("clocks_event_reason_", "clocks_throttle_reason_"):
                    name = name.removeprefix(prefix)
                active.append(name)
    link = gpu.find("pci/pci_gpu_link_info")

    def width(path: str) -> int | None:
        value = _text(link, path)
        match = _WIDTH.fullmatch(value) if value else None
        return int(match.group(1)) if match else None

    recovery = _text(gpu, "gpu_recovery_action")
    if recovery is None and _yes(_text(gpu, "gpu_reset_status/reset_required")):
        recovery = "GPU Reset"
    return CardHealth(
        index=index,
        uuid=_text(gpu, "uuid"),
        name=_text(gpu, "product_name") or "?",
        pci_bus_id=gpu.get("id"),
        persistence_mode=_text(gpu, "persistence_mode"),
        ecc_mode=_text(gpu, "ecc_mode/current_ecc"),
        volatile_sbe=_ecc(volatile, "sbe"),
        volatile_dbe=_ecc(volatile, "dbe"),
        aggregate_sbe=_ecc(aggregate, "sbe"),
        aggregate_dbe=_ecc(aggregate, "dbe"),
        retired_sbe_pages=_int(pages, "multiple_single_bit_retirement/retired_count"),
        retired_dbe_pages=_int(pages, "double_bit_retirement/retired_count"),
        retirement_pending=any(known) if known else None,
        remap_failed=_yes(_text(rows, "remapped_row_failure")),
        throttle_active=tuple(active),
        performance_state=_text(gpu, "performance_state"),
        pcie_gen=_int(link, "pcie_gen/current_link_gen"),
        pcie_gen_max=_int(link, "pcie_gen/max_link_gen"),
        pcie_width=width("link_widths/current_link_width"),
        pcie_width_max=width("link_widths/max_link_width"),
        recovery_action=recovery,
    )


def parse_health_xml(output: str, exit_code: int) -> HealthReport:
    """``nvidia-smi -q -x`` (stderr merged in) and its exit code: every card's health, or the
    state nvidia-smi is in."""
    text = output.strip()
    said = nvidia_smi_state(text, exit_code)  # what every nvidia-smi call says alike
    if said is not None and said != "driver_mismatch":
        return HealthReport(state=said, exit_code=exit_code, message=text)
    start = text.find("<nvidia_smi_log")
    if exit_code != 0 or start < 0:
        return HealthReport(state="failed", exit_code=exit_code, message=text[:300])
    if "<!ENTITY" in text:  # nvidia-smi declares none; refuse entity expansion outright
        return HealthReport(state="failed", exit_code=exit_code, message="XML with entities")
    try:
        root = ET.fromstring(text[start:])
    except ET.ParseError as exc:
        return HealthReport(state="failed", exit_code=exit_code, message=f"not XML: {exc}")
    cards = tuple(_card(i, gpu) for i, gpu in enumerate(root.findall("gpu")))
    return HealthReport(state="ok", cards=cards, exit_code=exit_code)


# --- engine images the host holds --------------------------------------------------------------


def parse_engine_labels(output: str, exit_code: int) -> dict[str, EngineImage]:
    """``podman images --digests --format '{{.Repository}}@{{.Digest}} {{json .Labels}}'``:
    every image held by digest, with its labels (exit 127: no podman, nothing known)."""
    if exit_code == COMMAND_NOT_FOUND:
        return {}
    if exit_code != 0:
        raise FactError(f"podman images: exit {exit_code}: {output.strip()[:200]}")
    images: dict[str, EngineImage] = {}
    for line in output.splitlines():
        ref, _, raw = line.strip().partition(" ")
        if "@sha256:" not in ref or ref.startswith("<none>"):
            continue
        try:
            labels = json.loads(raw) if raw else {}
        except ValueError:
            continue
        if not isinstance(labels, dict):
            labels = {}
        images[ref] = EngineImage(
            ref=ref,
            source="host",
            labels={str(k): str(v) for k, v in labels.items()},
            where="the labels of the image the host holds",
        )
    return images


# --- the driver's packages -----------------------------------------------------------------------


# Where prepare writes the apt pin that keeps the driver on its branch (check driver.lock).
DRIVER_PIN_FILE = "/etc/apt/preferences.d/tensorless-nvidia-driver"


def parse_driver_packages(output: str, exit_code: int) -> DriverPackages:
    """The survey's ``driver-packages`` section (scripts/driver-packages.sh)."""
    if exit_code != 0:
        raise FactError(f"driver packages: exit {exit_code}: {output.strip()[:200]}")
    manager: PackageManager | None = None
    packages: dict[str, str] = {}
    held: list[str] = []
    locks: list[str] = []
    pin: list[str] = []
    for line in output.splitlines():
        word, _, rest = line.partition(" ")
        if word == "@manager" and rest.strip() == "apt":
            manager = "apt"
        elif word == "@manager" and rest.strip() == "dnf":
            manager = "dnf"
        elif word == "@pkg":
            name, _, version = rest.strip().partition(" ")
            if name and version:
                packages[name] = version.strip()
        elif word == "@held" and rest.strip():
            held.append(rest.strip())
        elif word == "@lock" and rest.strip():
            locks.append(rest.strip())
        elif word == "@pin" or line == "@pin":
            pin.append(rest)
    return DriverPackages(
        manager=manager,
        packages=packages,
        held=tuple(held),
        locks=tuple(locks),
        pin="".join(f"{p}\n" for p in pin) if pin else None,
    )
