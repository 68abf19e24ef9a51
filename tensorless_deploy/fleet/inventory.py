"""Inventories: a pyinfra inventory file (or this machine alone), the hosts chosen with --limit,
and each host's options resolved from its data and the command line (decisions.options)."""

from __future__ import annotations

import copy
import json
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tensorless_deploy.decisions.options import DATA_GPUS, DATA_PREFIX, Flags, Options, resolve
from tensorless_deploy.errors import InventoryError, UsageError
from tensorless_deploy.hostplan.plan import SurveyedHost


def host_data(host: Any) -> dict[str, object]:
    """The tensorless_* keys of a host's inventory data (pyinfra's HostData, its groups' data
    included): the tool's own and any mistyped one, which resolve refuses."""
    data = host.data
    if data is None:
        return {}
    return {k: v for k, v in data.dict().items() if k.startswith(DATA_PREFIX)}


def options_for(host: Any, flags: Flags, *, local: bool = False) -> Options:
    """One host's options: the command line, then its inventory data, then the defaults."""
    return resolve(flags, host_data(host), host.name, local=local)


def load_inventory(
    path: str | None, local: bool, *, offers_local: bool = True, offline: bool = False
) -> Any:
    """A pyinfra Inventory from a file (or host list), or this machine alone (@local).

    An inventory file is the operator's own Python: whatever it raises (sys.exit included) is
    reported as the inventory's problem, one line naming the file. Its groups are checked as
    pyinfra would silently skip or misread them, and a host listed twice is refused. A fix
    offers --local only where the command has it (offers_local). Exit codes:
    a path that does not exist is a usage error (2); a file that exists but cannot be read or
    loaded is a refused input, like a broken recipe (1).

    offline (plan --offline, which opens no connection): the hosts as ``OfflineHost``s, read
    by ``offline_inventory`` without pyinfra where it can (pyinfra's loader imports gevent's
    patches and paramiko, 0.35 s, and grows with the square of the hosts); the same hosts,
    groups and data either way.
    """
    if local:
        from pyinfra.api.inventory import Inventory

        return Inventory((["@local"], {}))
    or_local = " or --local" if offers_local else ""
    if path is None:
        raise UsageError(f"say which hosts: -i INVENTORY{or_local}")
    is_file = Path(path).exists()
    if not is_file and "," not in path and "@" not in path:
        raise UsageError(f"{path}: no such inventory file", fix=f"pass -i FILE.py{or_local}")
    if not is_file:
        problem = _names_problem(path, [("the host list", path.split(","), None)])
        if problem:
            raise InventoryError(problem)
    attrs = _offline_attrs(path) if offline else None
    hosts = offline_inventory(path, attrs) if attrs is not None else None
    if attrs is not None and hosts is not None:
        ignored = () if hosts or "__file__" not in attrs else _groups(path, attrs)[1]
        _check_hosts(path, hosts, ignored)
        return hosts
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    # pyinfra executes inventory files inside a state context, as its own CLI does.
    with (
        _loading(path),
        ctx_state.use(State(check_for_changes=False)),
        _checking_groups(path, attrs) as seen,
    ):
        inventory = make_inventory(path)
    _check_hosts(path, list(inventory), seen.ignored)
    return inventory


@contextmanager
def _loading(path: str) -> Iterator[None]:
    """Whatever loading the operator's inventory raises, as one line naming the file."""
    try:
        yield
    except InventoryError:
        raise
    except SystemExit as exc:
        raise InventoryError(
            f"{path}: the inventory called sys.exit({exc.code!r}) while loading",
            fix="an inventory only defines groups of hosts; remove the exit",
        ) from None
    except Exception as exc:
        raise InventoryError(
            f"{path}: cannot load the inventory: {_cause(exc, path)}",
            fix="fix the inventory file (a group is a module-level list of names or "
            "(name, data) tuples; see inventories/example.py)",
        ) from None


def _check_hosts(path: str, hosts: Sequence[Any], ignored: Sequence[str]) -> None:
    if not hosts:
        shown = ", ".join(ignored) if ignored else "none"
        raise InventoryError(
            f"{path}: no hosts (a group is a module-level list of names or (name, data) "
            f"tuples; variables that are not: {shown}; see inventories/example.py)"
        )
    for host in hosts:
        _check_connection_data(path, host)


# --- the offline reader: pyinfra's inventory semantics without pyinfra --------------------------


class OfflineData:
    """A host's data as pyinfra's HostData gives it: its own (from its (name, data) tuples),
    then its groups' in the order it was listed in them (a later group wins), then the all
    group's."""

    __slots__ = ("_merged",)

    def __init__(self, merged: dict[str, Any]) -> None:
        self._merged = merged

    def get(self, key: str, default: Any = None) -> Any:
        if key in self._merged:
            return copy.copy(self._merged[key])  # pyinfra hands out shallow copies too
        return default

    def dict(self) -> dict[str, Any]:
        return dict(self._merged)


class OfflineHost:
    """A host of an inventory read without pyinfra: what plan --offline reads of pyinfra's Host
    (its name, its groups, its data)."""

    __slots__ = ("data", "groups", "name")

    def __init__(self, name: str, groups: list[str], data: OfflineData) -> None:
        self.name = name
        self.groups = groups
        self.data = data

    def __repr__(self) -> str:
        return f"OfflineHost({self.name})"


def _offline_attrs(path: str) -> dict[str, Any] | None:
    """The inventory file's module-level names, executed as pyinfra's exec_file does, checked as
    _checking_groups checks them; a host list's names as the group all. None where only pyinfra
    can read it: a group_data folder beside it (its files may read pyinfra's inventory context),
    or a file that fails outside pyinfra's state context (pyinfra then says why)."""
    if not Path(path).exists():
        return {"all": path.split(",")}
    if (Path(path).parent.resolve() / "group_data").exists():
        return None
    attrs: dict[str, Any] = {"__file__": path}
    try:
        code = compiled(Path(path).read_text(encoding="utf-8"), path)
        exec(code, attrs)
    except (Exception, SystemExit):
        return None
    groups, _ = _groups(path, attrs)
    problem = _names_problem(path, groups)
    if problem:
        raise InventoryError(problem)
    return attrs


def compiled(text: str, path: str) -> types.CodeType:
    """compile(text, path, "exec"), its bytecode kept as Python keeps a module's: an inventory
    of 10,000 hosts is 3 MB of source that takes 0.5 s to compile and 10 ms to load compiled.
    One file per inventory path in this machine's state (hub.controller_state_dir()/inventory,
    0700), taken only when it names this source's sha256 and this interpreter's bytecode magic,
    and when this user alone can write it; written to a temporary name and renamed. A cache
    that cannot be read or written is passed by: the source is compiled."""
    import hashlib
    import importlib.util
    import marshal
    import os
    import stat

    from tensorless_deploy.hub import controller_state_dir

    data = text.encode("utf-8")
    head = importlib.util.MAGIC_NUMBER + hashlib.sha256(data).digest()
    where = Path(controller_state_dir()) / "inventory"
    cached = where / (hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest() + ".pyc")
    try:
        info = cached.stat()
        mine = info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if mine and stat.S_ISREG(info.st_mode):
            blob = cached.read_bytes()
            if blob.startswith(head):
                code = marshal.loads(blob[len(head) :])
                if isinstance(code, types.CodeType) and code.co_filename == path:
                    return code
    except (OSError, ValueError, EOFError, TypeError):
        pass
    code = compile(text, path, "exec")
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(head + marshal.dumps(code))
        os.replace(tmp, cached)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: no half-written file left behind
    return code


def _is_pyinfra_group(key: str, value: Any) -> bool:
    """pyinfra_cli.inventory._is_inventory_group, without its log lines."""
    if key.startswith("_") or not isinstance(value, (list, tuple)):
        return False
    hosts = value[0] if isinstance(value, tuple) else value
    return all(isinstance(item, (str, tuple)) for item in hosts)


def offline_inventory(path: str, attrs: dict[str, Any]) -> list[OfflineHost] | None:
    """The hosts pyinfra_cli.inventory.make_inventory_from_files and pyinfra's Inventory make of
    an inventory file's names (attrs), in pyinfra's order, with pyinfra's groups and data, in
    time linear in the hosts (pyinfra's is quadratic: each host is looked up in a list of all
    the hosts and of each group's, 4.9 s at 10,000). None where pyinfra's reading is not this
    one: a connector (@local, @docker/...) among the hosts, or a value pyinfra takes as a group
    that the tool's checks do not (tests/test_inventory.py holds both to the same answers)."""
    groups = _pyinfra_groups(path, attrs)
    if groups is None:
        return None
    all_hosts, all_data = _members(groups.pop("all")) if "all" in groups else (_every(groups), {})
    if "__file__" in attrs:  # the file's name is a group of every host, unless a group has it
        file_group = Path(path).name.rsplit(".", 1)[0]
        if file_group != "all" and file_group not in groups:
            groups[file_group] = all_hosts
    group_data: dict[str, dict[str, Any]] = {}
    own: dict[str, dict[str, Any]] = {}
    member_of: dict[str, list[str]] = {}
    for group, value in groups.items():
        members, group_data[group] = _members(value)
        for host in members:
            own.setdefault(_name(host), {}).update(_data(host))
            member_of.setdefault(_name(host), []).append(group)
    for host in all_hosts:  # the all group's tuples last: they win over the groups' tuples
        own.setdefault(_name(host), {}).update(_data(host))
    out: dict[str, OfflineHost] = {}
    for name in map(_name, all_hosts):
        if name.startswith("@"):
            return None
        names = member_of.get(name, [])
        merged = dict(all_data)  # lowest first: all's data, each group's in order, the host's
        for group in names:
            merged.update(group_data[group])
        merged.update(own[name])
        out[name] = OfflineHost(name, names, OfflineData(merged))
    return list(out.values())


def _pyinfra_groups(path: str, attrs: dict[str, Any]) -> dict[str, Any] | None:
    """The module-level values pyinfra takes as groups, in the file's order (a host list: its
    names as the group all); None when one of them is not a group the tool's checks passed."""
    if "__file__" not in attrs:
        return {"all": attrs["all"]}
    checked = {key for key, _, _ in _groups(path, attrs)[0]}
    groups = {key: value for key, value in attrs.items() if _is_pyinfra_group(key, value)}
    return groups if set(groups) <= checked else None


def _members(group: Any) -> tuple[list[Any], dict[str, Any]]:
    """A group's hosts and its data: a list, or a (hosts, data) tuple."""
    if isinstance(group, tuple):
        return group[0], group[1]
    return group, {}


def _every(groups: dict[str, Any]) -> list[str]:
    """pyinfra's all group when the file has none: every host once, in the order first listed."""
    return list(dict.fromkeys(_name(h) for g in groups.values() for h in _members(g)[0]))


def _data(host: Any) -> dict[str, Any]:
    data: dict[str, Any] = host[1] if isinstance(host, tuple) else {}
    return data


def _name(host: Any) -> str:
    name: str = host[0] if isinstance(host, tuple) else host
    return name


def _check_connection_data(path: str, host: Any) -> None:
    """pyinfra's connection values that it would take wrong without a word: an ssh_port
    beyond 65535 wraps around in the socket call (99999 connects to 34463)."""
    port = host.data.get("ssh_port")
    if port is None:
        return
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise InventoryError(
            f"{path}: {host.name}: ssh_port: must be a port number 1-65535 (got {port!r})",
            fix="correct ssh_port in the inventory",
        )


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _cause(exc: BaseException, path: str) -> str:
    """What went wrong, in the operator's file where the traceback says so."""
    cause: BaseException = getattr(exc, "exception", None) or exc.__cause__ or exc
    where = ""
    if isinstance(cause, SyntaxError) and cause.lineno:
        where = f"line {cause.lineno}: "
    else:
        tb = cause.__traceback__
        while tb is not None:
            if Path(tb.tb_frame.f_code.co_filename).resolve() == Path(path).resolve():
                where = f"line {tb.tb_lineno}: "
            tb = tb.tb_next
    return where + _one_line(f"{type(cause).__name__}: {cause}")


class _Seen:
    ignored: tuple[str, ...] = ()


@contextmanager
def _checking_groups(path: str, executed: dict[str, Any] | None = None) -> Iterator[_Seen]:
    """Check the inventory file's module-level values as pyinfra reads them (it executes the
    file once, through pyinfra_cli.inventory.exec_file): refuse a group pyinfra would skip or
    misread, and a host listed twice; note what is ignored. A file already executed (executed:
    its names, by _offline_attrs) is not executed again."""
    import pyinfra_cli.inventory as cli_inventory

    seen = _Seen()
    original = getattr(cli_inventory, "exec_file", None)
    if original is None or not Path(path).is_file():
        yield seen
        return
    target = Path(path).resolve()

    def exec_file(filename: str, return_locals: bool = False, is_deploy_code: bool = False) -> Any:
        if executed is not None and return_locals and Path(filename).resolve() == target:
            attrs = executed
        else:
            attrs = original(filename, return_locals=return_locals, is_deploy_code=is_deploy_code)
        if return_locals and isinstance(attrs, dict) and Path(filename).resolve() == target:
            groups, seen.ignored = _groups(path, attrs)
            problem = _names_problem(path, groups)
            if problem:
                raise InventoryError(problem)
        return attrs

    cli_inventory.exec_file = exec_file
    try:
        yield seen
    finally:
        cli_inventory.exec_file = original


Group = tuple[str, Sequence[object], "dict[str, object] | None"]


def _groups(path: str, attrs: dict[str, Any]) -> tuple[list[Group], tuple[str, ...]]:
    """The inventory's groups as pyinfra takes them; a value that looks meant as a group but
    that pyinfra would skip or misread raises InventoryError naming the variable."""

    def refuse(key: str, why: str) -> InventoryError:
        return InventoryError(
            f"{path}: {key}: {why}",
            fix='write a group as a list: gpus = ["host", ("host2", {"ssh_user": "root"})]',
        )

    groups: list[Group] = []
    ignored: list[str] = []
    for key, value in attrs.items():
        if key.startswith("_") or isinstance(value, (types.ModuleType, type)) or callable(value):
            continue
        if isinstance(value, list):
            if value and not any(isinstance(v, (str, tuple)) for v in value):
                ignored.append(f"{key} (a list of no hosts)")  # a helper, such as ports
                continue
            groups.append((key, value, None))
        elif isinstance(value, tuple):
            if len(value) == 2 and isinstance(value[0], list) and isinstance(value[1], dict):
                groups.append((key, value[0], value[1]))
            elif value and all(isinstance(v, (str, tuple)) for v in value):
                raise refuse(key, "is a tuple of hosts, which pyinfra reads as (hosts, data)")
            else:
                ignored.append(f"{key} ({type(value).__name__})")
        elif isinstance(value, (set, frozenset)) and value:
            raise refuse(key, f"is a {type(value).__name__} of hosts, which pyinfra skips")
        elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            raise refuse(key, "is a dict of hosts, which pyinfra skips")
        elif isinstance(value, types.GeneratorType):
            raise refuse(key, "is a generator, which pyinfra skips")
        else:
            ignored.append(f"{key} ({type(value).__name__})")
    for key, hosts, _ in groups:
        for n, host in enumerate(hosts):
            if isinstance(host, str):
                continue
            ok = (
                isinstance(host, tuple)
                and len(host) == 2
                and isinstance(host[0], str)
                and isinstance(host[1], dict)
            )
            if not ok:
                raise refuse(
                    f"{key}[{n}]",
                    f"a host is a name or a (name, data) tuple, not {_shown(host)}",
                )
    return groups, tuple(ignored)


def _shown(value: object) -> str:
    text = repr(value)
    return (text if len(text) <= 60 else text[:60] + "...") + f" ({type(value).__name__})"


def _names_problem(path: str, groups: Sequence[Group]) -> str | None:
    """A host name pyinfra cannot use, one listed twice in a group, or one given its data in
    two places (pyinfra would keep one of them without a word)."""
    with_data: dict[str, tuple[str, object]] = {}
    for key, hosts, _ in groups:
        names: set[str] = set()
        for host in hosts:
            name, data = (host[0], host[1]) if isinstance(host, tuple) else (host, None)
            if not isinstance(name, str):
                continue
            shown = json.dumps(name, ensure_ascii=True)
            if not name.strip() or any(c.isspace() or not c.isprintable() for c in name):
                return f"{path}: {key}: host name {shown} must be one word of printable text"
            if "/" in name:
                # a host name names files of its own (logs, staging) and a report's rows
                return (
                    f"{path}: {key}: host name {shown} has a '/': name the host without one "
                    "(its address goes in ssh_hostname)"
                )
            if name in names:
                return f"{path}: {key}: host {shown} is listed twice; list it once"
            names.add(name)
            if data:
                first = with_data.setdefault(name, (key, data))
                if first[0] != key and first[1] != data:
                    return (
                        f"{path}: host {shown} has its own data in {first[0]} and in {key}; "
                        "give its data once (pyinfra would keep only one)"
                    )
    return None


def select_hosts(inventory: Any, limit: Sequence[str]) -> list[Any]:
    hosts = list(inventory)
    if not limit:
        return hosts
    names = {h.name for h in hosts}
    unknown = [n for n in limit if n not in names]
    if unknown:
        raise UsageError(
            f"--limit {', '.join(unknown)}: not in the inventory "
            f"(hosts: {', '.join(sorted(names))})"
        )
    return [h for h in hosts if h.name in limit]


def _options_shared(host: Any, flags: Flags, resolved: dict[str, Options]) -> Options:
    """options_for(host, flags), the same Options object for hosts with the same settings (their
    tensorless_* data but the GPUs, compared as JSON); data that is not plain JSON is resolved
    on its own."""
    data = host_data(host)
    data.pop(DATA_GPUS, None)
    try:
        key = json.dumps(data, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return options_for(host, flags)
    options = resolved.get(key)
    if options is None:
        options = resolved[key] = options_for(host, flags)
    return options


def offline_hosts(hosts: Sequence[Any], flags: Flags) -> list[SurveyedHost]:
    """Host facts from inventory data (tensorless_gpus), without connecting; data of the wrong
    shape is an inventory error naming the host and the key."""
    from tensorless_deploy.facts import host_facts_from_inventory
    from tensorless_deploy.facts.survey import InventoryDataError

    out = []
    # A fleet lists the same machine many times: equal data gives one HostFacts, read once and
    # shared, and equal settings one Options (the planner's rows for equal facts and options
    # are then found by identity, not compared). Only a host's errors name it, so the options
    # resolved for one host's settings are the options of any host with the same settings.
    read: dict[str, Any] = {}
    resolved: dict[str, Options] = {}
    for h in hosts:
        options = _options_shared(h, flags, resolved)
        gpus = h.data.get(DATA_GPUS) if h.data is not None else None
        if gpus is None:
            why = f"--offline: no {DATA_GPUS} in its inventory data (add it, or plan over SSH)"
            out.append(SurveyedHost(h.name, options, None, why))
            continue
        try:
            key = json.dumps(gpus, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError):  # not plain data: read (and refused) on its own
            key = None
        facts = read.get(key) if key is not None else None
        if facts is None:
            try:
                facts = host_facts_from_inventory({"gpus": gpus})
            except InventoryDataError as exc:
                where = DATA_GPUS + exc.key.removeprefix("gpus")
                raise InventoryError(f"{h.name}: {where}: {exc.why}", fix=exc.fix) from None
            if key is not None:
                read[key] = facts
        out.append(SurveyedHost(h.name, options, facts))
    return out
