"""plan --offline reads inventories without pyinfra (fleet.inventory.offline_inventory): the same
hosts, in the same order, with the same groups and the same data (pyinfra's precedence: the
host's own, then its groups' in order, then the all group's) as pyinfra's loader, and an offline
plan imports neither pyinfra nor paramiko, gevent or numpy."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.errors import InventoryError
from tensorless_deploy.fleet.inventory import OfflineHost, load_inventory
from tests.recipe_tools import example, write_recipe

REPO = Path(__file__).resolve().parent.parent
P100 = {"name": "Tesla P100-PCIE-16GB", "compute_cap": "6.0", "memory_total_mib": 16384}


def _seen(hosts: Any) -> list[tuple[str, list[str], dict[str, Any], dict[str, Any]]]:
    out = []
    for h in hosts:
        every = h.data.dict()
        out.append((h.name, list(h.groups), every, {k: h.data.get(k) for k in every}))
    return out


def _both(path: str) -> tuple[list[Any], list[Any]]:
    fast = load_inventory(path, False, offline=True)
    assert isinstance(fast, list) and all(isinstance(h, OfflineHost) for h in fast)
    return _seen(fast), _seen(load_inventory(path, False))


PRECEDENCE = """
import os  # a module: ignored, as pyinfra ignores it
_private = ["hidden"]
ports = [8080, 8081]  # a helper list of no hosts
web = (["a", ("b", {"tensorless_port": 9001, "ssh_user": "b-own"}), "c"],
       {"ssh_user": "web", "tensorless_bind": "0.0.0.0", "shared": "web"})
db = (["c", "d"], {"ssh_user": "db", "shared": "db", "only_db": 1})
gpus = ["a", "e", ("f", {"tensorless_gpus": [{"name": "x", "compute_cap": "6.0"}]})]
empty = []
"""

WITH_ALL = """
all = (["z", "a", ("b", {"own": 1})], {"ssh_user": "everyone", "level": "all"})
first = (["a", "b", "extra"], {"level": "first"})
second = (["b"], {"level": "second", "ssh_port": 2222})
"""

FILE_GROUP = """
site = (["a"], {"level": "site"})
other = ["a", "b"]
"""


@pytest.mark.parametrize(
    ("name", "text"),
    [("precedence.py", PRECEDENCE), ("with_all.py", WITH_ALL), ("site.py", FILE_GROUP)],
)
def test_the_offline_reader_agrees_with_pyinfra(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    fast, slow = _both(str(path))
    assert fast == slow and fast


def test_the_offline_reader_agrees_on_precedence_as_pyinfra_states_it(tmp_path: Path) -> None:
    """The host's own data wins over its groups', a later group over an earlier one, every
    group over the all group's; the file's name is a group of every host."""
    path = tmp_path / "with_all.py"
    path.write_text(WITH_ALL, encoding="utf-8")
    (fast, _) = _both(str(path))
    by_name = {name: (groups, data) for name, groups, data, _ in fast}
    assert [name for name, *_ in fast] == ["z", "a", "b"]  # all's hosts, all's order
    assert by_name["b"][0] == ["first", "second", "with_all"]
    assert by_name["b"][1]["level"] == "second" and by_name["b"][1]["own"] == 1
    assert by_name["a"][1]["level"] == "first" and by_name["z"][1]["level"] == "all"
    assert by_name["z"][1]["ssh_user"] == "everyone"


def test_the_offline_reader_agrees_on_the_repos_inventories_and_a_generated_fleet(
    tmp_path: Path,
) -> None:
    for path in sorted((REPO / "inventories").glob("*.py")):
        fast, slow = _both(str(path))
        assert fast == slow and fast, path
    rnd = random.Random(3)
    groups: dict[str, list[Any]] = {f"g{i}": [] for i in range(7)}
    data: dict[str, dict[str, Any]] = {f"g{i}": {"k": i, f"only{i}": i} for i in range(0, 7, 2)}
    for n in range(600):
        host: Any = f"node{n:04d}"
        member = rnd.sample(sorted(groups), rnd.randint(1, 3))
        for g in member:
            groups[g].append(host)
        if n % 5 == 0:  # its own data, in one group only (the tool refuses it in two)
            own = {"tensorless_port": 8000 + n, "k": -n, "tensorless_gpus": [{**P100}]}
            groups[member[0]][-1] = (host, own)
    lines = [
        f"{g} = ({hosts!r}, {data[g]!r})" if g in data else f"{g} = {hosts!r}"
        for g, hosts in groups.items()
    ]
    path = tmp_path / "fleet.py"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fast, slow = _both(str(path))
    assert fast == slow and len(fast) == 600
    fast, slow = _both("one,two,three")  # a host list
    assert fast == slow and [n for n, *_ in fast] == ["one", "two", "three"]


def test_what_only_pyinfra_reads_goes_through_pyinfra(tmp_path: Path) -> None:
    """A connector among the hosts, or a group_data folder beside the file: pyinfra's own
    loader, with its answers."""
    connector = tmp_path / "connector.py"
    connector.write_text('hosts = ["@local"]\n', encoding="utf-8")
    loaded = load_inventory(str(connector), False, offline=True)
    assert not isinstance(loaded, list) and [h.name for h in loaded] == ["@local"]
    folder = tmp_path / "with_group_data"
    (folder / "group_data").mkdir(parents=True)
    (folder / "group_data" / "gpus.py").write_text("tensorless_port = 9100\n", encoding="utf-8")
    (folder / "inv.py").write_text('gpus = ["a"]\n', encoding="utf-8")
    loaded = load_inventory(str(folder / "inv.py"), False, offline=True)
    assert not isinstance(loaded, list)
    assert [h.data.get("tensorless_port") for h in loaded] == [9100]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('gpus = ["a", "a"]\n', "listed twice"),
        ('gpus = ("a", "b")\n', "tuple of hosts"),
        ("gpus = {'a', 'b'}\n", "set of hosts"),
        ("x = 1\n", "no hosts"),
        ("raise RuntimeError('boom')\n", "line 1: RuntimeError: boom"),
        ("import sys; sys.exit(3)\n", "sys.exit(3)"),
        ('gpus = [("a", {"ssh_port": 99999})]\n', "ssh_port"),
    ],
)
def test_the_offline_reader_refuses_what_pyinfras_path_refuses(
    tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "inv.py"
    path.write_text(text, encoding="utf-8")
    errors = []
    for offline in (True, False):
        with pytest.raises(InventoryError) as caught:
            load_inventory(str(path), False, offline=offline)
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and needle in errors[0], errors


# the command exits through cli.leave, which runs the atexit functions and nothing after them
PROBE = (
    "import atexit, json, sys, runpy; sys.argv = ['tensorless-deploy', *sys.argv[1:]]\n"
    "def said():\n"
    "    heavy = sorted({m.split('.')[0] for m in sys.modules} & "
    "{'pyinfra', 'pyinfra_cli', 'paramiko', 'gevent', 'numpy'})\n"
    "    print('IMPORTED', json.dumps(heavy), file=sys.stderr)\n"
    "atexit.register(said)\n"
    "runpy.run_module('tensorless_deploy', run_name='__main__')\n"
)


def test_an_offline_plan_imports_no_ssh_stack(tmp_path: Path) -> None:
    """No pyinfra, paramiko, gevent (and its patching) or numpy (the gguf package's __init__):
    an offline plan opens no connection and reads headers itself."""
    write_recipe(tmp_path / "recipes", example())
    name = example()["model"]["name"]
    inventory = tmp_path / "inv.py"
    inventory.write_text(
        f"hosts = [('p100', {{'tensorless_gpus': [{P100!r}]}})]\n", encoding="utf-8"
    )
    with socket.socket() as closed:  # bound, never listening: the header read fails at once
        closed.bind(("127.0.0.1", 0))
        env = {
            **os.environ,
            "HF_ENDPOINT": f"http://127.0.0.1:{closed.getsockname()[1]}",
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "HF_TOKEN": "",
            "NO_COLOR": "1",
        }
        argv = ["plan", "--offline", "--json", "-i", str(inventory)]
        argv += ["--recipes", str(tmp_path / "recipes"), name]
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, *argv],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env=env,
        )
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert [p["host"] for m in doc["models"] for p in m["placements"]] == ["p100"]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("IMPORTED "))
    assert json.loads(line.removeprefix("IMPORTED ")) == []


def test_offline_hosts_with_the_same_settings_share_one_options_and_one_facts(
    tmp_path: Path,
) -> None:
    """Equal settings give one Options object and equal GPUs one HostFacts (the planner then
    finds equal hosts by identity); other settings their own; a bad value still names the
    host that has it."""
    from tensorless_deploy.decisions.options import Flags
    from tensorless_deploy.fleet.inventory import offline_hosts, select_hosts

    inventory = tmp_path / "inv.py"
    rows = [
        ("a", {"tensorless_gpus": [P100]}),
        ("b", {"tensorless_gpus": [P100]}),
        ("c", {"tensorless_gpus": [P100], "tensorless_port": 9000}),
        ("d", {"tensorless_gpus": [{**P100, "memory_used_mib": 100}], "tensorless_port": 9000}),
    ]
    inventory.write_text(f"hosts = {rows!r}\n", encoding="utf-8")
    hosts = offline_hosts(
        select_hosts(load_inventory(str(inventory), False, offline=True), []), Flags()
    )
    a, b, c, d = hosts
    assert a.options is b.options and a.facts is b.facts
    assert c.options is d.options and c.options is not a.options
    assert (a.options.port, c.options.port) == (8080, 9000)
    assert c.facts is a.facts and d.facts is not a.facts
    rows.append(("e", {"tensorless_gpus": [P100], "tensorless_port": 99999}))
    inventory.write_text(f"hosts = {rows!r}\n", encoding="utf-8")
    with pytest.raises(InventoryError, match=r"^e: tensorless_port: "):
        offline_hosts(
            select_hosts(load_inventory(str(inventory), False, offline=True), []), Flags()
        )


def test_an_inventory_is_compiled_once_and_its_bytecode_kept_for_this_user_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fleet.inventory.compiled keeps an inventory's bytecode in this machine's state: taken
    only for the same source, the same path and a file only this user can write; an edited
    inventory is compiled again."""
    import hashlib
    import importlib.util
    import marshal

    from tensorless_deploy.fleet.inventory import compiled

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = str(tmp_path / "inv.py")

    def value(text: str) -> object:
        names: dict[str, object] = {}
        exec(compiled(text, path), names)
        return names["hosts"]

    assert value("hosts = ['a']\n") == ["a"]
    where = tmp_path / "cache" / "tensorless-deploy" / "inventory"
    (kept,) = where.iterdir()
    assert where.stat().st_mode & 0o777 == 0o700 and kept.stat().st_mode & 0o777 == 0o600
    assert value("hosts = ['a', 'b']\n") == ["a", "b"]  # edited: compiled again, kept instead
    assert len(list(where.iterdir())) == 1

    # a kept file is what is run: one made for this source but holding other code proves it
    text = "hosts = ['real']\n"
    head = importlib.util.MAGIC_NUMBER + hashlib.sha256(text.encode()).digest()
    kept.write_bytes(head + marshal.dumps(compile("hosts = ['kept']\n", path, "exec")))
    assert value(text) == ["kept"]
    # ... unless another user could have written it: then the source is compiled
    kept.write_bytes(head + marshal.dumps(compile("hosts = ['kept']\n", path, "exec")))
    kept.chmod(0o620)
    assert value(text) == ["real"]
    # ... or it was made for another path (its tracebacks would name another file)
    other = compile("hosts = ['kept']\n", str(tmp_path / "other.py"), "exec")
    kept.write_bytes(head + marshal.dumps(other))
    kept.chmod(0o600)
    assert value(text) == ["real"]
