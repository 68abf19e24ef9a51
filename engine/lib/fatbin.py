"""List the CUDA device code a shared library or executable carries, from its fatbin headers.

    python3 engine/lib/fatbin.py FILE...

Prints one line per embedded entry, `FILE kind sm_NN` (kind ELF: machine code for that
architecture; PTX: code the driver would JIT-compile on a card it has no ELF for), and a last
line `archs: ...` with the set of (kind, arch). Reads only the fatbin entry headers, so
compressed entries are fine. Exit 1 when a file holds no fatbin at all.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# The parser is the package's own (tensorless_deploy/facts/fatbin.py, standard library only), run
# from this checkout by path, so deploy's engine.code check and this tool read fatbins alike.
_SPEC = importlib.util.spec_from_file_location(
    "tensorless_fatbin",
    Path(__file__).resolve().parents[2] / "tensorless_deploy" / "facts" / "fatbin.py",
)
assert _SPEC is not None and _SPEC.loader is not None
_FATBIN = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_FATBIN)
entries = _FATBIN.entries


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
