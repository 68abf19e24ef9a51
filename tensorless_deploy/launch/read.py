"""Unit files this tool wrote, read back into the container they describe: the inverse of
launch.render, through the same option table (launch.container.FORMATS), so status can say
field by field how a deployed unit differs from the one the catalog's recipe renders now."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

from tensorless_deploy.launch.container import FORMATS, Kind
from tensorless_deploy.launch.spec import SECRET_MOUNT_DIR
from tensorless_deploy.recipe.flags import LAUNCHER

# The llama-server flags the launcher sets itself, by how they are read back (recipe.flags.
# LAUNCHER, the table launch.spec writes them from)
ADDRESS_FLAGS = tuple(r.written for r in LAUNCHER if r.read == "address")
(CONTEXT_FLAG,) = (r.written for r in LAUNCHER if r.read == "context")
# Who may call the API (the operator's access options): status reports them as "access"
ACCESS_WITH_VALUE = tuple(r.written for r in LAUNCHER if r.read == "access" and not r.switch)
ACCESS_SWITCHES = tuple(r.written for r in LAUNCHER if r.read == "access" and r.switch)
OWNED_WITH_VALUE = tuple(r.written for r in LAUNCHER if not r.switch)
OWNED_SWITCHES = tuple(r.written for r in LAUNCHER if r.switch)


@dataclass(frozen=True)
class UnitContent:
    """What a unit runs: the image, the container options, llama-server's argv."""

    image: str | None
    options: tuple[tuple[Kind, str], ...]
    server_args: tuple[str, ...]

    def values(self, kind: Kind) -> tuple[str, ...]:
        return tuple(v for k, v in self.options if k == kind)

    def flag(self, name: str) -> str | None:
        """The value llama-server gets for a flag the launcher sets (its last one wins)."""
        args = self.server_args
        found = None
        for i, arg in enumerate(args[:-1]):
            if arg == name:
                found = args[i + 1]
        return found

    def access(self) -> tuple[str, ...]:
        """The access arguments llama-server gets: key file, TLS files, CORS, --metrics."""
        out = [f"{f} {v}" for f in ACCESS_WITH_VALUE if (v := self.flag(f)) is not None]
        return (*out, *(f for f in ACCESS_SWITCHES if f in self.server_args))

    def volumes(self, secrets: bool) -> tuple[str, ...]:
        """The model's mount (secrets=False), or the operator's secret files' (True): what the
        container sees under SECRET_MOUNT_DIR."""
        inside = SECRET_MOUNT_DIR.rstrip("/") + "/"
        return tuple(v for v in self.values("volume") if (f":{inside}" in v) == secrets)

    def recipe_args(self) -> tuple[str, ...]:
        """The argv without the flags the launcher owns: the recipe's args and extra args."""
        out: list[str] = []
        skip = False
        for arg in self.server_args:
            if skip:
                skip = False
                continue
            if arg in OWNED_WITH_VALUE:
                skip = True
                continue
            if arg in OWNED_SWITCHES:
                continue
            out.append(arg)
        return tuple(out)


def _words(line: str) -> list[str]:
    """A unit's command line as systemd reads it: double-quoted words, %% and $$ doubled."""
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line)]


def read_quadlet(text: str) -> UnitContent:
    by_key = {f.key: k for k, f in FORMATS.items() if f.key}
    image: str | None = None
    args: tuple[str, ...] = ()
    opts: list[tuple[Kind, str]] = []
    section = ""
    for line in text.splitlines():
        if line.startswith("["):
            section = line.strip()
            continue
        if section != "[Container]" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if key == "Image":
            image = value
        elif key == "Exec":
            args = tuple(_words(value))
        elif key in by_key:
            kind = by_key[key]
            f = FORMATS[kind]
            if f.escape == "word":
                value = " ".join(_words(value))
            if f.quadlet_value is not None and value == f.quadlet_value:
                continue  # a switch (NoNewPrivileges=true): its run flag's value is implied
            opts.append((kind, value))
    return UnitContent(image, tuple(opts), args)


def read_service(text: str) -> UnitContent:
    by_flag = {f.flag: k for k, f in FORMATS.items()}
    exec_start = next(
        (ln.removeprefix("ExecStart=") for ln in text.splitlines() if ln.startswith("ExecStart=")),
        None,
    )
    if exec_start is None:
        return UnitContent(None, (), ())
    words = _words(exec_start)
    at = words.index("--pull=never") + 1 if "--pull=never" in words else 2
    opts: list[tuple[Kind, str]] = []
    while at < len(words):
        flag, eq, value = words[at].partition("=")
        kind = by_flag.get(flag)
        if kind is not None and FORMATS[kind].joined and eq:
            opts.append((kind, value))  # one word: --read-only=true
            at += 1
            continue
        if kind is None or at + 1 >= len(words) or eq:
            break  # the image: the first word that is not one of the options
        if FORMATS[kind].quadlet_value is None:
            opts.append((kind, words[at + 1]))
        at += 2
    image = words[at] if at < len(words) else None
    return UnitContent(image, tuple(opts), tuple(words[at + 1 :]))


def unit_engine(path: str, text: str) -> str:
    """Which engine a unit runs: podman for a quadlet, else the binary its ExecStart names."""
    if path.endswith(".container"):
        return "podman"
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            words = _words(line.removeprefix("ExecStart="))
            return posixpath.basename(words[0]) if words else "podman"
    return "podman"


def read_unit(path: str, text: str) -> UnitContent:
    return read_quadlet(text) if path.endswith(".container") else read_service(text)


@dataclass(frozen=True)
class FieldDrift:
    """One way a deployed unit differs from what the recipe renders now."""

    field: str  # image, model, secrets, access, context, args, env, card, address, unit
    deployed: str
    wanted: str


def _show(values: tuple[str, ...] | str | None) -> str:
    if values is None:
        return "-"
    return values if isinstance(values, str) else " ".join(values) or "-"


def drift(deployed: UnitContent, wanted: UnitContent, deployed_text: str, wanted_text: str) -> (
    tuple[FieldDrift, ...]
):  # fmt: skip
    """Field by field; anything else that differs in the text is "unit"."""
    out: list[FieldDrift] = []

    def cmp(name: str, a: tuple[str, ...] | str | None, b: tuple[str, ...] | str | None) -> None:
        if a != b:
            out.append(FieldDrift(name, _show(a), _show(b)))

    cmp("image", deployed.image, wanted.image)
    cmp("model", deployed.volumes(secrets=False), wanted.volumes(secrets=False))
    cmp("secrets", deployed.volumes(secrets=True), wanted.volumes(secrets=True))
    cmp("access", deployed.access(), wanted.access())
    cmp("context", deployed.flag(CONTEXT_FLAG), wanted.flag(CONTEXT_FLAG))
    cmp("args", deployed.recipe_args(), wanted.recipe_args())
    cmp("env", tuple(sorted(deployed.values("env"))), tuple(sorted(wanted.values("env"))))
    cmp(
        "card",
        deployed.values("device") + deployed.values("gpus"),
        wanted.values("device") + wanted.values("gpus"),
    )
    cmp(
        "address",
        tuple(f"{f} {deployed.flag(f)}" for f in ADDRESS_FLAGS),
        tuple(f"{f} {wanted.flag(f)}" for f in ADDRESS_FLAGS),
    )
    if not out and deployed_text != wanted_text:
        changed = [
            ln
            for ln in wanted_text.splitlines()
            if ln not in deployed_text.splitlines() and not ln.startswith("#")
        ]
        gone = [
            ln
            for ln in deployed_text.splitlines()
            if ln not in wanted_text.splitlines() and not ln.startswith("#")
        ]
        out.append(FieldDrift("unit", "; ".join(gone) or "-", "; ".join(changed) or "-"))
    return tuple(out)
