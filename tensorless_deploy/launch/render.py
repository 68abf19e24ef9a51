"""Render a launch spec to systemd unit files (pure: text out, nothing read from any host)."""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.launch.container import (
    Escape,
    container_options,
    quadlet_keys,
    quadlet_startup_keys,
    run_argv,
)
from tensorless_deploy.launch.spec import (
    RESTART_MAX_DELAY_S,
    RESTART_SEC,
    RESTART_STEPS,
    LaunchSpec,
)
from tensorless_deploy.shell import QUADLET_DIR, SYSTEMD_DIR

if TYPE_CHECKING:
    import jinja2

# C0 controls (newline, carriage return, tab, escape...), DEL and the C1 controls (NEL...).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


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
_SAFE_RAW = re.compile(r"[A-Za-z0-9._/:=@+\[\]-]+")


def sd_raw(value: object) -> str:
    """A value for a quadlet key that takes its value raw (Volume=, AddDevice=, Image=,
    ContainerName=, HealthCmd=): quadlet neither unquotes nor escapes it, and systemd would
    still expand % and $ in the ExecStart it lands in, so only plain characters are allowed
    through (no space, quote, backslash, %, $, comma or control character)."""
    text = _checked(value)
    if not _SAFE_RAW.fullmatch(text):
        raise RenderError(
            f"refusing {text!r} in a quadlet unit: only letters, digits and . _ / : = @ + - [ ] "
            "are safe there",
            fix="use a models directory path made of those characters",
        )
    return text


def sd_raw_words(values: Iterable[object]) -> str:
    """Several raw words, space-separated (HealthCmd=): each one plain, as sd_raw."""
    return " ".join(sd_raw(v) for v in values)


def sd_command(words: Iterable[object]) -> str:
    """A command line: the executable as an absolute path, unquoted, then quoted words."""
    first, *rest = [_checked(w) for w in words]
    if not _SAFE_BINARY.fullmatch(first):
        raise RenderError(f"refusing executable {first!r}: must be a plain absolute path")
    return " ".join([first, *(sd_word(w) for w in rest)])


def _no_continuation(text: str) -> str:
    if text.endswith("\\"):
        raise RenderError(
            f"refusing {text!r} in a unit file: a trailing backslash continues the line"
        )
    return text


def sd_value(value: object) -> str:
    """A free-text value (Description=): specifiers escaped, no quoting needed."""
    return _no_continuation(_checked(value)).replace("%", "%%")


def sd_comment(value: object) -> str:
    return _no_continuation(_checked(value))


def templates_dir() -> Path:
    return Path(__file__).resolve().parent / "templates"


@cache
def _env() -> jinja2.Environment:
    # imported here: a command that renders no unit (plan, run) does not pay for jinja2
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        sd_word=sd_word,
        sd_words=sd_words,
        sd_value=sd_value,
        sd_command=sd_command,
        sd_raw=sd_raw,
        sd_raw_words=sd_raw_words,
        sd_comment=sd_comment,
    )
    return env


@dataclass(frozen=True)
class UnitFile:
    """A rendered unit: where it goes, what it says, and the service systemd will run."""

    path: str
    content: str
    service: str
    kind: str  # "quadlet" or "service"


def _check_spec(spec: LaunchSpec) -> None:
    """What no escaping can make safe: the bind address must be an IP literal (it lands raw in
    HealthCmd= and in URLs), and the volume's paths must be absolute without ':' (podman splits
    SOURCE:DEST:OPTIONS at every colon)."""
    try:
        ipaddress.ip_address(_checked(spec.bind))
    except ValueError:
        raise RenderError(f"refusing bind address {spec.bind!r}: must be an IP address") from None
    if "%" in spec.bind:
        raise RenderError(f"refusing bind address {spec.bind!r}: no %zone in a unit file")
    for what, path in (("model path", spec.model_path), ("model mount", spec.model_mount)):
        if not posixpath.isabs(_checked(path)) or ":" in path:
            raise RenderError(
                f"refusing {what} {path!r}: must be an absolute path without ':'",
                fix="use a models directory path made of letters, digits and . _ / + -",
            )


def _raw_words(value: str) -> str:
    return sd_raw_words(value.split(" "))


_ESCAPES: dict[Escape, Callable[[str], str]] = {
    "raw": sd_raw,
    "word": sd_word,
    "raw_words": _raw_words,
}


def _key_lines(keys: list[tuple[str, str, Escape]]) -> list[str]:
    return [f"{key}={_ESCAPES[escape](value)}" for key, value, escape in keys]


def _service_keys(restart_backoff: bool) -> dict[str, object]:
    """Restart=always with its pause, growing (RestartSteps=, systemd 254+) where the host's
    systemd has it, and no start limit: an always-on server is started again after anything but
    a stop asked of systemd, a crash loop included (launch.spec). The same in both unit kinds."""
    backoff = (
        [("RestartSteps", RESTART_STEPS), ("RestartMaxDelaySec", RESTART_MAX_DELAY_S)]
        if restart_backoff
        else []
    )
    return {"restart_sec": RESTART_SEC, "restart_backoff": backoff}


def render_quadlet(
    spec: LaunchSpec, *, digest: str, notify_healthy: bool, restart_backoff: bool = False
) -> UnitFile:
    """A rootful quadlet .container (podman >= 4.7, QUADLET_MIN_PODMAN); Notify=healthy from 5.
    restart_backoff: the host's systemd has RestartSteps= (spec.RESTART_STEPS_MIN_SYSTEMD)."""
    _check_spec(spec)
    if spec.engine != "podman":
        raise RenderError(f"{spec.name}: quadlet units run podman, not {spec.engine}")
    keys = quadlet_keys(container_options(spec, health=True, startup_probe=notify_healthy))
    keys.insert(1, ("Image", spec.image, "raw"))
    if notify_healthy:
        keys += quadlet_startup_keys(spec)
    text = (
        _env()
        .get_template("quadlet.container.j2")
        .render(
            spec=spec,
            digest=digest,
            container=_key_lines(keys),
            **_service_keys(restart_backoff),
        )
    )
    return UnitFile(f"{QUADLET_DIR}/{spec.name}.container", text, f"{spec.name}.service", "quadlet")


def render_service(
    spec: LaunchSpec, *, digest: str, engine_bin: str, restart_backoff: bool = False
) -> UnitFile:
    """A plain systemd .service running podman (older than 4.7) or docker in the foreground.
    restart_backoff: as render_quadlet's."""
    _check_spec(spec)
    exec_start = run_argv(spec, engine_bin, health=True)
    text = (
        _env()
        .get_template("plain.service.j2")
        .render(
            spec=spec,
            digest=digest,
            engine_bin=engine_bin,
            exec_start=exec_start,
            **_service_keys(restart_backoff),
        )
    )
    return UnitFile(f"{SYSTEMD_DIR}/{spec.name}.service", text, f"{spec.name}.service", "service")
