"""Layer 2, host facts: what a GPU host is, read by pure parsers; pyinfra facts in .pyinfra."""

from __future__ import annotations

from .errors import FactError
from .parsers import NVIDIA_SMI_FIELDS, NVIDIA_SMI_QUERY
from .survey import build_host_facts, host_facts_from_inventory, host_facts_from_survey
from .values import HostFacts

__all__ = [
    "NVIDIA_SMI_FIELDS",
    "NVIDIA_SMI_QUERY",
    "FactError",
    "HostFacts",
    "build_host_facts",
    "host_facts_from_inventory",
    "host_facts_from_survey",
]
