"""deploy() in a process of its own, counting what it costs each host: every SSH command pyinfra
runs (facts and operations), every @deploy added, and each look-up of the Hub token. Prints one
JSON document. A process of its own because pyinfra's inventory loader patches the process
for gevent, which a test process with threads of its own must not inherit.

    python -m tests.count_deploy INVENTORY RECIPES [--dry-run] [HOST ...]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("inventory")
    ap.add_argument("recipes", type=Path)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("hosts", nargs="*")
    a = ap.parse_args()

    from tensorless_deploy.fleet.deploy import DeployRequest, deploy
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.recipe import load_catalog

    inventory = load_inventory(a.inventory, False)  # imports pyinfra_cli: gevent's patches
    from pyinfra.connectors.ssh import SSHConnector

    api_deploy = importlib.import_module("pyinfra.api.deploy")  # the module, not its function
    commands: Counter[str] = Counter()
    deploys: Counter[str] = Counter()
    tokens = [0]
    run, add = SSHConnector.run_shell_command, api_deploy.add_deploy

    def counted_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        commands[self.host.name] += 1
        return run(self, *args, **kwargs)

    def counted_add(state: Any, *args: Any, **kwargs: Any) -> Any:
        deploys[kwargs["host"].name] += 1
        return add(state, *args, **kwargs)

    def token() -> str | None:
        tokens[0] += 1
        return None

    setattr(SSHConnector, "run_shell_command", counted_run)  # noqa: B010
    setattr(api_deploy, "add_deploy", counted_add)  # noqa: B010
    hosts = select_hosts(inventory, a.hosts)
    request = DeployRequest("tiny", dry=a.dry_run, token_source=token)
    results = deploy(inventory, hosts, load_catalog(a.recipes), request)
    json.dump(
        {
            "results": {
                r.host: {
                    "outcome": r.outcome,
                    "ok": r.ok,
                    "addresses": list(r.addresses),
                    "steps": {s.name: s.outcome for s in r.steps},
                }
                for r in results
            },
            "commands": dict(commands),
            "deploys": dict(deploys),
            "tokens": tokens[0],
        },
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
