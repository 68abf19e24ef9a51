"""The operator's day two on real test hosts: status names what drifted and exits by it (also
for a unit edited by hand, and without the catalog that deployed it), logs shows llama-server's
own start lines per host and unit, rollback brings the previous recipe's unit back and it
serves, prune lists exactly what no unit uses and removes it while the model keeps serving."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner
from tests.recipe_tools import write_recipe

pytestmark = pytest.mark.hosts

UNIT = "tensorless-tiny-p100"
QUADLET = f"/etc/containers/systemd/{UNIT}.container"
MODELS = "/var/lib/tensorless/models"


class Day2:
    def __init__(self, tmp: Path, hosts_json: dict[str, Any], host: Host, hf: HFServer) -> None:
        self.tmp, self.hosts_json, self.host, self.hf = tmp, hosts_json, host, hf
        self.catalog = tmp / "recipes"
        self.inventory = write_inventory(tmp / "inventory.py", [host])
        self.env = {"HF_ENDPOINT": hf.url, "NO_COLOR": "1"}
        self.write()

    def write(self, **run: Any) -> dict[str, Any]:
        recipe = tiny_recipe(self.hosts_json, TINY_COMMIT, **run)
        write_catalog(self.catalog, recipe)
        return recipe

    def cli(self, *args: str, recipes: bool = True, code: int | None = 0) -> tuple[int, Any]:
        argv = [*args, "-i", str(self.inventory)]
        if recipes:
            argv += ["--recipes", str(self.catalog)]
        proc = cli(*argv, "--json", env=self.env, timeout=600)
        assert "Traceback" not in proc.stderr, proc.stderr
        if code is not None:
            assert proc.returncode == code, (args, proc.stdout, proc.stderr)
        return proc.returncode, json.loads(proc.stdout) if proc.stdout.startswith("{") else None

    def units(self, code: int = 0, recipes: bool = True) -> list[dict[str, Any]]:
        _, doc = self.cli("status", recipes=recipes, code=code)
        assert doc["exit_code"] == code
        units: list[dict[str, Any]] = doc["hosts"][0]["units"]
        return units


@pytest.fixture
def day2(tmp_path: Path, hosts_json: dict[str, Any], gpu_hosts: list[Host], hf: HFServer) -> Day2:
    return Day2(tmp_path, hosts_json, gpu_hosts[0], hf)


def _complete(ssh: SshRunner, host: str) -> dict[str, Any]:
    body = json.dumps({"prompt": "hello", "max_tokens": 4, "temperature": 0})
    out = ssh(host, f"curl -fsS -d '{body}' http://127.0.0.1:8080/v1/completions").stdout
    answer: dict[str, Any] = json.loads(out)
    return answer


def test_status_drift_by_field_edit_by_hand_and_without_the_catalog(
    day2: Day2, ssh: SshRunner
) -> None:
    day2.cli("deploy", "tiny")
    (u,) = day2.units()
    assert u["state"] == "serving" and u["drift"] == []
    # the catalog's recipe changes: the fields that differ, exit 3, until a deploy converges
    day2.write(
        args=["-np", "1", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-b", "256"],
        env={"LLAMA_LOG_COLORS": "off", "LLAMA_ARG_N_GPU_LAYERS": "99"},
    )
    (u,) = day2.units(code=3)
    fields = {d["field"]: d for d in u["drift"]}
    assert set(fields) == {"args", "env"}, u["drift"]
    assert "-b 256" in fields["args"]["wanted"] and "-b 256" not in fields["args"]["deployed"]
    assert "LLAMA_ARG_N_GPU_LAYERS=99" in fields["env"]["wanted"]
    day2.cli("deploy", "tiny")
    (u,) = day2.units()
    assert u["drift"] == [] and u["rollback_available"] is True
    # an edit by hand, daemon-reload, no restart: reported, and what it changed
    ssh(
        day2.host.name,
        f'sed -i \'s/"-c" "4096"/"-c" "2048"/\' {QUADLET} && systemctl daemon-reload',
    )
    (u,) = day2.units(code=3)
    fields = {d["field"]: d for d in u["drift"]}
    assert fields["unit"]["deployed"].startswith("edited on the host"), u["drift"]
    assert (fields["context"]["deployed"], fields["context"]["wanted"]) == ("2048", "4096")
    # without the catalog that made it: still found, still reported (the recipe is unknown)
    (u,) = day2.units(code=3, recipes=False)
    assert u["unit"] == UNIT and u["model"] == TINY_REPO and u["healthy"]
    assert {d["field"] for d in u["drift"]} >= {"recipe", "unit"}
    # down: exit 1
    ssh(day2.host.name, f"systemctl stop {UNIT}.service")
    (u,) = day2.units(code=1)
    assert u["state"] == "stopped" and not u["healthy"]
    # stop without the catalog removes what is there
    day2.cli("stop", "tiny", recipes=False)
    assert day2.units(code=4) == []  # nothing deployed: exit 4, not "all serving"


def test_status_names_access_and_secrets_when_the_key_is_removed(
    tmp_path: Path, hosts_json: dict[str, Any], gpu_hosts: list[Host], hf: HFServer
) -> None:
    """Deployed with an API key and /metrics; the key and metrics then removed from the
    inventory: status names the fields "secrets" (the key's file mount) and "access" (the
    --api-key-file and --metrics arguments), not "model", and deploy converges them."""
    key = Path(__file__).parent / "fixtures" / "secrets" / "api.key"
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    env = {"HF_ENDPOINT": hf.url, "NO_COLOR": "1"}
    keyed = {"tensorless_api_key_file": str(key), "tensorless_metrics": True}

    def run(*args: str, data: dict[str, Any]) -> dict[str, Any]:
        inv = write_inventory(tmp_path / "inventory.py", gpu_hosts[:1], data={"gpu1": data})
        proc = cli(*args, "-i", str(inv), "--recipes", str(catalog), "--json", env=env)
        assert "Traceback" not in proc.stderr, proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc

    assert run("deploy", "tiny", data=keyed)["ok"], "deploy with the key"
    doc = run("status", data={})
    assert doc["exit_code"] == 3, doc
    (u,) = doc["hosts"][0]["units"]
    fields = {d["field"]: d for d in u["drift"]}
    assert set(fields) == {"secrets", "access"}, u["drift"]
    assert "/run/tensorless/api-key" in fields["secrets"]["deployed"]
    assert "--api-key-file" in fields["access"]["deployed"]
    assert "--metrics" in fields["access"]["deployed"]
    assert "--api-key-file" not in fields["access"]["wanted"]
    assert run("deploy", "tiny", data={})["ok"]
    assert run("status", data={})["exit_code"] == 0


def test_logs_show_llama_server_start_lines_per_host_and_unit(day2: Day2) -> None:
    day2.cli("deploy", "tiny")
    proc = cli(
        "logs",
        "tiny",
        "-i",
        str(day2.inventory),
        "--recipes",
        str(day2.catalog),
        "-n",
        "200",
        env=day2.env,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith(f"{day2.host.name} {UNIT}: ") for line in lines)
    text = "\n".join(lines)
    assert "listening on http://127.0.0.1:8080" in text, text[-2000:]
    assert "model loaded" in text and f"{day2.host.name} {UNIT}: \n" not in proc.stdout
    nothing = cli("logs", "nosuch", "-i", str(day2.inventory), env=day2.env)
    assert nothing.returncode == 1 and "is not deployed here" in nothing.stderr


def test_logs_carry_each_server_line_once_and_no_podman_events(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    gpu_hosts: list[Host],
    legacy_host: Host,
    hf: HFServer,
    ssh: SshRunner,
) -> None:
    """The plain unit of podman 4.3 (legacy1) and the quadlet (gpu1): every llama-server line is
    in the journal once, and `logs -n N` shows N of the server's own lines, none of podman's
    event entries (container create, init, start, attach) nor its container ID. Ctrl-C on
    `logs --follow` is one line; a closed pipe (`logs | head -1`) no traceback."""
    hosts = [gpu_hosts[0], legacy_host]
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    inventory = write_inventory(tmp_path / "inventory.py", hosts)
    env = {"HF_ENDPOINT": hf.url, "NO_COLOR": "1"}
    # the journal outlives a host reset: count from here on
    show = "journalctl -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p'"
    cursors = {h.name: ssh(h.name, show).stdout.strip() for h in hosts}
    deployed = cli("deploy", "tiny", "-i", str(inventory), "--recipes", str(catalog), env=env)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    for h in hosts:
        # journalctl's own view, outside the tool: the start line is there exactly once
        after = f"--after-cursor '{cursors[h.name]}'" if cursors[h.name] else ""
        out = ssh(h.name, f"journalctl -u {UNIT}.service -o cat --no-pager {after}").stdout
        assert out.count("llama_server: listening on") == 1, (h.name, out[-3000:])
        assert out.count("load_model: loading model") == 1, (h.name, out[-3000:])
    proc = cli(
        *("logs", "tiny", "-i", str(inventory), "--recipes", str(catalog), "-n", "4"), env=env
    )
    assert proc.returncode == 0, proc.stderr
    for h in hosts:
        mine = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{h.name} ")]
        text = "\n".join(mine)
        assert len(mine) == 4 and len(set(mine)) == 4, (h.name, text)  # 4 lines, none twice
        assert "llama_server: listening on" in text, (h.name, text)
        assert "container create" not in text and "container attach" not in text, text
        assert not any(ln.rsplit(": ", 1)[-1].strip().isalnum() for ln in mine), text  # no ID
    # a closed pipe: the first line, then quiet
    shell = subprocess.run(
        [
            "bash",
            "-c",
            '"$0" -m tensorless_deploy logs tiny -i "$1" --recipes "$2" -n 200 | head -1',
            sys.executable,
            str(inventory),
            str(catalog),
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert len(shell.stdout.splitlines()) == 1, shell.stdout
    assert "Traceback" not in shell.stderr and "BrokenPipe" not in shell.stderr, shell.stderr
    # Ctrl-C while following: one line, exit 130
    follow = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorless_deploy",
            "logs",
            "tiny",
            "-i",
            str(inventory),
            "--recipes",
            str(catalog),
            "-n",
            "1",
            "--follow",
        ],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    first = follow.stdout.readline()  # the streams are open: lines arrive
    assert first.strip(), first
    follow.send_signal(signal.SIGINT)
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 130, (out, err)
    assert err.splitlines() == ["interrupted"], err


def test_rollback_brings_the_previous_recipe_back_and_it_serves(day2: Day2, ssh: SshRunner) -> None:
    _, first = day2.cli("deploy", "tiny")
    old = first["hosts"][0]["recipe_digest"]
    _, none = day2.cli("rollback", "tiny", code=1)
    assert "no previous unit is kept" in none["hosts"][0]["reason"]
    day2.write(context=2048)
    _, second = day2.cli("deploy", "tiny")
    new = second["hosts"][0]["recipe_digest"]
    assert new != old
    _, dry = day2.cli("rollback", "tiny", "--dry-run")
    assert dry["hosts"][0]["outcome"] == "would change"
    # what it would go back to: the kept unit's recipe, and how it differs from what runs
    (step,) = dry["hosts"][0]["steps"]
    assert step["output"] == [
        f"would go back to the unit kept from before: recipe {old[:19]} (now {new[:19]})",
        "context: 2048 -> 4096",
    ], step
    text = cli(
        *("rollback", "tiny", "-i", str(day2.inventory), "--recipes", str(day2.catalog)),
        "--dry-run",
        env=day2.env,
    )
    assert f"would go back to the unit kept from before: recipe {old[:19]}" in text.stdout
    assert '"-c" "2048"' in ssh(day2.host.name, f"cat {QUADLET}").stdout
    _, back = day2.cli("rollback", "tiny")
    assert back["hosts"][0]["outcome"] == "changed", back
    assert '"-c" "4096"' in ssh(day2.host.name, f"cat {QUADLET}").stdout
    assert _complete(ssh, day2.host.name)["model"] == TINY_REPO
    (u,) = day2.units(code=3)  # serving the previous recipe: the catalog says 2048
    assert u["recipe_digest"] == old and u["healthy"]
    assert {d["field"] for d in u["drift"]} == {"context"}
    _, again = day2.cli("rollback", "tiny")  # and back to the newer one
    assert again["hosts"][0]["outcome"] == "changed"
    (u,) = day2.units()
    assert u["recipe_digest"] == new and u["drift"] == []


def test_prune_lists_exactly_the_unused_and_keeps_serving(
    day2: Day2, ssh: SshRunner, hf: HFServer
) -> None:
    day2.cli("deploy", "tiny")
    blobs = f"{MODELS}/models--tensorless-test--tiny-llama-GGUF/blobs"
    used = ssh(day2.host.name, f"ls {blobs}").stdout.split()
    # a second model of the tool that no unit uses any more, and one that is not the tool's
    other = day2.tmp / "other"
    recipe = tiny_recipe(day2.hosts_json, TINY_COMMIT)
    recipe["model"].update(hf_repo="tensorless-test/other-GGUF", name="other")
    recipe["run"]["alias"] = "tensorless-test/other-GGUF"
    write_recipe(other, recipe)
    data = Path(day2.hosts_json["tiny_gguf"]["path"]).read_bytes()
    hf.publish(
        "tensorless-test/other-GGUF",
        {day2.hosts_json["tiny_gguf"]["hf_file"]: data},
        commit=TINY_COMMIT,
    )
    proc = cli(
        "deploy",
        "-i",
        str(day2.inventory),
        "other",
        "--recipes",
        str(other),
        "--port",
        "8090",
        env=day2.env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cli("stop", "other", "-i", str(day2.inventory), env=day2.env).returncode == 0
    unused_blob = f"{MODELS}/models--tensorless-test--other-GGUF/blobs/{used[0]}"
    assert ssh(day2.host.name, f"test -f {unused_blob}", check=False).returncode == 0
    ssh(day2.host.name, "mkdir -p /srv/keep && echo mine > /srv/keep/file")

    _, dry = day2.cli("prune", "--dry-run")
    (h,) = dry["hosts"]
    assert h["unused_models"] == [unused_blob], h
    assert h["unused_images"] == [] and h["kept_images"] == [day2.hosts_json["image"]["ref"]]
    assert h["kept_models"] == [f"{blobs}/{used[0]}"]
    assert ssh(day2.host.name, f"test -f {unused_blob}", check=False).returncode == 0

    _, done = day2.cli("prune")
    assert done["hosts"][0]["outcome"] == "changed", done
    left = ssh(day2.host.name, f"ls -A {MODELS}").stdout.split()
    assert left == ["models--tensorless-test--tiny-llama-GGUF"]
    assert ssh(day2.host.name, "cat /srv/keep/file").stdout == "mine\n"
    assert _complete(ssh, day2.host.name)["model"] == TINY_REPO
    _, again = day2.cli("prune")
    assert again["hosts"][0]["outcome"] == "unchanged"


def test_stop_and_prune_say_what_they_keep(day2: Day2, ssh: SshRunner) -> None:
    """stop --dry-run names the model file it keeps (and --purge would remove); after a stop
    without the catalog that deployed it, prune names the engine image it leaves alone (no
    unit or recipe of its catalog names the repository), and removes it given that catalog."""
    day2.cli("deploy", "tiny")
    blob = f"{MODELS}/models--tensorless-test--tiny-llama-GGUF/blobs/"
    blob += day2.hosts_json["tiny_gguf"]["sha256"]
    inv = ["-i", str(day2.inventory)]
    dry = cli("stop", "tiny", *inv, "--dry-run", env=day2.env)
    assert f"would keep the model file {blob} (--purge removes it)" in dry.stdout, dry.stdout
    purge = cli("stop", "tiny", *inv, "--recipes", str(day2.catalog), "--purge", "--dry-run")
    assert f"would remove the model file {blob}" in purge.stdout, purge.stdout
    assert ssh(day2.host.name, f"test -f {blob} && test -f {QUADLET}").returncode == 0
    assert cli("stop", "tiny", *inv, env=day2.env).returncode == 0  # the built-in catalog
    image = day2.hosts_json["image"]["ref"]
    shown = cli("prune", *inv, "--dry-run", env=day2.env)
    assert f"would remove model {blob}" in shown.stdout, shown.stdout
    # the engine image this catalog does not name is left alone and named (another test of the
    # set may have left an image of its own there too: it is named the same way)
    assert " other image(s), whose repository no unit and no recipe of the " in (shown.stdout), (
        shown.stdout
    )
    assert image.partition("@")[0] in shown.stdout
    _, doc = day2.cli("prune", "--dry-run", recipes=False)
    others = doc["hosts"][0]["other_images"]
    assert image in others and f"left alone {len(others)} other image(s)" in shown.stdout, doc
    _, done = day2.cli("prune")  # with the catalog that names the engine: removed
    names = [s["name"] for s in done["hosts"][0]["steps"]]
    assert f"remove image {image}" in names, names


KEY_FILE = Path(__file__).parent / "fixtures" / "secrets" / "api.key"


def _get(url: str, key: str | None = None) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""


def test_metrics_in_status_and_targets_that_scrape(
    tmp_path: Path, hosts_json: dict[str, Any], gpu_hosts: list[Host], hf: HFServer, ssh: SshRunner
) -> None:
    """tensorless_metrics on two hosts: one bound wide with a key (scraped with the key file),
    one on loopback (left out, said why); status shows each one's load; every target of the
    written files answers a real GET of /metrics with its job's credentials."""
    import yaml

    wide, local = gpu_hosts[0], gpu_hosts[2]  # gpu1 and gpu3: P100s (gpu2 is an H200)
    catalog = write_catalog(tmp_path / "recipes", tiny_recipe(hosts_json, TINY_COMMIT))
    data = {
        wide.name: {
            "tensorless_bind": "0.0.0.0",
            "tensorless_api_key_file": str(KEY_FILE),
            "tensorless_metrics": True,
        },
        local.name: {"tensorless_metrics": True},
    }
    inv = write_inventory(tmp_path / "inventory.py", [wide, local], data=data)
    env = {"HF_ENDPOINT": hf.url, "NO_COLOR": "1"}
    base = ["-i", str(inv), "--recipes", str(catalog)]
    proc = cli("deploy", "tiny", *base, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    key = KEY_FILE.read_text().strip()
    body = json.dumps({"prompt": "hello", "max_tokens": 4, "temperature": 0})
    ssh(
        wide.name,
        f"curl -fsS -H 'Authorization: Bearer {key}' -d '{body}' http://127.0.0.1:8080/v1/completions",
    )

    proc = cli("--json", "status", *base, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    loads = {h["host"]: h["units"][0]["metrics"] for h in json.loads(proc.stdout)["hosts"]}
    assert loads[wide.name]["tokens_predicted_total"] >= 4, loads
    assert loads[wide.name]["busy_slots"] == 0 and loads[wide.name]["tokens_per_second"] > 0
    assert loads[local.name]["tokens_predicted_total"] == 0
    text = cli("status", *base, env=env)
    assert "LOAD" in text.stdout and "0 busy, 0 queued" in text.stdout, text.stdout
    assert key not in proc.stdout + text.stdout + text.stderr

    out = tmp_path / "prometheus"
    proc = cli("targets", "-i", str(inv), "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{local.name} {UNIT}: left out: bound to 127.0.0.1" in proc.stderr
    config = yaml.safe_load((out / "scrape_configs.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": str(KEY_FILE)}
    (group,) = json.loads(Path(job["file_sd_configs"][0]["files"][0]).read_text())
    assert group["targets"] == [f"{wide.ip}:8080"]
    assert group["labels"] == {"host": wide.name, "unit": UNIT, "model": TINY_REPO, "card": "p100"}
    assert key not in "".join(p.read_text() for p in out.iterdir())
    for target in group["targets"]:
        url = f"{job['scheme']}://{target}{job['metrics_path']}"
        code, page = _get(url, Path(job["authorization"]["credentials_file"]).read_text().strip())
        assert code == 200 and "llamacpp:tokens_predicted_total" in page, (url, code)
        assert _get(url)[0] == 401  # and the key is what lets it in
    # one job: the file_sd on stdout, and how to scrape it on stderr
    proc = cli("targets", "-i", str(inv), env=env)
    assert json.loads(proc.stdout) == [group] and str(KEY_FILE) in proc.stderr
