"""The playground: the test hosts as a small fleet every example of docs/ runs against as written.

Run through tests/hosts/playground.sh, which boots the hosts first (tests/hosts/setup.sh). This
part, on hosts that are up (BASE/hosts.json):

* resets every host to pristine (harness.reset_host: units, containers, models of an earlier
  session go; pulled images stay as a cache) and gives legacy1 the ``mixed`` profile (two P100s
  and a T4), so the fleet is the one docs/doctor.md shows: gpu1 one P100, gpu2 one H200, legacy1
  two P100s and a T4 on podman 4.3 without quadlet, and ``ghost``, an address nobody answers;
* writes ``BASE/playground/inventory.py`` (those four hosts, each with the set's SSH key and
  known_hosts) and ``BASE/playground/recipes`` (the tiny test recipe, ``tiny``:
  tests/hosts/fleet.py ``tiny_recipe``);
* starts the Hugging Face compatible model server (tests/hosts/hf_server.py) in the background
  on the set's gateway, port ``TL_HF_PORT`` (default 8765), serving the tiny GGUF at its pinned
  commit, its PID in ``BASE/run/hf-server.pid`` (teardown.sh stops every ``BASE/run/*.pid``),
  its log ``BASE/logs/hf-server.log``; one already running from an earlier playground is
  stopped first;
* prints on stdout only the environment to export (``HF_ENDPOINT``, ``INV``, ``RECIPES``,
  ``REGISTRY``, the set's plain-HTTP registry, and ``PATH`` with this checkout's venv first),
  so ``eval "$(bash tests/hosts/playground.sh)"`` works; everything else goes to stderr.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.hosts.fleet import (
    TINY_COMMIT,
    TINY_README,
    TINY_REPO,
    tiny_recipe,
    write_catalog,
    write_inventory,
)
from tests.hosts.harness import (
    Host,
    apply_profile,
    base_dir,
    load_hosts,
    load_hosts_json,
    reset_host,
)

REPO = Path(__file__).resolve().parents[2]
HOSTS = ("gpu1", "gpu2", "legacy1")  # + ghost: the fleet of docs/doctor.md
PROFILES = {"legacy1": "mixed"}  # the others keep their default (gpu1 p100, gpu2 h200)


def say(*words: object) -> None:
    print("playground:", *words, file=sys.stderr, flush=True)


def pid_file(base: Path) -> Path:
    return base / "run" / "hf-server.pid"


def stop_model_server(base: Path) -> None:
    """Stop the model server an earlier playground started (its PID file), if it still runs."""
    f = pid_file(base)
    try:
        pid = int(f.read_text().strip())
    except (OSError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    f.unlink(missing_ok=True)


def start_model_server(base: Path, gateway: str, port: int, gguf: Path, name: str) -> str:
    """tests/hosts/hf_server.py in the background, detached, serving the tiny GGUF."""
    repo_dir = base / "playground" / "hf" / TINY_REPO
    repo_dir.mkdir(parents=True, exist_ok=True)
    (repo_dir / name).unlink(missing_ok=True)
    (repo_dir / name).symlink_to(gguf)
    (repo_dir / "README.md").write_bytes(TINY_README)
    log = (base / "logs" / "hf-server.log").open("ab")
    argv = [
        sys.executable,
        str(REPO / "tests" / "hosts" / "hf_server.py"),
        "--host",
        gateway,
        "--port",
        str(port),
        "--repo",
        f"{TINY_REPO}={repo_dir}",
        "--commit",
        TINY_COMMIT,
    ]
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
    )
    pid_file(base).write_text(f"{proc.pid}\n")
    url = f"http://{gateway}:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/models/{TINY_REPO}", timeout=2) as r:
                if r.status == 200:
                    return url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(
                f"playground: the model server did not start on {url} "
                f"(exit {proc.poll()}; log {base / 'logs' / 'hf-server.log'})"
            )
        time.sleep(0.2)


def apply_profiles(hosts: dict[str, Host]) -> None:
    """The playground's GPU profiles (the docs tests call it after each host reset)."""
    for name, profile in PROFILES.items():
        apply_profile(hosts[name], profile)


def ready_hosts(hosts: dict[str, Host]) -> None:
    """Every host pristine, then the playground's profiles."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        list(pool.map(reset_host, hosts.values()))
    apply_profiles(hosts)


def main() -> int:
    base = base_dir()
    hosts_json = load_hosts_json(base)
    hosts = load_hosts(base)
    missing = [n for n in HOSTS if n not in hosts]
    if missing:
        say(f"no host {', '.join(missing)} in {base}/hosts.json: run tests/hosts/setup.sh 2")
        return 1
    t0 = time.monotonic()
    say("resetting the hosts; legacy1 gets the mixed profile (2x P100 + T4)")
    ready_hosts(hosts)
    work = base / "playground"
    work.mkdir(parents=True, exist_ok=True)
    inventory = write_inventory(work / "inventory.py", [hosts[n] for n in HOSTS], unreachable=True)
    recipes = work / "recipes"
    write_catalog(recipes, tiny_recipe(hosts_json, TINY_COMMIT))
    stop_model_server(base)
    g = hosts_json["tiny_gguf"]
    port = int(os.environ.get("TL_HF_PORT", "8765"))
    url = start_model_server(base, hosts_json["gateway"], port, Path(g["path"]), g["hf_file"])
    say(f"inventory {inventory}: {', '.join(HOSTS)}, ghost ({hosts_json['unreachable']})")
    say(f"recipes {recipes}: tiny = {TINY_REPO} on p100 (the CPU engine, a stand-in P100)")
    say(f"model server {url} (pid {pid_file(base).read_text().strip()}, {pid_file(base)})")
    say(
        f"ready in {time.monotonic() - t0:.1f} s; stop it all with "
        f"{'TL_SET=' + str(hosts_json['set']) + ' ' if hosts_json.get('set') else ''}"
        "bash tests/hosts/teardown.sh"
    )
    venv_bin = Path(sys.executable).parent
    print(f"export HF_ENDPOINT={shlex.quote(url)}")
    print(f"export INV={shlex.quote(str(inventory))}")
    print(f"export RECIPES={shlex.quote(str(recipes))}")
    print(f"export REGISTRY={shlex.quote(hosts_json['registry'])}")
    print(f'export PATH={shlex.quote(str(venv_bin))}:"$PATH"')
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        say("needs root (the test hosts' SSH key is root's)")
        sys.exit(2)
    sys.exit(main())
