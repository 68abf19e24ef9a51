"""The CUDA device code a shared library or executable carries, from its fatbin headers: one
(kind, arch) per embedded entry, kind ELF (machine code for that architecture) or PTX (code the
driver JIT-compiles on a card it has no ELF for). Reads only the entry headers, so compressed
entries are fine. Pure and standard-library only: engine/lib/fatbin.py runs this very file on a
build machine where the package is not installed."""

from __future__ import annotations

import struct

MAGIC = struct.pack("<I", 0xBA55ED50)
KINDS = {1: "PTX", 2: "ELF"}


def entries(data: bytes) -> list[tuple[str, int]]:
    """(kind, sm) for every entry of every fatbin found in ``data``."""
    found: list[tuple[str, int]] = []
    pos = data.find(MAGIC)
    while pos != -1:
        if pos + 16 > len(data):
            break
        _magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        entry, end = pos + header_size, pos + header_size + fat_size
        while entry + 32 <= min(end, len(data)):
            kind, _unk, ehdr, size = struct.unpack_from("<HHIQ", data, entry)
            (arch,) = struct.unpack_from("<I", data, entry + 28)
            if kind not in KINDS or ehdr == 0:
                break
            found.append((KINDS[kind], arch))
            entry += ehdr + size
        pos = data.find(MAGIC, max(end, pos + 4))
    return found
