#!/usr/bin/env python3
"""Regenerate the GPU stand-in profiles under tests/hosts/profiles/ (committed output).

    python tests/hosts/gen_profiles.py [--fixtures DIR] [--check]

The h200 profile replays the real fixture bytes (FIXTURES/h200-driver-580: captured on a real
H200 host); the other profiles are synthesized in the same formats. A P100's ``nvidia-smi -q -x``
is the real H200 document with the card's own elements put in as a Pascal card reports them
(``cards_xml``: the single/double-bit ECC layout, retired-page counts, ``remapped_rows`` N/A,
no GSP), the kernel log's NVRM lines and ``/proc/driver/nvidia/version`` in the wording the
public captures of tests/fixtures/nvidia-driver/README.md show. With ``--check`` nothing is
written: the script only verifies that the committed files match what it would write.
Every profile dir holds ``profile.json`` (what it models) and ``root/`` (files as they land on a
host). The nvidia-smi / nvidia-ctk scripts themselves live in ``profiles/_standin/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROFILES = HERE / "profiles"
DEFAULT_FIXTURES = HERE.parent / "fixtures" / "nvidia-smi"  # real H200 bytes, in the repo
STANDIN = "usr/share/nvidia-standin"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
CTK_VERSION = "1.17.8"
# stand-in commit id (40 hex); the real release's commit is not recorded here
CTK_COMMIT = "f202b80a9b9d0db00d9b1d73c0128c8962c55f4d"
TSV_FIELDS = [
    "index",
    "uuid",
    "name",
    "serial",
    "compute_cap",
    "memory.total",
    "memory.used",
    "memory.free",
    "memory.reserved",
    "driver_version",
    "vbios_version",
    "pci.bus_id",
    "persistence_mode",
    "temperature.gpu",
    "utilization.gpu",
    "power.draw",
    "power.limit",
]
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)


@dataclass(frozen=True)
class Gpu:
    name: str
    uuid: str
    compute_cap: str
    mem_total: int
    bus: str
    serial: str
    vbios: str
    power_limit: int
    power_draw: int
    temp: int
    reserved: int
    used: int = 0


def p100(i: int, uuid: str) -> Gpu:
    return Gpu(
        "Tesla P100-PCIE-16GB",
        uuid,
        "6.0",
        16384,
        f"00000000:00:{4 + i:02X}.0",
        f"032361800{4812 + i}",
        "86.00.4D.00.01",
        250,
        26 + i,
        33 + i,
        0,
    )


def t4(i: int, uuid: str) -> Gpu:
    return Gpu(
        "Tesla T4",
        uuid,
        "7.5",
        15360,
        f"00000000:00:{4 + i:02X}.0",
        f"132192001{7730 + i}",
        "90.04.96.00.02",
        70,
        9,
        31,
        265,
    )


H200_UUID = "GPU-ab6a0263-0ae2-1846-2f4f-455ff8b12167"
# same (made-up) UUIDs as tests/fixtures/nvidia-smi/{p100,mixed-p100-t4}-driver-535
P100_UUIDS = [
    "GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90",
    "GPU-a7d41c9e-2b35-4f86-8e1a-5c9b0d3e6f21",
    # two more of the same made-up kind, for the 4-card host
    "GPU-c2e85f13-7a49-4d0b-b6e2-8f31a9d4c705",
    "GPU-d9b14e6a-3c87-45f2-a1d0-6e2b7c9f8a34",
]
T4_UUID = "GPU-5e0b9d72-8c14-43a6-b2f9-0a6d1c7e3b58"
CUDA = {"590": "13.1", "580": "13.0", "535": "12.2", "515": "11.7"}
# /proc/driver/nvidia/version of the proprietary module, in its shape (fixtures/nvidia-driver)
PROC_VERSION = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  {built}\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n"
)
# the build stamp of each module (when it was built on its host: a value, in the real format)
BUILT = {
    "535.183.01": "Sun May 12 19:39:15 UTC 2024",
    "580.159.04": "Wed Apr 29 17:32:45 UTC 2026",
    "590.44.01": "Tue Nov 25 00:09:43 UTC 2025",
    "515.105.01": "Wed Mar 22 17:12:31 UTC 2023",
    # as a public parser test quotes the real line (code index id 67147789393)
    "535.216.03": "Thu Apr  3 01:14:19 UTC 2025",
}
NO_DEVICES = "No devices were found\n"  # nvidia-smi's words, exit 6 (NVML "not found")


@dataclass(frozen=True)
class Health:
    """What a card's nvidia-smi -q -x says of its health (the Pascal fields)."""

    persistence: str = "Enabled"
    volatile_sbe: int = 0
    volatile_dbe: int = 0
    aggregate_sbe: int = 0
    aggregate_dbe: int = 0
    retired_sbe: int = 0
    retired_dbe: int = 0
    pending: bool = False
    throttle: tuple[str, ...] = ()  # clocks_event_reason_* that are Active besides gpu_idle
    pcie_gen: int = 3
    pcie_width: int = 16


def _pascal_ecc(h: Health, tabs: str) -> str:
    """The ECC block of a Pascal card (device memory and caches, single and double bit)."""

    def bits(kind: str, total: int) -> str:
        rows = [
            ("device_memory", total),
            ("register_file", 0),
            ("l1_cache", "N/A"),
            ("l2_cache", 0),
            ("texture_memory", 0),
            ("texture_shm", 0),
            ("cbu", "N/A"),
            ("total", total),
        ]
        inner = "".join(f"{tabs}\t\t\t<{k}>{v}</{k}>\n" for k, v in rows)
        return f"{tabs}\t\t<{kind}>\n{inner}{tabs}\t\t</{kind}>\n"

    out = f"{tabs}<ecc_errors>\n"
    for scale, sbe, dbe in (
        ("volatile", h.volatile_sbe, h.volatile_dbe),
        ("aggregate", h.aggregate_sbe, h.aggregate_dbe),
    ):
        out += f"{tabs}\t<{scale}>\n" + bits("single_bit", sbe) + bits("double_bit", dbe)
        out += f"{tabs}\t</{scale}>\n"
    return out + f"{tabs}</ecc_errors>"


def _turing_ecc(h: Health, tabs: str) -> str:
    """The ECC block of a Turing card (SRAM and DRAM, correctable and not), as a Tesla T4
    reports it (tests/fixtures/nvidia-smi/README.md)."""
    out = f"{tabs}<ecc_errors>\n"
    for scale, sbe, dbe in (
        ("volatile", h.volatile_sbe, h.volatile_dbe),
        ("aggregate", h.aggregate_sbe, h.aggregate_dbe),
    ):
        out += f"{tabs}\t<{scale}>\n"
        for k, v in (
            ("sram_correctable", 0),
            ("sram_uncorrectable", 0),
            ("dram_correctable", sbe),
            ("dram_uncorrectable", dbe),
        ):
            out += f"{tabs}\t\t<{k}>{v}</{k}>\n"
        out += f"{tabs}\t</{scale}>\n"
    return out + f"{tabs}</ecc_errors>"


# per compute capability: architecture, PCI device and subsystem ids, ECC block
ARCH = {
    "6.0": ("Pascal", "15F810DE", "118F10DE", _pascal_ecc),
    "7.5": ("Turing", "1EB810DE", "12A210DE", _turing_ecc),
}


def _pascal_pages(h: Health, tabs: str) -> str:
    def pages(kind: str, count: int) -> str:
        page = (
            f"{tabs}\t\t\t<retired_page>\n{tabs}\t\t\t\t<retired_page_address>"
            f"0x000000000007fffa</retired_page_address>\n{tabs}\t\t\t</retired_page>\n"
        )
        listed = page * count
        return (
            f"{tabs}\t<{kind}>\n{tabs}\t\t<retired_count>{count}</retired_count>\n"
            f"{tabs}\t\t<retired_pagelist>\n{listed}{tabs}\t\t</retired_pagelist>\n{tabs}\t</{kind}>\n"
        )

    yes = "Yes" if h.pending else "No"
    return (
        f"{tabs}<retired_pages>\n"
        + pages("multiple_single_bit_retirement", h.retired_sbe)
        + pages("double_bit_retirement", h.retired_dbe)
        + f"{tabs}\t<pending_blacklist>{yes}</pending_blacklist>\n"
        f"{tabs}\t<pending_retirement>{yes}</pending_retirement>\n{tabs}</retired_pages>"
    )


def _swap(text: str, tag: str, value: str) -> str:
    """Replace the first <tag>...</tag> (a leaf) with value."""
    new, n = re.subn(rf"<{tag}>[^<]*</{tag}>", f"<{tag}>{value}</{tag}>", text, count=1)
    assert n == 1, tag
    return new


def _swap_block(text: str, tag: str, block: str) -> str:
    new, n = re.subn(rf"\t*<{tag}>.*?</{tag}>", lambda _: block, text, count=1, flags=re.S)
    assert n == 1, tag
    return new


def cards_xml(h200_xml: str, gpus: list[Gpu], driver: str, health: list[Health]) -> str:
    """``nvidia-smi -q -x`` of these Pascal (and Turing) cards: the real H200 document, its <gpu>
    element once per card with the card's identity and health put in."""
    head, rest = h200_xml.split("\t<gpu id=", 1)
    body, tail = rest.split("\t</gpu>\n", 1)
    template = "\t<gpu id=" + body + "\t</gpu>\n"
    branch = driver.split(".")[0]
    dtd = "nvsmi_device_v13.dtd" if int(branch) >= 570 else "nvsmi_device_v12.dtd"
    head = head.replace("nvsmi_device_v13.dtd", dtd)
    head = _swap(head, "driver_version", driver)
    head = _swap(head, "cuda_version", CUDA[branch])
    head = _swap(head, "attached_gpus", str(len(gpus)))
    cards = []
    for i, (g, h) in enumerate(zip(gpus, health, strict=True)):
        c = template.replace('<gpu id="00000000:00:06.0">', f'<gpu id="{g.bus}">', 1)
        if g.compute_cap == "9.0":  # the H200 itself: its real element, at its bus here
            c = _swap(c, "minor_number", str(i))
            c = _swap(c, "pci_device", g.bus.split(":")[2].split(".")[0])
            cards.append(_swap(c, "pci_bus_id", g.bus))
            continue
        arch, device_id, subsystem, ecc = ARCH[g.compute_cap]
        for tag, value in (
            ("product_name", g.name),
            ("product_brand", "Tesla"),
            ("product_architecture", arch),
            ("display_mode", "Enabled"),
            ("display_attached", "No"),
            ("persistence_mode", h.persistence),
            ("addressing_mode", "N/A"),
            ("current_mig", "N/A"),
            ("pending_mig", "N/A"),
            ("serial", g.serial),
            ("uuid", g.uuid),
            ("pdi", "N/A"),
            ("minor_number", str(i)),
            ("vbios_version", g.vbios),
            ("board_id", f"0x{4 + i:x}"),
            ("board_part_number", "900-2H400-0000-000"),
            ("gpu_part_number", "N/A"),
            ("module_id", "N/A"),
            ("img_version", "H400.0201.00.08"),
            ("oem_object", "1.1"),
            ("ecc_object", "4.1"),
            ("c2c_mode", "N/A"),
            ("virtualization_mode", "None"),
            ("gsp_firmware_version", "N/A"),
            ("pci_bus", "00"),
            ("pci_device", g.bus.split(":")[2].split(".")[0]),
            ("pci_sub_class", "2"),
            ("pci_device_id", device_id),
            ("pci_bus_id", g.bus),
            ("pci_sub_system_id", subsystem),
            ("max_link_gen", "3"),
            ("current_link_gen", str(h.pcie_gen)),
            ("device_current_link_gen", str(h.pcie_gen)),
            ("max_device_link_gen", "3"),
            ("max_host_link_gen", "3"),
            ("max_link_width", "16x"),
            ("current_link_width", f"{h.pcie_width}x"),
        ):
            c = _swap(c, tag, value)

        def reason(m: re.Match[str], active: tuple[str, ...] = h.throttle) -> str:
            on = m.group(1).removeprefix("clocks_event_reason_") in active
            return f"<{m.group(1)}>{'Active' if on else 'Not Active'}</{m.group(1)}>"

        c = re.sub(r"<(clocks_event_reason_[a-z_]+)>[^<]*</\1>", reason, c)
        mem = re.search(r"\t*<fb_memory_usage>.*?</fb_memory_usage>", c, flags=re.S)
        assert mem
        free = g.mem_total - g.reserved - g.used
        c = _swap_block(
            c,
            "fb_memory_usage",
            f"\t\t<fb_memory_usage>\n\t\t\t<total>{g.mem_total} MiB</total>\n"
            f"\t\t\t<reserved>{g.reserved} MiB</reserved>\n\t\t\t<used>{g.used} MiB</used>\n"
            f"\t\t\t<free>{free} MiB</free>\n\t\t</fb_memory_usage>",
        )
        c = _swap_block(c, "ecc_errors", ecc(h, "\t\t"))
        c = _swap_block(c, "retired_pages", _pascal_pages(h, "\t\t"))
        c = _swap_block(c, "remapped_rows", "\t\t<remapped_rows>N/A</remapped_rows>")
        cards.append(c)
    return head + "".join(cards) + tail


def legacy_notice(card: str, driver: str) -> list[str]:
    """The kernel log of a driver that no longer drives a card (the wording of the public
    captures in tests/fixtures/nvidia-driver: one NVRM line per line of the notice)."""
    return [
        f"NVRM: The NVIDIA {card} GPU installed in this system is",
        "NVRM:  supported through the NVIDIA 580.xx Legacy drivers. Please",
        "NVRM:  visit http://www.nvidia.com/object/unix.html for more",
        f"NVRM:  information.  The {driver} NVIDIA driver will ignore",
        "NVRM:  this GPU.  Continuing probe...",
        "NVRM: No NVIDIA GPU found.",
    ]


def open_refusal(bus: str, pci_id: str) -> list[str]:
    """The open kernel module refusing a card without a GSP (tests/fixtures/nvidia-driver)."""
    short = bus[4:]  # 0000:00:04.0
    return [
        f"NVRM: The NVIDIA GPU {short} (PCI ID: {pci_id})",
        "NVRM: installed in this system is not supported by open",
        "NVRM: nvidia.ko because it does not include the required GPU",
        "NVRM: System Processor (GSP).",
        f"NVRM: GPU {short}: RmInitAdapter failed! (0x24:0x72:1603)",
        f"NVRM: GPU {short}: rm_init_adapter failed, device minor number 0",
    ]


def xid_48(bus: str) -> str:
    """Xid 48, a double-bit ECC error, in the words of the public capture (fixtures)."""
    return (
        f"NVRM: Xid (PCI:{bus[4:].rsplit('.', 1)[0]}): 48, pid='<unknown>', name=<unknown>, An "
        "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
        "physAddr 0x7fffa8860 partition 7, subpartition 1."
    )


def tsv(gpus: list[Gpu], driver: str, persistence: str = "Enabled") -> str:
    rows = ["\t".join(TSV_FIELDS)]
    for i, g in enumerate(gpus):
        rows.append(
            "\t".join(
                [
                    str(i),
                    g.uuid,
                    g.name,
                    g.serial,
                    g.compute_cap,
                    str(g.mem_total),
                    str(g.used),
                    str(g.mem_total - g.reserved - g.used),
                    str(g.reserved),
                    driver,
                    g.vbios,
                    g.bus,
                    persistence,
                    str(g.temp),
                    "100" if g.used else "0",
                    f"{g.power_draw:.2f}",
                    f"{g.power_limit:.2f}",
                ]
            )
        )
    return "\n".join(rows) + "\n"


def list_out(gpus: list[Gpu]) -> str:
    return "".join(f"GPU {i}: {g.name} (UUID: {g.uuid})\n" for i, g in enumerate(gpus))


def version_out(driver: str) -> str:
    major_minor = ".".join(driver.split(".")[:2])
    return (
        f"NVIDIA-SMI version  : {driver}\nNVML version        : {major_minor}\n"
        f"DRIVER version      : {driver}\nCUDA Version        : {CUDA[driver.split('.')[0]]}\n"
    )


STAMP = "Mon Nov 30 01:05:12 2026       \n"


def _plain(
    gpus: list[Gpu], driver: str, lw: int, name_w: int, banner: str, hdr: tuple[str, str]
) -> str:
    """`nvidia-smi` table: lw is the first column's width (41 for R530+, 31 before)."""
    cuda = CUDA[driver.split(".")[0]]
    width = lw + 22 + 22 + 4
    inner = width - 2

    def row(left: str, mid: str, right: str) -> str:
        return f"|{left}|{mid}|{right}|\n"

    def full(text: str) -> str:
        return "|" + text.ljust(inner) + "|\n"

    dash = "+" + "-" * inner + "+\n"
    sep = "+" + "-" * lw + "+" + "-" * 22 + "+" + "-" * 22 + "+\n"
    out = [
        STAMP,
        dash,
        full(banner.format(driver=driver, cuda=cuda)),
        "|" + "-" * lw + "+" + "-" * 22 + "+" + "-" * 22 + "+\n",
        row(hdr[0], " Bus-Id        Disp.A ", " Volatile Uncorr. ECC "),
        row(hdr[1], "         Memory-Usage ", " GPU-Util  Compute M. "),
        row(" " * lw, " " * 22, "               MIG M. "),
        "|" + "=" * lw + "+" + "=" * 22 + "+" + "=" * 22 + "|\n",
    ]
    for i, g in enumerate(gpus):
        name = g.name if len(g.name) <= name_w else g.name[: name_w - 3] + "..."
        left = f"{i:>4}  {name}"
        head = f" N/A   {g.temp}C    P0"
        pwr = f"{g.power_draw}W / {g.power_limit}W"
        out.append(
            row(left + "On".rjust(lw - len(left) - 2) + "  ", f" {g.bus} Off ", f"{'0':>21} ")
        )
        out.append(
            row(
                head + pwr.rjust(lw - len(head) - 1) + " ",
                f"{f'{g.used}MiB / {g.mem_total}MiB':>21} ",
                f"{'0%':>8}      Default ",
            )
        )
        out.append(row(" " * lw, " " * 22, f"{'N/A':>21} "))
        out.append(sep)
    out += [
        " " * width + "\n",
        dash,
        full(" Processes:"),
        full("  GPU   GI   CI        PID   Type   Process name".ljust(inner - 11) + "GPU Memory "),
        full("        ID   ID".ljust(inner - 11) + "Usage      "),
        "|" + "=" * inner + "|\n",
        full("  No running processes found"),
        dash,
    ]
    return "".join(out)


def plain_535(gpus: list[Gpu], driver: str) -> str:
    """89-column layout of the R530+ drivers."""
    return _plain(
        gpus,
        driver,
        41,
        28,
        " NVIDIA-SMI {driver}             Driver Version: {driver}   CUDA Version: {cuda}",
        (" GPU  Name                 Persistence-M ", " Fan  Temp   Perf          Pwr:Usage/Cap "),
    )


def plain_515(gpus: list[Gpu], driver: str) -> str:
    """79-column layout of the R515 and older drivers."""
    return _plain(
        gpus,
        driver,
        31,
        18,
        " NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda}",
        (" GPU  Name        Persistence-M", " Fan  Temp  Perf  Pwr:Usage/Cap"),
    )


def driver_libs(driver: str) -> list[str]:
    return [
        f"{LIBDIR}/libcuda.so.{driver}",
        f"{LIBDIR}/libnvidia-ml.so.{driver}",
        f"{LIBDIR}/libnvidia-ptxjitcompiler.so.{driver}",
    ]


def cdi_spec(gpus: list[Gpu], driver: str) -> str:
    """A spec shaped like `nvidia-ctk cdi generate` output (keys in its alphabetical order).

    The control nodes (nvidia-uvm, nvidia-uvm-tools, nvidiactl) are named by path alone, as a
    real spec names them (tests/fixtures/cdi/h200-580.159.04.yaml): the host's own nodes, which
    exist only once something makes them (the driver makes none at boot), so no container that
    gets a GPU starts without them. The GPU nodes map hostPath /dev/zero (there is no GPU to
    map). Library mounts and the enable-cuda-compat hook name the driver version (a spec for
    another driver is stale). The hooks run /usr/bin/nvidia-cdi-hook, a no-op stand-in
    installed with the toolkit.
    """

    def node(path: str, indent: str) -> str:
        return f"{indent}- hostPath: /dev/zero\n{indent}  path: {path}\n"

    out = ["---\n", "cdiVersion: 0.5.0\n", "containerEdits:\n", "  deviceNodes:\n"]
    for p in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"):
        out.append(f"  - path: {p}\n")
    out += ["  env:\n", "  - NVIDIA_VISIBLE_DEVICES=void\n", "  hooks:\n"]
    for args in (
        ["create-symlinks", "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"],
        ["enable-cuda-compat", f"--host-driver-version={driver}"],
        ["update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"],
    ):
        out.append("  - args:\n    - nvidia-cdi-hook\n")
        out += [f"    - {a}\n" for a in args]
        out.append("    hookName: createContainer\n    path: /usr/bin/nvidia-cdi-hook\n")
    out.append("  mounts:\n")
    for lib in driver_libs(driver):
        out.append(
            f"  - containerPath: {lib}\n    hostPath: {lib}\n    options:\n"
            "    - ro\n    - nosuid\n    - nodev\n    - bind\n"
        )
    out.append("devices:\n")
    names: list[tuple[str, list[int]]] = []
    for i, g in enumerate(gpus):
        names += [(f'"{i}"', [i]), (g.uuid, [i])]
    names.append(("all", list(range(len(gpus)))))
    for name, idx in names:
        out.append("- containerEdits:\n    deviceNodes:\n")
        for i in idx:
            out.append(node(f"/dev/nvidia{i}", "    "))
        out.append(f"  name: {name}\n")
    out.append("kind: nvidia.com/gpu\n")
    return "".join(out)


def ctk_version() -> str:
    return f"NVIDIA Container Toolkit CLI version {CTK_VERSION}\ncommit: {CTK_COMMIT}\n"


def lib_placeholder(lib: str) -> str:
    return (
        f"STAND-IN for the NVIDIA driver library {Path(lib).name} (tensorless test host; no GPU)\n"
    )


def apps_tsv(apps: list[tuple[str, int, int, str]]) -> str:
    """The stand-in's compute processes (gpu_uuid, pid, used_memory in MiB, process_name), as
    `nvidia-smi --query-compute-apps` lists them."""
    rows = ["gpu_uuid\tpid\tused_memory\tprocess_name"]
    rows += [f"{u}\t{pid}\t{mib}\t{name}" for u, pid, mib, name in apps]
    return "\n".join(rows) + "\n"


def build(fixtures: Path) -> dict[str, dict[str, Any]]:
    """profile name -> {"meta": {...}, "files": {relpath: text}}"""
    h200_fx = fixtures / "h200-driver-580"
    h200 = Gpu(
        "NVIDIA H200",
        H200_UUID,
        "9.0",
        143771,
        "00000000:00:06.0",
        "[N/A]",
        "[N/A]",
        700,
        116,
        36,
        0,
    )
    p = [p100(0, P100_UUIDS[0])]
    # the second P100 is nearly full, as in tests/fixtures/nvidia-smi/mixed-p100-t4-driver-535
    p100_busy = dataclasses.replace(p100(1, P100_UUIDS[1]), used=15876)
    mixed = [p100(0, P100_UUIDS[0]), p100_busy, t4(2, T4_UUID)]
    d535, d515, d580, d_old = "535.183.01", "515.105.01", "580.159.04", "535.104.05"

    h200_query = (h200_fx / "query.xml").read_text()

    def module(driver: str) -> dict[str, str]:
        """/proc/driver/nvidia/version of the loaded proprietary module (the harness puts it at
        that path)."""
        text = PROC_VERSION.format(driver=driver, built=BUILT[driver])
        return {f"{STANDIN}/driver/version": text}

    def smi(
        gpus: list[Gpu], driver: str, plain: str, health: list[Health] | None = None
    ) -> dict[str, str]:
        cards = health or [Health() for _ in gpus]
        return {
            f"{STANDIN}/smi/gpus.tsv": tsv(gpus, driver),
            f"{STANDIN}/smi/list.out": list_out(gpus),
            f"{STANDIN}/smi/version.out": version_out(driver),
            f"{STANDIN}/smi/plain.out": plain,
            f"{STANDIN}/smi/query.xml": cards_xml(h200_query, gpus, driver, cards),
        } | module(driver)

    def toolkit(
        gpus: list[Gpu],
        driver: str,
        *,
        spec_driver: str | None = None,
        spec_paths: tuple[str, ...] = ("etc/cdi/nvidia.yaml",),
    ) -> dict[str, str]:
        files = {
            f"{STANDIN}/ctk/version.out": ctk_version(),
            f"{STANDIN}/ctk/cdi-generated.yaml": cdi_spec(gpus, driver),
        }
        for sp in spec_paths:
            files[sp] = cdi_spec(gpus, spec_driver or driver)
        return files

    def libs(driver: str) -> dict[str, str]:
        return {lib.lstrip("/"): lib_placeholder(lib) for lib in driver_libs(driver)}

    def meta(
        desc: str,
        gpus: list[Gpu],
        driver: str | None,
        *,
        smi_: bool = True,
        ctk: bool = True,
        **kw: Any,
    ) -> dict[str, Any]:
        return {
            "description": desc,
            "nvidia_smi": smi_,
            "nvidia_ctk": ctk,
            "driver_version": driver,
            "ctk_version": CTK_VERSION if ctk else None,
            "gpus": [
                {
                    "index": i,
                    "uuid": g.uuid,
                    "name": g.name,
                    "compute_cap": g.compute_cap,
                    "memory_total_mib": g.mem_total,
                }
                for i, g in enumerate(gpus)
            ],
            **kw,
        }

    h200_files = {f"{STANDIN}/smi/gpus.tsv": tsv([h200], d580)}
    for src, dst in (
        ("list.out", "list.out"),
        ("version.out", "version.out"),
        ("plain.out", "plain.out"),
        ("query.xml", "query.xml"),
    ):
        h200_files[f"{STANDIN}/smi/{dst}"] = (h200_fx / src).read_text()
    facts_txt = (h200_fx / "host-facts.txt").read_text()
    h200_module = facts_txt.split("## proc-driver\n", 1)[1].split("\n## ", 1)[0] + "\n"
    h200_files[f"{STANDIN}/driver/version"] = h200_module  # the real open module's words
    h200_files |= toolkit([h200], d580) | libs(d580)

    profiles: dict[str, dict[str, Any]] = {
        "h200": {
            "meta": meta(
                "one NVIDIA H200, driver 580.159.04 (real nvidia-smi bytes)",
                [h200],
                d580,
                cdi_specs=["/etc/cdi/nvidia.yaml"],
                real_bytes_from="fixtures/nvidia-smi/h200-driver-580",
            ),
            "files": h200_files,
        },
        "p100": {
            "meta": meta(
                "one Tesla P100-PCIE-16GB, driver 535.183.01",
                p,
                d535,
                cdi_specs=["/etc/cdi/nvidia.yaml"],
            ),
            "files": smi(p, d535, plain_535(p, d535)) | toolkit(p, d535) | libs(d535),
        },
        "mixed": {
            "meta": meta(
                "two Tesla P100-PCIE-16GB + one Tesla T4, driver 535.183.01",
                mixed,
                d535,
                cdi_specs=["/etc/cdi/nvidia.yaml"],
            ),
            "files": smi(mixed, d535, plain_535(mixed, d535))
            | toolkit(mixed, d535)
            | libs(d535)
            # what fills the second P100: a compute process that is none of this tool's
            | {f"{STANDIN}/smi/apps.tsv": apps_tsv([(P100_UUIDS[1], 4242, 15874, "python3")])},
        },
        "old-driver": {
            "meta": meta(
                "one Tesla P100-PCIE-16GB, driver 515.105.01 (< 525.60.13)",
                p,
                d515,
                cdi_specs=["/etc/cdi/nvidia.yaml"],
            ),
            "files": smi(p, d515, plain_515(p, d515)) | toolkit(p, d515) | libs(d515),
        },
        "no-driver": {
            "meta": meta(
                "driver installed but not loaded: nvidia-smi exits 9",
                p,
                d535,
                cdi_specs=["/etc/cdi/nvidia.yaml"],
                nvidia_smi_exit=9,
            ),
            "files": {f"{STANDIN}/smi/fail.out": NO_DRIVER, f"{STANDIN}/smi/fail.rc": "9\n"}
            | toolkit(p, d535)
            | libs(d535),
        },
        "no-smi": {
            "meta": meta(
                "no NVIDIA driver, no nvidia-smi, no toolkit, no CDI spec",
                [],
                None,
                smi_=False,
                ctk=False,
                cdi_specs=[],
            ),
            "files": {},
        },
        "no-toolkit": {
            "meta": meta(
                "P100 + driver 535.183.01, no nvidia-ctk, no CDI spec",
                p,
                d535,
                ctk=False,
                cdi_specs=[],
            ),
            "files": smi(p, d535, plain_535(p, d535)) | libs(d535),
        },
        "dup-cdi": {
            "meta": meta(
                "P100, two CDI specs of kind nvidia.com/gpu",
                p,
                d535,
                cdi_specs=["/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml"],
            ),
            "files": smi(p, d535, plain_535(p, d535))
            | toolkit(p, d535, spec_paths=("etc/cdi/nvidia.yaml", "var/run/cdi/nvidia.yaml"))
            | libs(d535),
        },
        "stale-cdi": {
            "meta": meta(
                "P100, driver 535.183.01, CDI spec generated for 535.104.05",
                p,
                d535,
                cdi_specs=["/etc/cdi/nvidia.yaml"],
                cdi_spec_driver=d_old,
            ),
            "files": smi(p, d535, plain_535(p, d535))
            | toolkit(p, d535, spec_driver=d_old)
            | libs(d535),
        },
        # what `prepare` starts from: the driver and nothing of the toolkit. The driver's answer
        # to `nvidia-ctk cdi generate` is recorded, so a toolkit installed later (the .deb of
        # tests/hosts/apt_repo.py carries the stand-in nvidia-ctk) generates a current spec.
        "bare-driver": {
            "meta": meta(
                "P100 + driver 535.183.01 only: no nvidia-ctk, no CDI spec",
                p,
                d535,
                ctk=False,
                cdi_specs=[],
            ),
            "files": smi(p, d535, plain_535(p, d535))
            | {f"{STANDIN}/ctk/cdi-generated.yaml": cdi_spec(p, d535)}
            | libs(d535),
        },
    }
    # several matching cards: one instance per card (two and four idle P100s)
    for n in (2, 4):
        cards = [p100(i, P100_UUIDS[i]) for i in range(n)]
        profiles[f"p100x{n}"] = {
            "meta": meta(
                f"{n} Tesla P100-PCIE-16GB, driver 535.183.01, all idle",
                cards,
                d535,
                cdi_specs=["/etc/cdi/nvidia.yaml"],
            ),
            "files": smi(cards, d535, plain_535(cards, d535)) | toolkit(cards, d535) | libs(d535),
        }
    # a P100 beside an H200 on driver 580 (the last branch that still drives Pascal); the plain
    # nvidia-smi table of this pair is not recorded (the tool reads only --query-gpu and -L)
    h200_1 = dataclasses.replace(h200, bus="00000000:00:05.0")
    pair = [p100(0, P100_UUIDS[0]), h200_1]
    pair_files = smi(pair, d580, "") | toolkit(pair, d580) | libs(d580)
    del pair_files[f"{STANDIN}/smi/plain.out"]
    profiles["p100-h200"] = {
        "meta": meta(
            "one Tesla P100-PCIE-16GB + one NVIDIA H200, driver 580.159.04",
            pair,
            d580,
            cdi_specs=["/etc/cdi/nvidia.yaml"],
        ),
        "files": pair_files,
    }
    # --- the Pascal guard (docs/test-hosts.md): what breaks old P100 fleets, one profile each
    # a real 590 release: the driver CUDA 13.1.0 bundles (cuda 13.1.0+590.44.01 in
    # https://github.com/AOSC-Dev/aosc-os-abbs/pull/14102)
    d590 = "590.44.01"
    kmsg = f"{STANDIN}/driver/kmsg"
    # a 590 driver: it loads, ignores the P100 (kernel log), and nvidia-smi sees no card
    profiles["p100-590"] = {
        "meta": meta(
            "one Tesla P100-PCIE-16GB under driver 590.44.01: ignored (580.xx Legacy)",
            p,
            d590,
            cdi_specs=["/etc/cdi/nvidia.yaml"],
            nvidia_smi_exit=6,
        ),
        "files": {
            f"{STANDIN}/smi/fail.out": NO_DEVICES,
            f"{STANDIN}/smi/fail.rc": "6\n",
            kmsg: "\n".join(legacy_notice("Tesla P100-PCIE-16GB", d590)) + "\n",
        }
        | module(d590)
        | toolkit(p, d535)
        | libs(d590),
    }
    # the open kernel module on a P100: it loads, refuses the card (no GSP), nvidia-smi sees none
    profiles["p100-open"] = {
        "meta": meta(
            "one Tesla P100-PCIE-16GB under the open kernel module 580.159.04: no GSP, ignored",
            p,
            d580,
            cdi_specs=["/etc/cdi/nvidia.yaml"],
            nvidia_smi_exit=6,
        ),
        "files": {
            f"{STANDIN}/smi/fail.out": NO_DEVICES,
            f"{STANDIN}/smi/fail.rc": "6\n",
            f"{STANDIN}/driver/version": h200_module,
            kmsg: "\n".join(open_refusal(p[0].bus, "10de:15f8")) + "\n",
        }
        | toolkit(p, d580)
        | libs(d580),
    }
    # a dying card: a double-bit ECC error, its page pending retirement until the next reboot
    dying = [Health(volatile_dbe=1, aggregate_dbe=1, aggregate_sbe=2, pending=True)]
    profiles["p100-pending"] = {
        "meta": meta(
            "one Tesla P100-PCIE-16GB, driver 535.183.01, a double-bit ECC error and a page "
            "pending retirement",
            p,
            d535,
            cdi_specs=["/etc/cdi/nvidia.yaml"],
        ),
        "files": smi(p, d535, plain_535(p, d535), dying)
        | {kmsg: xid_48(p[0].bus) + "\n"}
        | toolkit(p, d535)
        | libs(d535),
    }
    # a wedged NVML: every nvidia-smi hangs (the stand-in sleeps); the rest of the host is fine
    profiles["p100-hung"] = {
        "meta": meta(
            "one Tesla P100-PCIE-16GB, driver 535.183.01, NVML wedged: nvidia-smi never answers",
            p,
            d535,
            cdi_specs=["/etc/cdi/nvidia.yaml"],
            nvidia_smi_hangs=True,
        ),
        "files": smi(p, d535, plain_535(p, d535))
        | {f"{STANDIN}/smi/hang": "nvidia-smi on this stand-in never answers\n"}
        | toolkit(p, d535)
        | libs(d535),
    }
    # the same P100 after its driver was updated within the branch (a maintenance window:
    # docs/maintain.md): 535.216.03 loaded, the CDI spec still the one generated for 535.183.01
    d535_new = "535.216.03"
    profiles["p100-updated"] = {
        "meta": meta(
            "one Tesla P100-PCIE-16GB, driver updated 535.183.01 -> 535.216.03, CDI spec stale",
            p,
            d535_new,
            cdi_specs=["/etc/cdi/nvidia.yaml"],
            cdi_spec_driver=d535,
        ),
        "files": smi(p, d535_new, plain_535(p, d535_new))
        | toolkit(p, d535_new, spec_driver=d535)
        | libs(d535_new),
    }
    return profiles


def write(profiles: dict[str, dict[str, Any]], dest: Path) -> None:
    for name, prof in profiles.items():
        pdir = dest / name
        if pdir.exists():
            shutil.rmtree(pdir)
        pdir.mkdir(parents=True)
        (pdir / "profile.json").write_text(json.dumps(prof["meta"], indent=2) + "\n")
        for rel, text in prof["files"].items():
            f = pdir / "root" / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)


def self_check(fixtures: Path) -> None:
    """The stand-in nvidia-smi must reproduce the real H200 CSV bytes from the table."""
    fx = fixtures / "h200-driver-580"
    env = {"NVIDIA_STANDIN_DIR": str(PROFILES / "h200" / "root" / STANDIN), "PATH": "/usr/bin:/bin"}
    smi = str(PROFILES / "_standin" / "nvidia-smi")
    cases = [
        (
            [
                "--query-gpu=index,uuid,name,compute_cap,memory.total,memory.used,driver_version",
                "--format=csv,noheader,nounits",
            ],
            "query-csv.out",
            0,
        ),
        (
            [
                "--query-gpu=index,uuid,name,compute_cap,memory.total,memory.used,driver_version,"
                "pci.bus_id,persistence_mode",
                "--format=csv",
            ],
            None,
            0,
        ),
        (["--query-gpu=index,no_such_field", "--format=csv,noheader"], "query-bad.out", 2),
        (["-L"], "list.out", 0),
        (["--version"], "version.out", 0),
        ([], "plain.out", 0),
    ]
    for args, ref, rc in cases:
        p = subprocess.run([smi, *args], capture_output=True, env=env, check=False)
        assert p.returncode == rc, (args, p.returncode, p.stdout)
        if ref is not None:
            assert p.stdout == (fx / ref).read_bytes(), (args, p.stdout)
    print("self-check: stand-in nvidia-smi reproduces the H200 fixture bytes")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", type=Path, default=DEFAULT_FIXTURES)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    profiles = build(a.fixtures)
    if a.check:
        with tempfile.TemporaryDirectory() as tmp:
            write(profiles, Path(tmp))
            diff = subprocess.run(
                ["diff", "-r", "-x", "_standin", tmp, str(PROFILES)],
                capture_output=True,
                text=True,
                check=False,
            )
            if diff.returncode != 0:
                print(diff.stdout, file=sys.stderr)
                return 1
        print("profiles are up to date")
    else:
        write(profiles, PROFILES)
    if (a.fixtures / "h200-driver-580").is_dir():
        self_check(a.fixtures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
