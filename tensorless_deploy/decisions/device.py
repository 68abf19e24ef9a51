"""Is an instance on the device it was given (pure)?

A GPU engine (``[engine] arch`` other than ``cpu``) gets exactly one GPU: its container has the
one CDI device named by the plan's UUID, so CUDA inside sees one card, ``CUDA0``. What proves
the instance serves on that card is llama-server's own start log (facts.device): it placed the
model on ``CUDA0`` (and on nothing else), at the PCI bus id nvidia-smi gives the plan's UUID,
with at least one layer offloaded to it. The bus id ties the CUDA device to the UUID even where
a CDI spec maps the UUID to the wrong node. A CPU engine (``arch = "cpu"``, the test engine) is
on the CPU by design, and is reported so.

The expectation travels in the unit as the ``io.tensorless.device`` label (``expected_device``),
so the activation script, rollback and status judge every unit by what it was rendered for. The
activation script's ``on_card`` (operations/scripts/lib.sh) applies the same rule on the host;
tests/decisions/device/ cases hold both to it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tensorless_deploy.facts.device import DeviceReport
from tensorless_deploy.facts.values import Gpu

CPU_ARCH = "cpu"  # [engine] arch of a CPU build: no GPU is used, by design
CPU_DEVICE = "cpu"
CUDA_DEVICE = "CUDA0"  # the one GPU a container gets, as llama.cpp names it
_NVIDIA_BUS = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])")
_LABEL = re.compile(r"cpu|CUDA0(@[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])?")


def cuda_bus_id(nvidia_smi_bus: str | None) -> str | None:
    """nvidia-smi's pci.bus_id (``00000000:04:00.0``) as llama.cpp prints the same card's
    (``cudaDeviceGetPCIBusId``, lowercased: ``0000:04:00.0``); None when it is not one."""
    m = _NVIDIA_BUS.fullmatch(nvidia_smi_bus or "")
    if m is None:
        return None
    domain = m.group(1).lower().lstrip("0").rjust(4, "0")
    if len(domain) > 4:
        return None
    return f"{domain}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def expected_device(arch: str, gpus: Sequence[Gpu]) -> str:
    """The ``io.tensorless.device`` label: ``cpu`` for a CPU engine, else ``CUDA0@BUS`` (the
    instance's one card, by the bus id nvidia-smi gives its UUID) or ``CUDA0`` where the survey
    did not read the bus id (then the card is not tied to its UUID by the log)."""
    if arch == CPU_ARCH:
        return CPU_DEVICE
    bus = cuda_bus_id(gpus[0].pci_bus_id) if len(gpus) == 1 else None
    return f"{CUDA_DEVICE}@{bus}" if bus else CUDA_DEVICE


def valid_label(label: str) -> bool:
    return _LABEL.fullmatch(label) is not None


@dataclass(frozen=True)
class DeviceVerdict:
    """Whether the instance is where it must be, and what it runs on, in words."""

    ok: bool
    device: str  # what it runs on: "CUDA0 Tesla P100-PCIE-16GB at 0000:04:00.0, 29/29 layers"
    why: str | None = None  # when not ok: what the start log shows instead


def device_verdict(expected: str, report: DeviceReport, uuid: str | None = None) -> DeviceVerdict:
    """The start log's report against the label (``expected_device``). uuid: the plan's card,
    named in the verdict."""
    card = f" {uuid}" if uuid else " card"
    if expected == CPU_DEVICE:
        return DeviceVerdict(True, "CPU (engine arch cpu)")
    want, _, bus = expected.partition("@")
    mine = f"{want} at {bus}" if bus else want
    if not report.said_anything:
        return DeviceVerdict(
            False,
            "unknown",
            "its start log says nothing of its devices (llama-server names them at log "
            f"verbosity 4): nothing shows it on its{card}",
        )
    if not report.used:
        if report.cuda_found is None:
            how = (
                "its CUDA backend never loaded (it loaded: "
                + (", ".join(report.backends) or "no backend")
                + "), as when the container gets no libcuda.so.1 from the driver"
            )
        else:
            how = f"CUDA found {report.cuda_found} device(s), and the model went to none"
        return DeviceVerdict(False, "CPU", f"it serves on the CPU, not on{card} ({mine}): {how}")
    first = report.used[0]
    seen = f"{first.name} {first.description} at {first.bus_id}"
    if len(report.used) > 1 or first.name != want:
        names = ", ".join(f"{u.name} at {u.bus_id}" for u in report.used)
        return DeviceVerdict(False, seen, f"it uses {names}, not exactly its{card} ({mine})")
    if bus and first.bus_id != bus:
        return DeviceVerdict(
            False,
            seen,
            f"it uses {first.name} at PCI {first.bus_id}, but its{card} is at PCI {bus} "
            "(nvidia-smi): the container was given another GPU (a stale or wrong CDI spec?)",
        )
    layers = report.offloaded
    if layers is None or layers[0] <= 0:
        got = f"{layers[0]}/{layers[1]}" if layers else "no"
        return DeviceVerdict(
            False,
            seen,
            f"{got} layers offloaded to {first.name} ({first.description}): it computes on the "
            f"CPU, not on its{card}",
        )
    where = "" if bus else ", not tied to its UUID (no PCI bus id from nvidia-smi)"
    return DeviceVerdict(True, f"{seen}, {layers[0]}/{layers[1]} layers{where}")
