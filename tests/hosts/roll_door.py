"""deploy --serial 1, rollback or stop run in this process with a front door that records its
calls: a small real door (no balancer behind it), each call stamped with the time and with what
the instance answered then (its /health, read over HTTP from here), so a test can put the
door's calls beside the host's own events. Run as ``python -m tests.hosts.roll_door
deploy|rollback|stop INVENTORY RECIPES MODEL``; prints {"ok", "events", "hosts"} as JSON."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def health(ip: str, port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/health", timeout=5) as r:
            return int(r.status)
    except OSError:
        return 0


class RecordingDoor:
    """take_out and put_back, recorded: (what, host, port, time, /health then)."""

    def __init__(self, ips: dict[str, str]) -> None:
        self.ips = ips
        self.events: list[dict[str, Any]] = []

    def _note(self, what: str, host: str, port: int) -> None:
        code = health(self.ips[host], port)
        self.events.append(
            {"what": what, "host": host, "port": port, "t": time.time(), "health": code}
        )

    def fronts(self, host_name: str) -> bool:
        return host_name in self.ips

    def take_out(self, host_name: str, port: int, timeout_s: float) -> str | None:
        self._note("take_out", host_name, port)
        return None

    def put_back(self, host_name: str, port: int) -> str | None:
        self._note("put_back", host_name, port)
        return None


def main(command: str, inventory_path: str, recipes: str, model: str) -> int:
    from tensorless_deploy.cli.common import result_json
    from tensorless_deploy.fleet.deploy import DeployRequest, roll
    from tensorless_deploy.fleet.inventory import load_inventory, select_hosts
    from tensorless_deploy.fleet.status import rollback, stop
    from tensorless_deploy.recipe.catalog import load_catalog

    inventory = load_inventory(inventory_path, False, offers_local=False)
    hosts = select_hosts(inventory, [])
    door = RecordingDoor({h.name: str(h.data.get("ssh_hostname")) for h in hosts})
    catalog = load_catalog(Path(recipes))
    if command == "deploy":
        results = roll(inventory, hosts, catalog, DeployRequest(model, door=door), 1)
    elif command == "rollback":
        results = rollback(inventory, hosts, catalog, model, door=door)
    else:
        results = stop(inventory, hosts, catalog, model, False, door=door)
    print(
        json.dumps(
            {
                "ok": all(r.ok for r in results),
                "events": door.events,
                "hosts": [result_json(r) for r in results],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
