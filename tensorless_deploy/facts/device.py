"""What llama-server says about its devices in its own start log (pure).

The pinned engine (llama.cpp 0.5.0-dev, ggml 0.25.3, built with ``GGML_BACKEND_DL``) loads its
CUDA backend as a module. A container that gets no ``libcuda.so.1`` from the driver loads none,
says nothing about it, and serves on the CPU, healthy. What it prints at log verbosity 4 (the
launcher's ``-lv 4``; llama.cpp logs its library's INFO lines only from verbosity 4) tells
which device the model went to:

- ``ggml_cuda_init: found 1 CUDA devices (Total VRAM: 16269 MiB):`` and
  ``  Device 0: Tesla P100-PCIE-16GB, compute capability 6.0, VMM: yes, VRAM: 16269 MiB``
  (ggml-cuda.cu: the CUDA backend loaded and saw these cards);
- ``llama_model_load_from_file_impl: using device CUDA0 (Tesla P100-PCIE-16GB) (0000:04:00.0)
  - 15953 MiB free`` (llama.cpp: one line per device the model is placed on, with the PCI bus
  id ``cudaDeviceGetPCIBusId`` gives, lowercased; none at all on a CPU-only start);
- ``load_tensors: offloaded 29/29 layers to GPU`` (how many layers went to the GPU);
- ``load_backend: loaded CPU backend from /usr/lib/llama-server/libggml-cpu.so``.

The activation script (operations/scripts/unit-activate.sh) and the survey's tool-state and
deployed-units scripts keep only the lines DEVICE_LINE matches; this module reads them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# What the scripts on the host keep of a start log (grep -E; the same text): keep in step with
# operations/scripts/unit-activate.sh, facts/scripts/tool-state.sh, deployed-units.sh
DEVICE_LINE = (
    "ggml_cuda_init: found [0-9]+ |Device [0-9]+: .*, compute capability |: using device |"
    "offloaded [0-9]+/[0-9]+ layers to GPU|load_backend: loaded "
)
_FOUND = re.compile(r"ggml_cuda_init: found (\d+) CUDA devices")
_CARD = re.compile(r"Device (\d+): (.+?), compute capability (\d+\.\d+)")
_USING = re.compile(r": using device (\S+) \((.*)\) \(([^()]*)\) - (\d+) MiB free")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_BACKEND = re.compile(r"load_backend: loaded (\S+) backend from (\S+)")


@dataclass(frozen=True)
class UsedDevice:
    """One ``using device`` line: a device the model is placed on."""

    name: str  # the backend's device name: CUDA0
    description: str  # the card's name: Tesla P100-PCIE-16GB
    bus_id: str  # as llama.cpp prints it: 0000:04:00.0 ("unknown id" where it has none)
    free_mib: int


@dataclass(frozen=True)
class CudaCard:
    """One ``Device N:`` line of ggml_cuda_init: a card the CUDA backend saw."""

    index: int
    name: str
    compute_cap: str


@dataclass(frozen=True)
class DeviceReport:
    """What one start of llama-server said about its devices (empty: it said nothing)."""

    cuda_found: int | None = None  # ggml_cuda_init's count; None: the CUDA backend never spoke
    cards: tuple[CudaCard, ...] = ()
    used: tuple[UsedDevice, ...] = ()
    offloaded: tuple[int, int] | None = None  # (layers on the GPU, layers in all)
    backends: tuple[str, ...] = ()  # the backends it loaded: CPU, CUDA

    @property
    def said_anything(self) -> bool:
        return bool(
            self.cuda_found is not None
            or self.cards
            or self.used
            or self.offloaded
            or self.backends
        )


def parse_device_log(lines: Iterable[str]) -> DeviceReport:
    """The device lines of one start log (the first start only: a log of several starts is
    the caller's to cut, at the last ``ggml_cuda_init`` or ``load_backend`` it sees first)."""
    found: int | None = None
    cards: list[CudaCard] = []
    used: list[UsedDevice] = []
    offloaded: tuple[int, int] | None = None
    backends: list[str] = []
    for line in lines:
        if m := _FOUND.search(line):
            found = int(m.group(1))
        elif m := _CARD.search(line):
            cards.append(CudaCard(int(m.group(1)), m.group(2), m.group(3)))
        elif m := _USING.search(line):
            used.append(UsedDevice(m.group(1), m.group(2), m.group(3), int(m.group(4))))
        elif m := _OFFLOADED.search(line):
            offloaded = (int(m.group(1)), int(m.group(2)))
        elif (m := _BACKEND.search(line)) and m.group(1) not in backends:
            backends.append(m.group(1))
    return DeviceReport(found, tuple(cards), tuple(used), offloaded, tuple(backends))
