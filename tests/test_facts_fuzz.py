"""Any text into any host-fact parser yields a value or FactError, never another exception."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorless_deploy.facts import parsers
from tensorless_deploy.facts.errors import FactError
from tensorless_deploy.facts.survey import (
    EXIT_MARKER,
    SECTION_MARKER,
    all_sections,
    host_facts_from_inventory,
    host_facts_from_survey,
)

# Text that looks like what hosts print: random lines mixed with fragments of real formats.
FRAGMENTS = [
    "0, GPU-ab6a0263-0ae2-1846-2f4f-455ff8b12167, NVIDIA H200, 9.0, 143771, 0, 580.159.04",
    "1, GPU-1, Tesla T4, 7.5, [N/A], [N/A], [N/A]",
    "0, GPU-x, , 99999999999999999999.0, 1, 2, 3.4",
    'Field "compute_cap" is not a valid field to query.',
    "couldn't communicate with the NVIDIA driver",
    "crw-rw-rw- 1 root root 195,   0 Nov 30 01:04 /dev/nvidia0",
    "/dev/nvidia-caps:",
    "lrwxrwxrwx 1 root root 12 Nov 30 01:10 195:0 -> ../nvidia0",
    "podman version 5.4.2",
    "Docker version 28.2.2, build e6534b4",
    '{"nvidia":{"path":"nvidia-container-runtime"}}',
    "{",
    "NVIDIA Container Toolkit CLI version 1.17.8",
    "commit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d",
    "@@td file /etc/cdi/nvidia.yaml",
    "kind: nvidia.com/gpu",
    "devices:\n- name: 0\n  containerEdits: {}",
    "  - hostPath: /usr/lib/libcuda.so.580.159.04",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
    "container_use_devices --> on",
    "Enforcing",
    "Filesystem     1024-blocks     Used Available Capacity Mounted on",
    "/dev/vda         264212084 23189144  83201768      22% /",
    "LISTEN 0      128    [::ffff:127.0.0.1]:18085       *:*",
    "LISTEN 0 128 *%lo:99999 *:*",
    "LISTEN 0 128 [:80 *:*",
    SECTION_MARKER + "nvidia-smi",
    EXIT_MARKER + "0",
    EXIT_MARKER + "x",
]
texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=80)), max_size=12).map(
    "\n".join
)
exit_codes = st.sampled_from([0, 1, 2, 3, 6, 9, 18, 127, 255])

PARSERS: dict[str, Callable[[str, int], Any]] = {
    "nvidia-smi": parsers.parse_nvidia_smi,
    "devices": lambda text, code: parsers.nvidia_devices(text, text, code),
    "podman": lambda text, code: parsers.parse_podman_version(text, code, None),
    "quadlet": lambda text, code: parsers.parse_quadlet_path(text),
    "docker": lambda text, code: parsers.parse_docker_version(text, code, text, code),
    "nvidia-ctk": parsers.parse_nvidia_ctk_version,
    "cdi-yaml": lambda text, code: parsers.parse_cdi_spec("/etc/cdi/x.yaml", text),
    "cdi-json": lambda text, code: parsers.parse_cdi_spec("/etc/cdi/x.json", text),
    "cdi": lambda text, code: parsers.analyse_cdi(
        parsers.parse_cdi_dump(text), text[:12] or None, [text[:40]]
    ),
    "selinux": lambda text, code: parsers.parse_selinux(text, code, text, code),
    "pid1": parsers.parse_pid1,
    "nproc": parsers.parse_nproc,
    "df": parsers.parse_df,
    "ss": parsers.parse_ss,
    "version": lambda text, code: parsers.parse_version(text),
    "survey": lambda text, code: host_facts_from_survey(text),
}


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, code=exit_codes)
def test_parser_returns_a_value_or_fact_error(name: str, text: str, code: int) -> None:
    with contextlib.suppress(FactError):
        PARSERS[name](text, code)


section_names = [section.name for section in all_sections()]


@settings(max_examples=150, deadline=None)
@given(
    bodies=st.lists(texts, min_size=len(section_names), max_size=len(section_names)),
    codes=st.lists(exit_codes, min_size=len(section_names), max_size=len(section_names)),
)
def test_any_section_contents_give_host_facts(bodies: list[str], codes: list[int]) -> None:
    """Well-framed sections with any contents always read: problems, never a crash."""
    lines: list[str] = []
    for name, body, code in zip(section_names, bodies, codes, strict=True):
        body = body.replace("@@td", "@@")  # a body cannot forge the survey's own markers
        lines += [f"{SECTION_MARKER}{name}", *body.splitlines(), f"{EXIT_MARKER}{code}"]
    with contextlib.suppress(FactError):
        host_facts_from_survey(lines)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    data=st.dictionaries(
        st.sampled_from(["gpus", "driver_version", "cpus", "ssh_user"]), json_values
    )
)
def test_any_inventory_data_gives_host_facts_or_fact_error(data: dict[str, Any]) -> None:
    with contextlib.suppress(FactError):
        host_facts_from_inventory(data)
