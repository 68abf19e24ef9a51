"""The rendered units against the real tools on the test hosts.

1. Every golden unit (tests/golden/*) goes to gpu1 (podman 5.4, systemd 257): each quadlet
   through the real ``QUADLET_UNIT_DIRS=<dir> /usr/libexec/podman/quadlet -dryrun``, then the
   .service it generates and every plain .service golden through ``systemd-analyze verify``;
   the plain goldens also on legacy1 (systemd 252, the podman 4.3 host they are written for),
   except those rendered with RestartSteps= (``restart_backoff``: systemd 254+ only).
   Neither host has docker, so the docker goldens are verified with a stand-in docker.service
   passed alongside, and the one complaint left, ``Command /usr/bin/docker is not executable``,
   is the only line accepted: the unit parsed all the way to the executable check. A
   deliberately broken copy shows that the same check does catch a syntax error.
2. End to end: a recipe whose env values and args hold % $ " \\ ' and spaces is deployed through
   the CLI to gpu1 (quadlet) and legacy1 (plain unit); systemd really runs it, and podman
   inspect shows the exact original strings in the container's environment and argv, and
   llama-server accepts the odd API key exactly as written.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.fleet import cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host, ssh_argv
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, SshRunner
from tests.render_cases import GOLDEN, INPUT, cases

pytestmark = pytest.mark.hosts

QUADLET = "/usr/libexec/podman/quadlet"
REMOTE = "/var/tmp/tensorless-golden-units"
DOCKER_STANDIN = "[Unit]\nDescription=stand-in for docker.service\n[Service]\nExecStart=/bin/true\n"
DOCKER_MISSING = "Command /usr/bin/docker is not executable: No such file or directory"


def _push_goldens(host: Host, tmp_path: Path, ssh: SshRunner) -> None:
    tar = tmp_path / "golden.tar"
    with tarfile.open(tar, "w") as t:
        for case in cases():
            for p in sorted(case.folder.iterdir()):
                if p.name != INPUT:
                    t.add(p, arcname=f"{case.name}/{p.name}")
    ssh(host, f"rm -rf {REMOTE} && mkdir -p {REMOTE}")
    with tar.open("rb") as f:
        subprocess.run([*ssh_argv(host), f"tar -C {REMOTE} -xf -"], stdin=f, check=True, timeout=60)


def _verify(ssh: SshRunner, host: str, unit: str, *extra: str) -> list[str]:
    """systemd-analyze verify's complaints about ``unit`` (its own lines only)."""
    proc = ssh(host, f"systemd-analyze verify {unit} {' '.join(extra)} 2>&1", check=False)
    return [line for line in proc.stdout.splitlines() if line.strip()]


@pytest.fixture
def remote_dirs(ssh: SshRunner) -> Iterator[None]:
    yield
    for name in ("gpu1", "legacy1"):
        ssh(name, f"rm -rf {REMOTE}", check=False)


def test_goldens_pass_real_quadlet_and_systemd_analyze(
    ssh: SshRunner, test_hosts: dict[str, Host], tmp_path: Path, remote_dirs: None
) -> None:
    all_cases = cases()
    assert all_cases and (GOLDEN / all_cases[0].name).is_dir()
    for name in ("gpu1", "legacy1"):
        _push_goldens(test_hosts[name], tmp_path, ssh)
    ssh("gpu1", f"printf %s {shlex.quote(DOCKER_STANDIN)} > {REMOTE}/docker.service")
    ssh("legacy1", f"printf %s {shlex.quote(DOCKER_STANDIN)} > {REMOTE}/docker.service")

    for case in all_cases:
        (unit,) = [p.name for p in case.folder.iterdir() if p.name != INPUT]
        src = f"{REMOTE}/{case.name}/{unit}"
        if case.kind == "quadlet":
            proc = ssh(
                "gpu1", f"QUADLET_UNIT_DIRS={REMOTE}/{case.name} {QUADLET} -dryrun", check=False
            )
            assert proc.returncode == 0, (case.name, proc.stderr)
            problems = [ln for ln in proc.stderr.splitlines() if "Loading source unit" not in ln]
            assert problems == [], (case.name, proc.stderr)
            service = unit.removesuffix(".container") + ".service"
            header, _, generated = proc.stdout.partition("\n")
            assert header == f"---{service}---", (case.name, proc.stdout[:200])
            assert "\nExecStart=/usr/bin/podman run " in generated
            gen_dir = f"{REMOTE}/{case.name}/generated"
            ssh("gpu1", f"mkdir -p {gen_dir} && cat > {gen_dir}/{service}", input=generated)
            assert _verify(ssh, "gpu1", f"{gen_dir}/{service}") == [], case.name
            continue
        docker = "docker" in case.data["render"]["engine_bin"]
        # RestartSteps= is rendered only for systemd 254+ (legacy1 has 252 and warns on it)
        backoff = bool(case.data["render"].get("restart_backoff", False))
        for host in ("gpu1",) if backoff else ("gpu1", "legacy1"):
            extra = (f"{REMOTE}/docker.service",) if docker else ()
            complaints = _verify(ssh, host, src, *extra)
            if docker:  # parsed to the end: only the missing binary is left to say
                assert complaints, (host, case.name)
                assert set(complaints) == {f"{unit}: {DOCKER_MISSING}"}, (
                    host,
                    case.name,
                    complaints,
                )
            else:
                assert complaints == [], (host, case.name, complaints)

    # the same check notices a broken unit (so "no complaint" above means something)
    broken = f"{REMOTE}/broken/tensorless-broken.service"
    good = f"{REMOTE}/service-podman/*.service"
    ssh(
        "gpu1",
        f"mkdir -p {REMOTE}/broken && sed 's|^ExecStart=.*|ExecStart=/usr/bin/podman "
        f"\"unterminated|; s|^Restart=.*|Restart=sometimes|' {good} "
        f"> {broken}",
    )
    assert _verify(ssh, "gpu1", broken) != []
    # quadlet takes Volume= raw (why sd_raw exists): quoting it does not fail here, the quotes
    # land inside podman's -v value, and podman then refuses the option "ro\""
    ssh(
        "gpu1",
        f"mkdir -p {REMOTE}/badq && sed 's/^Volume=\\(.*\\)$/Volume=\"\\1\"/' "
        f"{REMOTE}/quadlet-podman5/*.container > {REMOTE}/badq/bad.container",
    )
    proc = ssh("gpu1", f"QUADLET_UNIT_DIRS={REMOTE}/badq {QUADLET} -dryrun", check=False)
    assert proc.returncode == 0, proc.stderr
    assert ' -v "\\"/var/lib/tensorless/models/' in proc.stdout
    assert ':ro\\"" ' in proc.stdout


# ------------------------------------------------------------------------------ end to end

UNIT = "tensorless-tiny-p100"
WEIRD_ENV = {
    "LLAMA_LOG_COLORS": "off",
    "TL_WEIRD": 'a%b$c"d\\e f',
    "TL_QUOTES": "it's \"quoted\" and 'single'",
    "TL_SPEC": "%n %h %% ${HOME} $HOME $$ \\n \\\\",
    "TL_SPACES": "  lead and trail  ",
    "TL_EMPTY": "",
}
# --tags: a value llama-server hands back byte for byte in /v1/models (a recipe may not carry
# --api-key, the operator's secret: recipe/flags.py)
ODD_TAG = "k%1$x\"y\\z w'v"
WEIRD_ARGS = ["-np", "1", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "--tags", ODD_TAG]


def test_odd_env_and_args_arrive_exactly(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    hf: HFServer,
    ssh: SshRunner,
    clean_hosts: None,
) -> None:
    recipe = tiny_recipe(hosts_json, TINY_COMMIT, env=WEIRD_ENV, args=WEIRD_ARGS)
    catalog = write_catalog(tmp_path / "recipes", recipe)
    inventory = write_inventory(
        tmp_path / "inventory.py", [test_hosts["gpu1"], test_hosts["legacy1"]]
    )
    proc = cli(
        "deploy",
        "-i",
        str(inventory),
        "tiny",
        "--recipes",
        str(catalog),
        "--json",
        env={"HF_ENDPOINT": hf.url},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert {n: h["outcome"] for n, h in report.items()} == {"gpu1": "changed", "legacy1": "changed"}

    assert ssh("gpu1", f"test -f /etc/containers/systemd/{UNIT}.container").returncode == 0
    assert ssh("legacy1", f"test -f /etc/systemd/system/{UNIT}.service").returncode == 0
    for name in ("gpu1", "legacy1"):
        assert ssh(name, f"systemctl is-active {UNIT}.service").stdout.strip() == "active"
        fmt = "'{{json .Config.Env}}'"
        env = json.loads(ssh(name, f"podman inspect {UNIT} --format {fmt}").stdout)
        for key, value in WEIRD_ENV.items():
            assert f"{key}={value}" in env, (name, key, env)
        fmt = "'{{json .Args}}'"
        args = json.loads(ssh(name, f"podman inspect {UNIT} --format {fmt}").stdout)
        assert args[-len(WEIRD_ARGS) :] == WEIRD_ARGS, (name, args)
        assert args[args.index("--alias") + 1] == recipe["run"]["alias"]
        # llama-server received the value byte for byte: it lists it as the model's tag
        models = json.loads(ssh(name, "curl -s http://127.0.0.1:8080/v1/models").stdout)
        assert models["data"][0]["tags"] == [ODD_TAG], (name, models["data"][0])
