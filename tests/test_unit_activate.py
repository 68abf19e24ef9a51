"""unit-activate.sh against stand-ins for systemctl, podman and curl: with Notify=healthy the
start job lasts until podman's startup probe passes, which systemd's timer runs about once a
second at a phase of its own (1.5-2.1 s apart, measured on the test hosts); the script runs the
probe itself as soon as /health answers, so the unit is ready when llama-server is. The
stand-in job holds the start until the probe passes, and lets podman's own timer pass it only
TIMER_S after the server listens."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

from tensorless_deploy.facts.device import DEVICE_LINE
from tensorless_deploy.operations._run import bound

LISTEN_S = 0.3  # the server listens this long after its start
TIMER_S = 6.0  # podman's own timer passes the probe this long after that (a slow machine)
NAME = "tensorless-tiny-p100"

STUBS = {
    "systemctl": """
case "$1" in
  restart|start)
    (sleep {listen}; touch "$W/listening") &
    # no Notify=healthy: the job ends as the container starts
    [ -e "$W/notify" ] || {{ echo active > "$W/state"; exit 0; }}
    echo activating > "$W/state"
    end=$(( $(date +%s) + 60 ))
    waited=0
    until [ -e "$W/healthy" ]; do
      sleep 0.05
      [ -e "$W/listening" ] && waited=$((waited + 1))
      [ "$waited" -ge {timer_ticks} ] && touch "$W/healthy"
      [ "$(date +%s)" -ge "$end" ] && exit 1
    done
    echo active > "$W/state" ;;
  is-active) cat "$W/state" ;;
  show) echo 0 ;;
esac
exit 0
""",
    # host.sh's http_code: curl -s -k -o /dev/null -w '%{http_code}' --max-time T URL
    "curl": '[ -e "$W/listening" ] && printf 200 || printf 000\n',
    "podman": """
[ "$1 $2" = "healthcheck run" ] || exit 0
echo "$3" >> "$W/probes"
[ -e "$W/listening" ] && touch "$W/healthy"
exit 0
""",
    "journalctl": "exit 0\n",
}

QUADLET = f"""[Container]
ContainerName={NAME}
Label="io.tensorless.device=cpu"
HealthStartupCmd=curl -fsS --max-time 5 http://127.0.0.1:8080/health
{{notify}}
[Service]
Restart=always
"""


def _activate(tmp_path: Path, *, notify: bool) -> tuple[float, subprocess.CompletedProcess[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        stub = bin_dir / name
        text = body.format(listen=LISTEN_S, timer_ticks=int(TIMER_S / 0.05))
        stub.write_text("#!/bin/sh\n" + text)
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "state").write_text("inactive\n")
    if notify:
        (tmp_path / "notify").touch()
    unit = tmp_path / f"{NAME}.container"
    unit.write_text(QUADLET.format(notify="Notify=healthy" if notify else ""))
    script = bound(
        "unit-activate",
        svc=f"{NAME}.service",
        url="http://127.0.0.1:8080/health",
        timeout=60,
        path=str(unit),
        kind="quadlet",
        verb="restart",
        device_re=DEVICE_LINE,
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "W": str(tmp_path)}
    t0 = time.monotonic()
    proc = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    return time.monotonic() - t0, proc


def test_a_health_gated_start_is_ready_when_the_server_listens(tmp_path: Path) -> None:
    took, proc = _activate(tmp_path, notify=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{NAME}.service healthy after ")
    assert (tmp_path / "probes").read_text().split() == [NAME]
    # listening at 0.3 s, polled every 0.1 s: ready well before podman's own timer (6.3 s),
    # with room for a loaded machine's slow process starts
    assert took < LISTEN_S + 2.0, took


def test_a_unit_without_a_health_gated_start_is_not_probed(tmp_path: Path) -> None:
    # podman before 5 has no Notify=healthy: its start job ends with the container's start and
    # the script's own /health poll decides; nothing runs podman's probe
    _, proc = _activate(tmp_path, notify=False)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "probes").exists()
