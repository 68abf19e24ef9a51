"""List the CUDA device code a shared library or executable carries, from its fatbin headers.

    python3 engine/lib/fatbin.py FILE...

Prints one line per embedded entry, `FILE kind sm_NN` (kind ELF: machine code for that
architecture; PTX: code the driver would JIT-compile on a card it has no ELF for), and a last
line `archs: ...` with the set of (kind, arch). Reads only the fatbin entry headers, so
compressed entries are fine. Exit 1 when a file holds no fatbin at all.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

MAGIC = struct.pack("<I", 0xBA55ED50)
KINDS = {1: "PTX", 2: "ELF"}


def entries(data: bytes) -> list[tuple[str, int]]:
    """(kind, sm) for every entry of every fatbin found in `data`."""
    found: list[tuple[str, int]] = []
    pos = data.find(MAGIC)
    while pos != -1:
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


def main(argv: list[str]) -> int:
    seen: set[tuple[str, int]] = set()
    status = 0
    for name in argv:
        found = entries(Path(name).read_bytes())
        if not found:
            print(f"{name}: no fatbin", file=sys.stderr)
            status = 1
        for kind, arch in found:
            print(f"{name} {kind} sm_{arch}")
        seen.update(found)
    print("archs: " + " ".join(f"{k}:sm_{a}" for k, a in sorted(seen)))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
