"""pyinfra facts for GPU hosts: survey sections run over SSH, their text handed to the parsers.

Every command is POSIX sh and exits 0 whatever the tools do (their exit codes travel inside the
output), so pyinfra never marks a host failed because nvidia-smi said "no driver". Every command
runs under the survey's time bound (``survey.PROBE_TIMEOUT_S``): a survey section that hangs reads
as timed out, any other fact that hangs is a FactProcessError naming it. Output that cannot be
read at all becomes pyinfra's FactProcessError, which pyinfra reports per host. ``HostSurvey``
gathers everything doctor and plan need in a single round trip.

Like pyinfra's own facts, every fact returns plain data (dicts, lists, strings, numbers), so any
caller can print it, pyinfra's command line included (``pyinfra INV fact
tensorless_deploy.facts.pyinfra.HostSurvey``): the JSON form of the typed value its parser
reads. A caller builds the typed value from it with the fact's ``typed`` (``HostFacts``,
``BlobState``, ...), which validates it as the parser would have made it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python
from pyinfra.api.exceptions import FactProcessError
from pyinfra.api.facts import FactBase

from tensorless_deploy import shell
from tensorless_deploy.hub import DEFAULT_MODELS_DIR, STAMP_STAT

from .device import DEVICE_LINE
from .errors import FactError
from .parsers import parse_blob_state, parse_deployed_units
from .survey import (
    DEFAULT_CDI_DIRS,
    Section,
    SectionOutput,
    all_sections,
    bounded_command,
    cdi_sections,
    cpu_sections,
    device_sections,
    disk_sections,
    engine_sections,
    gpu_sections,
    host_facts_from_survey,
    init_sections,
    login_sections,
    port_sections,
    read_cdi_specs,
    read_cpus,
    read_devices,
    read_disk,
    read_engines,
    read_gpus,
    read_init,
    read_listeners,
    read_login,
    read_selinux,
    read_toolkit,
    selinux_sections,
    split_sections,
    survey_script,
    toolkit_sections,
    unbounded_output,
)
from .values import (
    BlobState,
    CdiSpec,
    ContainerEngines,
    ContainerToolkit,
    DeployedUnit,
    DiskSpace,
    GpuReport,
    HostFacts,
    InitSystem,
    Listener,
    Login,
    NvidiaDevices,
    Selinux,
)

T = TypeVar("T")


def _process(output: Iterable[str], read: Callable[[Iterable[str]], T]) -> T:
    try:
        return read(output)
    except FactError as exc:
        raise FactProcessError(exc.message) from exc


Plain = Any  # a JSON value: what a fact returns


@cache
def _adapter(value_type: Any) -> TypeAdapter[Any]:
    return TypeAdapter(value_type)


class _PlainFact(FactBase[Plain], Generic[T]):
    """A fact whose parser reads a typed value (``read``) and that returns it as plain data
    (``process``), as pyinfra's own facts do; ``typed`` builds the value back."""

    abstract = True
    value_type: ClassVar[Any]

    def read(self, output: Iterable[str]) -> T:
        raise NotImplementedError

    def process(self, output: Iterable[str]) -> Plain:
        return to_jsonable_python(self.read(output))

    @classmethod
    def typed(cls, plain: Plain) -> T:
        """The typed value from what the fact returned (a caller's own use of the fact)."""
        value: T = _adapter(cls.value_type).validate_python(plain)
        return value


class _SurveyFact(_PlainFact[T], Generic[T]):
    """A fact made of survey sections and the reader that turns them into one value."""

    abstract = True

    def _read(self, sections: Mapping[str, SectionOutput]) -> T:
        raise NotImplementedError

    def read(self, output: Iterable[str]) -> T:
        return _process(output, lambda lines: self._read(split_sections(lines)))


def _script(sections: Sequence[Section]) -> str:
    return survey_script(sections)


class NvidiaGpus(_SurveyFact[GpuReport]):
    """GPUs from NVIDIA_SMI_QUERY, or the state nvidia-smi is in (absent, no driver, ...)."""

    value_type = GpuReport

    def command(self) -> str:
        return _script(gpu_sections())

    def _read(self, sections: Mapping[str, SectionOutput]) -> GpuReport:
        return read_gpus(sections)


class NvidiaDeviceNodes(_SurveyFact[NvidiaDevices]):
    """/dev/nvidia* character devices (nvidia-uvm included) and their /dev/char links."""

    value_type = NvidiaDevices

    def command(self) -> str:
        return _script(device_sections())

    def _read(self, sections: Mapping[str, SectionOutput]) -> NvidiaDevices:
        return read_devices(sections)


class ContainerEngineVersions(_SurveyFact[ContainerEngines]):
    """podman and docker: present, version, quadlet generator, docker's runtimes."""

    value_type = ContainerEngines

    def command(self) -> str:
        return _script(engine_sections())

    def _read(self, sections: Mapping[str, SectionOutput]) -> ContainerEngines:
        return read_engines(sections)


class NvidiaContainerToolkit(_SurveyFact[ContainerToolkit]):
    """``nvidia-ctk --version``."""

    value_type = ContainerToolkit

    def command(self) -> str:
        return _script(toolkit_sections())

    def _read(self, sections: Mapping[str, SectionOutput]) -> ContainerToolkit:
        return read_toolkit(sections)


class CdiSpecs(_SurveyFact[tuple[CdiSpec, ...]]):
    """Every CDI spec file in /etc/cdi and /var/run/cdi (judge them with ``analyse_cdi``)."""

    value_type = tuple[CdiSpec, ...]

    def command(self, cdi_dirs: Sequence[str] = DEFAULT_CDI_DIRS) -> str:
        return _script(cdi_sections(cdi_dirs))

    def _read(self, sections: Mapping[str, SectionOutput]) -> tuple[CdiSpec, ...]:
        return read_cdi_specs(sections)


class SelinuxDevices(_SurveyFact[Selinux]):
    """SELinux mode and the ``container_use_devices`` boolean."""

    value_type = Selinux

    def command(self) -> str:
        return _script(selinux_sections())

    def _read(self, sections: Mapping[str, SectionOutput]) -> Selinux:
        return read_selinux(sections)


class InitProcess(_SurveyFact[InitSystem]):
    """What runs as PID 1 (systemd or not)."""

    value_type = InitSystem

    def command(self) -> str:
        return _script(init_sections())

    def _read(self, sections: Mapping[str, SectionOutput]) -> InitSystem:
        return read_init(sections)


class CpuCount(_SurveyFact[int]):
    """``nproc``."""

    value_type = int

    def command(self) -> str:
        return _script(cpu_sections())

    def _read(self, sections: Mapping[str, SectionOutput]) -> int:
        return read_cpus(sections)


class FreeDisk(_SurveyFact[DiskSpace]):
    """Free space at a path (its nearest existing parent when it is not there yet)."""

    value_type = DiskSpace

    def command(self, path: str = DEFAULT_MODELS_DIR) -> str:
        return _script(disk_sections(path))

    def _read(self, sections: Mapping[str, SectionOutput]) -> DiskSpace:
        return read_disk(sections)


class ListeningPorts(_SurveyFact[tuple[Listener, ...]]):
    """Every listening TCP socket (``ss -Hltn``); ask ``listener_blocks`` about one port."""

    value_type = tuple[Listener, ...]

    def command(self) -> str:
        return _script(port_sections())

    def _read(self, sections: Mapping[str, SectionOutput]) -> tuple[Listener, ...]:
        return read_listeners(sections)


class HostLogin(_SurveyFact[Login]):
    """The SSH user before any sudo (read it with ``_sudo=False``), and with ``sudo=True``
    whether sudo works without a password (``sudo -n``: never a prompt)."""

    value_type = Login

    def command(self, sudo: bool = False) -> str:
        return _script(login_sections(sudo))

    def _read(self, sections: Mapping[str, SectionOutput]) -> Login:
        return read_login(sections)


class HostSurvey(_PlainFact[HostFacts]):
    """Everything above in one SSH round trip, as one HostFacts value."""

    value_type = HostFacts

    def command(
        self, models_dir: str = DEFAULT_MODELS_DIR, cdi_dirs: Sequence[str] = DEFAULT_CDI_DIRS
    ) -> str:
        return _script(all_sections(models_dir, cdi_dirs))

    def read(self, output: Iterable[str]) -> HostFacts:
        return _process(output, host_facts_from_survey)


# --- what this tool put there, read by its operations, status and bench ----------------------


def _lines(output: Iterable[str], what: str) -> list[str]:
    """A bounded command's output; FactProcessError when it hung."""
    return _process(output, lambda lines: unbounded_output(lines, what))


def _one(output: Iterable[str], what: str) -> str:
    return "\n".join(_lines(output, what)).strip()


class ImagePresent(FactBase[bool]):
    """Whether the engine already holds the image (by digest)."""

    def command(self, engine_bin: str, image: str) -> str:
        check = "image exists" if engine_bin.endswith("podman") else "image inspect"
        return bounded_command(
            f"{shlex.quote(engine_bin)} {check} {shlex.quote(image)} >/dev/null 2>&1 "
            "&& echo yes || echo no"
        )

    def process(self, output: Iterable[str]) -> bool:
        return _one(output, "the image check") == "yes"


class ModelBlob(_PlainFact[BlobState]):
    """`stat` of the blob, its verification stamp, and the snapshot link's target."""

    value_type = BlobState

    def command(self, blob: str, stamp: str, snapshot: str) -> str:
        b, s, n = shlex.quote(blob), shlex.quote(stamp), shlex.quote(snapshot)
        return bounded_command(
            f"stat -c {shlex.quote(STAMP_STAT)} {b} 2>/dev/null || echo missing; "
            f'echo "$(cat {s} 2>/dev/null)"; echo "$(readlink {n} 2>/dev/null)"'
        )

    def read(self, output: Iterable[str]) -> BlobState:
        return parse_blob_state("\n".join(_lines(output, "the model file check")))


class HaproxyVersion(FactBase["str | None"]):
    """The first line of ``haproxy -v`` (the gateway's engine), or None: no haproxy here."""

    def command(self, haproxy: str) -> str:
        h = shlex.quote(haproxy)
        return bounded_command(f"if [ -x {h} ]; then {h} -v | head -n 1; else echo none; fi")

    def process(self, output: Iterable[str]) -> str | None:
        value = _one(output, "the haproxy version")
        return None if value in ("", "none") else value


class FileSha256(FactBase["str | None"]):
    """The sha256 of a file, or None when it does not exist."""

    def command(self, path: str) -> str:
        p = shlex.quote(path)
        return bounded_command(
            shell.with_host_lib(f"if [ -f {p} ]; then hashit {p}; else echo none; fi")
        )

    def process(self, output: Iterable[str]) -> str | None:
        value = _one(output, "the file hash")
        return None if value in ("", "none") else value


class HttpStatus(FactBase[int]):
    """The HTTP status a GET of url answers on the host (0: no connection)."""

    def command(self, url: str, head: bool = False) -> str:
        return shell.with_host_lib(f"http_code {'-I ' if head else ''}{shlex.quote(url)} || true")

    def process(self, output: Iterable[str]) -> int:
        text = "\n".join(output).strip()  # bounded: shell.HEALTH_TIMEOUT_S
        return int(text) if text.isdigit() else 0


class DeployedUnits(_PlainFact[tuple[DeployedUnit, ...]]):
    """Every unit tensorless-deploy wrote on the host, with what runs from it."""

    value_type = tuple[DeployedUnit, ...]

    @staticmethod
    def default() -> Plain:
        return []  # no output: no unit of ours on the host

    def command(self, secrets_root: str = "") -> str:
        """With secrets_root (where the units' API keys are), also each metrics-enabled unit's
        llama-server /metrics, read with its key."""
        script = shell.program(
            "tensorless_deploy.facts",
            "deployed-units",
            secrets_root=secrets_root,
            device_re=DEVICE_LINE,
            containers="yes",
        )
        return bounded_command(script)

    def read(self, output: Iterable[str]) -> tuple[DeployedUnit, ...]:
        return parse_deployed_units("\n".join(_lines(output, "the units' state")))


__all__: list[str] = [
    "CdiSpecs",
    "ContainerEngineVersions",
    "CpuCount",
    "DeployedUnits",
    "FileSha256",
    "FreeDisk",
    "HostLogin",
    "HostSurvey",
    "HttpStatus",
    "ImagePresent",
    "InitProcess",
    "ListeningPorts",
    "ModelBlob",
    "NvidiaContainerToolkit",
    "NvidiaDeviceNodes",
    "NvidiaGpus",
    "SelinuxDevices",
]
