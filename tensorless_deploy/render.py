"""Render a launch spec to systemd unit files (pure: text out, nothing read from any host)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.launch import LaunchSpec

QUADLET_DIR = "/etc/containers/systemd"
SYSTEMD_DIR = "/etc/systemd/system"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class RenderError(TensorlessError):
    """A value cannot be written into a unit file safely."""


def _checked(value: object) -> str:
    text = str(value)
    if _CONTROL.search(text):
        raise RenderError(
            f"refusing to write {text!r} into a unit file: it holds a newline or another "
            "control character",
            fix="remove it from the recipe or the command line",
        )
    return text


def sd_word(value: object) -> str:
    """One word for a systemd command line or key value: always double-quoted; backslash and
    quote escaped; % and $ doubled so systemd expands neither a specifier nor a variable."""
    text = _checked(value)
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    text = text.replace("%", "%%").replace("$", "$$")
    return f'"{text}"'


def sd_words(values: Iterable[object]) -> str:
    return " ".join(sd_word(v) for v in values)


_SAFE_BINARY = re.compile(r"/[A-Za-z0-9/._-]+")
_SAFE_RAW = re.compile(r"[A-Za-z0-9._/:=@+-]+")


def sd_raw(value: object) -> str:
    """A value for a quadlet key that takes its value raw (Volume=, AddDevice=): quadlet neither
    unquotes nor escapes it, so only plain characters are allowed through."""
    text = _checked(value)
    if not _SAFE_RAW.fullmatch(text):
        raise RenderError(
            f"refusing {text!r} in a quadlet unit: only letters, digits and . _ / : = @ + - "
            "are safe there",
            fix="use a models directory path made of those characters",
        )
    return text


def sd_command(words: Iterable[object]) -> str:
    """A command line: the executable as an absolute path, unquoted, then quoted words."""
    first, *rest = [_checked(w) for w in words]
    if not _SAFE_BINARY.fullmatch(first):
        raise RenderError(f"refusing executable {first!r}: must be a plain absolute path")
    return " ".join([first, *(sd_word(w) for w in rest)])


def sd_value(value: object) -> str:
    """A free-text value (Description=): specifiers escaped, no quoting needed."""
    return _checked(value).replace("%", "%%")


def sd_comment(value: object) -> str:
    return _checked(value)


def templates_dir() -> Path:
    here = Path(__file__).resolve().parent
    shipped = here / "_builtin" / "templates"
    return shipped if shipped.is_dir() else here.parent / "templates"


@cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        sd_word=sd_word, sd_words=sd_words, sd_value=sd_value, sd_command=sd_command, sd_raw=sd_raw,
        sd_comment=sd_comment,
    )  # fmt: skip
    return env


@dataclass(frozen=True)
class UnitFile:
    """A rendered unit: where it goes, what it says, and the service systemd will run."""

    path: str
    content: str
    service: str
    kind: str  # "quadlet" or "service"


def render_quadlet(spec: LaunchSpec, *, digest: str, notify_healthy: bool) -> UnitFile:
    """A rootful quadlet .container (podman >= 4.4); Notify=healthy from podman 5."""
    if spec.engine != "podman":
        raise RenderError(f"{spec.name}: quadlet units run podman, not {spec.engine}")
    text = _env().get_template("quadlet.container.j2").render(
        spec=spec, digest=digest, notify_healthy=notify_healthy
    )
    return UnitFile(f"{QUADLET_DIR}/{spec.name}.container", text, f"{spec.name}.service",
                    "quadlet")  # fmt: skip


def render_service(spec: LaunchSpec, *, digest: str, engine_bin: str) -> UnitFile:
    """A plain systemd .service running podman (older than 4.4) or docker in the foreground."""
    exec_start = [
        engine_bin, "run", "--rm", "--pull=never",
        "--health-cmd", f"curl -fsS {spec.health_url}", "--health-interval", "30s",
        "--health-retries", "3", "--health-start-period", f"{spec.start_timeout_s}s",
        *spec.engine_run_args(),
    ]  # fmt: skip
    text = _env().get_template("plain.service.j2").render(
        spec=spec, digest=digest, engine_bin=engine_bin, exec_start=exec_start
    )
    return UnitFile(f"{SYSTEMD_DIR}/{spec.name}.service", text, f"{spec.name}.service",
                    "service")  # fmt: skip
