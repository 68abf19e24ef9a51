"""The gguf package's constants (metadata keys, value and quantization types, block sizes),
without the package's ``__init__``, which imports numpy and gguf's reader, writer and
vocabulary (0.1-0.25 s of every command that plans: bench/plan_scale.py, bench/cli_startup.py)
though the tool reads headers itself. The one source stays gguf's own ``constants.py``, run from
its file; where gguf is already imported, its own module is used."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

_NAME = "tensorless_deploy.gguf._gguf_constants"


def _load() -> ModuleType:
    for name in ("gguf.constants", _NAME):
        loaded = sys.modules.get(name)
        if loaded is not None:
            return loaded
    package = importlib.util.find_spec("gguf")  # finds the package without running it
    where = package.submodule_search_locations if package is not None else None
    spec = (
        importlib.util.spec_from_file_location(_NAME, Path(next(iter(where))) / "constants.py")
        if where
        else None
    )
    if spec is None or spec.loader is None:  # not a plain package on disk: import it whole
        import gguf.constants

        return gguf.constants
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    try:
        spec.loader.exec_module(module)
    except ImportError:  # a gguf whose constants import its siblings: import it whole
        del sys.modules[_NAME]
        import gguf.constants

        return gguf.constants
    return module


if TYPE_CHECKING:
    from gguf.constants import (
        GGML_QUANT_SIZES,
        GGUF_MAGIC,
        GGMLQuantizationType,
        GGUFValueType,
        Keys,
    )
else:
    _constants = _load()
    GGML_QUANT_SIZES = _constants.GGML_QUANT_SIZES
    GGUF_MAGIC = _constants.GGUF_MAGIC
    GGMLQuantizationType = _constants.GGMLQuantizationType
    GGUFValueType = _constants.GGUFValueType
    Keys = _constants.Keys

__all__ = ["GGML_QUANT_SIZES", "GGUF_MAGIC", "GGMLQuantizationType", "GGUFValueType", "Keys"]
