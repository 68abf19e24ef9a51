"""Capture a pyinfra fact scenario from a real test host: the fact's command run by pyinfra itself.

    TL_SET=3 .venv/bin/python -m tests.pyinfra_facts.capture HOST FACT NAME "what it shows" \
        [--args '{"path": "/etc/..."}'] [--profile no-driver]

connects to HOST of the set's hosts.json with pyinfra's own SSH connector (as root), runs
``FACT().command(**args)`` through ``host.run_shell_command`` exactly as pyinfra's fact gathering
does, and writes tests/pyinfra_facts/FACT/NAME.json with the stdout lines pyinfra got, the value
``process()`` makes of them (or pyinfra's default when there was no output), and the command
(its survey section names, its script's name, or else its text). Review the
scenario before committing it: the value is the code's answer today, the output is the host's.
"""

from __future__ import annotations

import argparse
import json
import logging
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic_core import to_jsonable_python

from tensorless_deploy.facts import pyinfra as facts
from tests.hosts.harness import Host, apply_profile, load_hosts_json

HERE = Path(__file__).parent
SECTION_PREFIX = "echo '@@td section "


def command_property(fact: Any, command: str) -> dict[str, Any]:
    """How a scenario pins the command: its survey sections, its script, or else its text."""
    sections = [
        line[len(SECTION_PREFIX) : -1]
        for line in command.splitlines()
        if line.startswith(SECTION_PREFIX)
    ]
    if sections:
        return {"sections": sections}
    for script in (resources.files("tensorless_deploy.facts") / "scripts").iterdir():
        text = script.read_text(encoding="utf-8") if script.name.endswith(".sh") else None
        # a script as it is, or bound to its parameters (shell.bind: set -u, assignments, it)
        if text is not None and (
            command == text or (command.startswith("set -u\n") and command.endswith("\n" + text))
        ):
            return {"script": script.name[: -len(".sh")]}
    return {"command": command}


def run(host: Host, command: str) -> list[str]:
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_host, ctx_state

    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
    data = {
        "ssh_hostname": host.ip,
        "ssh_user": host.user,
        "ssh_key": host.key,
        "ssh_known_hosts_file": host.known_hosts,
        "ssh_strict_host_key_checking": "yes",
    }
    inventory = Inventory(([(host.name, data)], {}))
    state = State(inventory, Config())
    target = inventory.get_host(host.name)
    with ctx_state.use(state), ctx_host.use(target):
        target.connect(raise_exceptions=True)
        try:
            ok, output = target.run_shell_command(command)
        finally:
            target.disconnect()
    if not ok:
        raise SystemExit(f"the fact's command failed on {host.name}: {output.stderr}")
    return list(output.stdout_lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("fact")
    ap.add_argument("name")
    ap.add_argument("description")
    ap.add_argument("--args", default="{}")
    ap.add_argument("--profile", help="apply this GPU stand-in profile first (restored after)")
    opts = ap.parse_args()
    hosts = {h["name"]: Host.from_json(h) for h in load_hosts_json()["hosts"]}
    host = hosts[opts.host]
    fact = getattr(facts, opts.fact)()
    args = json.loads(opts.args)
    command = fact.command(**args)
    if opts.profile:
        apply_profile(host, opts.profile)
    try:
        lines = run(host, command)
    finally:
        if opts.profile:
            apply_profile(host, str(host.extra.get("default_profile", host.profile)))
    value = fact.process(lines) if lines else fact.default()
    profile = f", GPU stand-in profile {opts.profile or host.profile}"
    case = {
        "description": (
            f"REAL: captured from test host {host.name} (Debian {host.suite}, podman "
            f"{host.podman_version}{profile}) by tests/pyinfra_facts/capture.py: "
            + opts.description
        ),
        "args": args,
        **command_property(fact, command),
        "output": lines,
        "fact": json.loads(json.dumps(to_jsonable_python(value))),
    }
    out = HERE / opts.fact / f"{opts.name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(case, indent=2) + "\n", encoding="utf-8")
    print(out)


if __name__ == "__main__":
    main()
