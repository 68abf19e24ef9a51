"""Test helpers: the specification's example recipe (docs/design.md) as data, a small TOML
writer, catalogs on disk."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

EXAMPLE: dict[str, Any] = {
    "schema": 1,
    "status": "released",
    "model": {
        "name": "pn3",
        "title": "Qwen3.8-27B-PN3 (P100-native 3-bit, mix P0k+19)",
        "hf_repo": "iamMrDuncan/Qwen3.8-27B-PN3-GGUF",
        "revision": "c701b6690ec360b16d40f85df1cb76062e30cd38",
        "file": "Qwen3.8-27B-PN3-P0k19.gguf",
        "sha256": "15ce2d4469673f1f1753c55de3780cfe04311dd6f05cb41633d73df128e91476",
        "size_bytes": 12954114496,
        "license": "Apache-2.0 (from Qwen/Qwen3.8-27B)",
    },
    "card": {
        "id": "p100",
        "title": "NVIDIA Tesla P100 16 GB",
        "compute_capability": "6.0",
        "min_memory_mib": 16000,
        "min_driver": "525.60.13",
    },
    "engine": {
        "release": "engine-v0.1.0",
        "arch": "sm60",
        "image": "ghcr.io/iammrduncan/tensorless-engine@sha256:"
        "35409ff97c2f518e468790c28bd19206ae777a945fcffe5775585e28fd9939a7",
    },
    "run": {
        "alias": "iamMrDuncan/Qwen3.8-27B-PN3-GGUF",
        "context": 65536,
        "threads_max": 8,
        "args": ["-np", "1", "-ngl", "99", "-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on", "--jinja"],
        "env": {"GGML_CUDA_FATTN_SM60": "1"},
    },
    "receipt": {
        "summary": "Decode about 30 tok/s at short context.",
        "decode_tps": {"short": 30.06},
        "prefill_tps": {"ctx_4k": 121.4},
    },
}


def example() -> dict[str, Any]:
    return copy.deepcopy(EXAMPLE)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def to_toml(data: dict[str, Any]) -> str:
    """Scalars first, then one [table] per dict of the top level (nested dicts inline)."""
    head = [f"{json.dumps(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    out = "\n".join(head) + "\n"
    for k, v in data.items():
        if isinstance(v, dict):
            out += f"\n[{json.dumps(k)}]\n"
            out += "".join(f"{json.dumps(kk)} = {_value(vv)}\n" for kk, vv in v.items())
    return out


def write_recipe(root: Path, data: dict[str, Any], rel: str | None = None) -> Path:
    """Write data at rel (default: the path its hf_repo and card id call for)."""
    if rel is None:
        rel = f"{data['model']['hf_repo']}/{data['card']['id']}.toml"
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_toml(data), encoding="utf-8")
    return path


def variant(repo: str, card: str = "p100", name: str | None = None, **top: Any) -> dict[str, Any]:
    """The example recipe for another repo / card / short name."""
    data = example()
    data["model"]["hf_repo"] = repo
    data["run"]["alias"] = repo
    data["card"]["id"] = card
    if name is None:
        data["model"].pop("name")
    else:
        data["model"]["name"] = name
    data.update(top)
    return data
