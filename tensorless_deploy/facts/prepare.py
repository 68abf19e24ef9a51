"""pyinfra facts that `prepare`'s operations read, as plain data: the NVIDIA device nodes and
their /dev/char links, the CDI specs of kind nvidia.com/gpu, and which refresh units keep the
spec fresh (the toolkit's, or tensorless-deploy's own). The first two read the survey's own
sections with its own parsers, so an operation and doctor judge a host alike."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any, TypedDict

from pyinfra.api.exceptions import FactProcessError
from pyinfra.api.facts import FactBase

from tensorless_deploy import shell

from .errors import FactError
from .nvidia import parse_driver_packages
from .survey import (
    cdi_sections,
    device_sections,
    driver_packages_section,
    read_cdi_specs,
    read_devices,
    split_sections,
    survey_script,
)
from .values import CDI_GPU_KIND, DriverPackages

# Where the toolkit (1.18 and later) installs its refresh units, and where ours go.
TOOLKIT_UNIT_DIRS = ("/usr/lib/systemd/system", "/lib/systemd/system")
TOOLKIT_REFRESH_PATH = "nvidia-cdi-refresh.path"
OUR_REFRESH_SERVICE = "tensorless-cdi-refresh.service"
OUR_REFRESH_PATH = "tensorless-cdi-refresh.path"
OUR_UNIT_DIR = shell.SYSTEMD_DIR
# makes the NVIDIA device nodes and their /dev/char links at every boot (operations.prepare)
OUR_NODES_SERVICE = "tensorless-nvidia-devices.service"


class NodeState(TypedDict):
    uvm_present: bool  # /dev/nvidia-uvm is a character device
    missing_char_links: list[str]  # NVIDIA nodes without their /dev/char/MAJOR:MINOR link


class GpuSpec(TypedDict):
    path: str
    driver_version: str | None  # the driver it was generated for
    devices: list[str]  # its device names: "0", "GPU-<uuid>", "all"


class BootUnitState(TypedDict):
    sha256: str | None  # of the unit file (None: not there)
    enabled: str  # what `systemctl is-enabled` printed ('' for nothing)


class RefreshState(TypedDict):
    toolkit_units: bool  # the toolkit's nvidia-cdi-refresh.path is installed
    toolkit_path_enabled: str  # what `systemctl is-enabled` printed ('' for nothing)
    our_service_sha256: str | None
    our_path_sha256: str | None
    our_path_enabled: str


def _sections(output: Iterable[str]) -> Any:
    try:
        return split_sections(output)
    except FactError as exc:
        raise FactProcessError(exc.message) from exc


class NvidiaNodes(FactBase[NodeState]):
    """The NVIDIA device nodes as doctor's gpu.uvm and gpu.char_links checks see them."""

    def command(self) -> str:
        return survey_script(device_sections())

    def process(self, output: Iterable[str]) -> NodeState:
        try:
            devices = read_devices(_sections(output))
        except FactError as exc:
            raise FactProcessError(exc.message) from exc
        return {
            "uvm_present": devices.uvm_present,
            "missing_char_links": list(devices.missing_char_links),
        }


class GpuCdiSpecs(FactBase[list[GpuSpec]]):
    """The CDI specs of kind nvidia.com/gpu in /etc/cdi and /var/run/cdi."""

    def command(self) -> str:
        return survey_script(cdi_sections())

    def process(self, output: Iterable[str]) -> list[GpuSpec]:
        try:
            specs = read_cdi_specs(_sections(output))
        except FactError as exc:
            raise FactProcessError(exc.message) from exc
        return [
            {"path": s.path, "driver_version": s.driver_version, "devices": list(s.devices)}
            for s in specs
            if s.kind == CDI_GPU_KIND
        ]


def _sha(key: str, path: str) -> str:
    p = shlex.quote(path)
    return f"if [ -f {p} ]; then echo {key}=$(hashit {p}); fi"


def _enabled(key: str, unit: str) -> str:
    return f'echo {key}="$(systemctl is-enabled {unit} 2>/dev/null)"'


class CdiRefresh(FactBase[RefreshState]):
    """Which refresh units keep the CDI spec fresh here: the toolkit's (present, enabled) and
    ours (their files' sha256, enabled)."""

    def command(self) -> str:
        toolkit = " ".join(shlex.quote(f"{d}/{TOOLKIT_REFRESH_PATH}") for d in TOOLKIT_UNIT_DIRS)
        return shell.with_host_lib(
            "; ".join(
                [
                    f'for f in {toolkit}; do [ -f "$f" ] && echo toolkit_units=yes; done',
                    _enabled("toolkit_path_enabled", TOOLKIT_REFRESH_PATH),
                    _sha("our_service_sha256", f"{OUR_UNIT_DIR}/{OUR_REFRESH_SERVICE}"),
                    _sha("our_path_sha256", f"{OUR_UNIT_DIR}/{OUR_REFRESH_PATH}"),
                    _enabled("our_path_enabled", OUR_REFRESH_PATH),
                    "true",
                ]
            )
        )

    def process(self, output: Iterable[str]) -> RefreshState:
        seen: dict[str, str] = {}
        for line in output:
            key, _, value = line.strip().partition("=")
            seen.setdefault(key, value)
        return {
            "toolkit_units": seen.get("toolkit_units") == "yes",
            "toolkit_path_enabled": seen.get("toolkit_path_enabled", ""),
            "our_service_sha256": seen.get("our_service_sha256") or None,
            "our_path_sha256": seen.get("our_path_sha256") or None,
            "our_path_enabled": seen.get("our_path_enabled", ""),
        }


class DriverPackagesFact(FactBase[dict[str, Any]]):
    """The driver's packages and their holds, locks and pin (the survey's own section), as
    plain data (DriverPackages dumped)."""

    def command(self) -> str:
        return survey_script([driver_packages_section()])

    def process(self, output: Iterable[str]) -> dict[str, Any]:
        try:
            section = _sections(output)["driver-packages"]
            found: DriverPackages = parse_driver_packages(section.text, section.exit_code)
            return found.model_dump(mode="json")
        except (FactError, KeyError) as exc:
            raise FactProcessError(f"driver packages: {exc}") from exc


class NodesAtBoot(FactBase[BootUnitState]):
    """The unit that makes the NVIDIA device nodes and /dev/char links at boot: its file's
    sha256, and whether it is enabled."""

    def command(self) -> str:
        return shell.with_host_lib(
            "; ".join(
                [
                    _sha("sha256", f"{OUR_UNIT_DIR}/{OUR_NODES_SERVICE}"),
                    _enabled("enabled", OUR_NODES_SERVICE),
                    "true",
                ]
            )
        )

    def process(self, output: Iterable[str]) -> BootUnitState:
        seen: dict[str, str] = {}
        for line in output:
            key, _, value = line.strip().partition("=")
            seen.setdefault(key, value)
        return {"sha256": seen.get("sha256") or None, "enabled": seen.get("enabled", "")}
