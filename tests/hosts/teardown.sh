#!/bin/bash
# Stop everything tests/hosts/setup.sh started for one host set, by PID, and remove its network
# plumbing:
#   [TL_SET=S] bash tests/hosts/teardown.sh
# Stops: the set's hosts (SIGTERM = clean poweroff of the guest; persist1's supervisor passes it
# on), its registry, any other process whose pid file is in BASE/run (the playground's model
# server among them). Removes: the set's
# namespaces (and their veths), its bridge, the per-boot state (BASE/hosts/*, persist1's root
# included), hosts.json. Keeps for reuse: the shared rootfs trees and engine image tar, registry
# data, keys, the tiny GGUF. Never touches another set (names and BASE from `harness.py plan`).
# Exits non-zero (and says what) if a process, namespace, link or mount of the set is left.
set -euo pipefail
SCRIPT_DIR=$(dirname "$(readlink -f "$0")")
REPO=$(readlink -f "$SCRIPT_DIR/../..")
[ "$(id -u)" = 0 ] || { echo "teardown: must run as root" >&2; exit 1; }
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
PLAN=$("$PY" "$SCRIPT_DIR/harness.py" plan) || { echo "teardown: no plan for TL_SET='${TL_SET:-}'" >&2; exit 2; }
eval "$PLAN"  # TL_SET BASE BRIDGE NETNS_PREFIX VETH_PREFIX ...
left=0

stop_pid() { # stop_pid PIDFILE SECONDS
  local f=$1 limit=$2 p i
  p=$(cat "$f" 2>/dev/null) || return 0
  if [[ "$p" =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p" 2>/dev/null || true
    for ((i = 0; i < limit * 5; i++)); do
      kill -0 "$p" 2>/dev/null || break
      # a guest whose halt fails (seen now and then on bookworm: "Failed to start
      # systemd-halt.service") waits forever; nspawn ends it on a second SIGTERM
      if [ "$i" = 50 ]; then
        echo "teardown: $(basename "$f" .pid) still up 10 s after SIGTERM; SIGTERM again (nspawn: immediate termination)"
        kill -TERM "$p" 2>/dev/null || true
      fi
      sleep 0.2
    done
    if kill -0 "$p" 2>/dev/null; then
      echo "teardown: $(basename "$f" .pid) (pid $p) ignored SIGTERM for ${limit}s; SIGKILL"
      kill -KILL "$p" 2>/dev/null || true; sleep 0.5
    fi
    echo "teardown: stopped $(basename "$f" .pid) (pid $p)"
  fi
  rm -f "$f"
}

if [ -d "$BASE/run" ]; then
  # hosts first, all at once (each poweroff takes ~1-2 s), then the rest
  for f in "$BASE"/run/nspawn-*.pid; do [ -e "$f" ] && { stop_pid "$f" 30 & }; done
  wait
  for f in "$BASE"/run/*.pid; do [ -e "$f" ] && stop_pid "$f" 10; done
  rm -f "$BASE"/run/*.rc "$BASE"/run/*.secs "$BASE"/run/host-*.rootfs
fi

set_netns() { ip netns list 2>/dev/null | awk -v p="$NETNS_PREFIX" 'index($1, p) == 1 {print $1}'; }
set_veths() { ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | awk -v p="$VETH_PREFIX" 'index($0, p) == 1'; }
for ns in $(set_netns); do
  ip netns del "$ns" || { echo "teardown: could not delete netns $ns" >&2; left=1; }
done
for l in $(set_veths); do ip link del "$l" 2>/dev/null || true; done
if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi

# per-boot state; mounts under BASE should have gone with the guests' mount namespaces
under_base() { awk -v b="$BASE/" 'index($2, b) == 1 {print $2}' /proc/self/mounts; }
for m in $(under_base | sort -r); do umount "$m" 2>/dev/null || umount -l "$m" || true; done
rm -rf "$BASE"/hosts/* "$BASE/hosts.json" "$BASE/hosts.json.new"

# ---- verify nothing of this set is left
if [ -n "$(set_netns)" ]; then echo "teardown: LEFT namespaces: $(set_netns | xargs)" >&2; left=1; fi
if [ -n "$(set_veths)" ]; then echo "teardown: LEFT links: $(set_veths | xargs)" >&2; left=1; fi
if ip link show "$BRIDGE" >/dev/null 2>&1; then echo "teardown: LEFT bridge $BRIDGE" >&2; left=1; fi
if [ -n "$(under_base)" ]; then echo "teardown: LEFT mounts: $(under_base | xargs)" >&2; left=1; fi
# the set's processes name its BASE: nspawn binds BASE/hosts/NAME/..., the registry its config
# the playground's model server (tests/hosts/playground.sh) binds the set's gateway
for pat in "systemd-nspawn .*$BASE/hosts/" "supervise.sh .*$BASE/hosts/" "docker-registry serve $BASE/registry/" "hf_server.py --host $GW "; do
  if pgrep -f -- "$pat" >/dev/null; then echo "teardown: LEFT processes: $(pgrep -af -- "$pat")" >&2; left=1; fi
done
[ $left = 0 ] && echo "teardown: set $TL_SET clean (kept the shared rootfs trees and engine image tar, registry data, keys under $BASE)"
exit $left
