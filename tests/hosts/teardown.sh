#!/bin/bash
# Stop everything tests/hosts/setup.sh started, by PID, and remove its network plumbing.
#   bash tests/hosts/teardown.sh
# Stops: the nspawn hosts (SIGTERM = clean poweroff of the guest), the registry, any other
# process whose pid file is in BASE/run. Removes: the tl-* namespaces (and their veths), the
# tlbr0 bridge, the per-boot state dirs (BASE/hosts/*), hosts.json. Keeps for reuse: the rootfs
# trees, the engine image tar, registry data, keys, the tiny GGUF.
# Exits non-zero (and says what) if a process, namespace, link or mount is left behind.
set -uo pipefail
BASE=${BASE:-/var/tmp/tensorless-hosts}
BRIDGE=tlbr0
[ "$(id -u)" = 0 ] || { echo "teardown: must run as root" >&2; exit 1; }
left=0

stop_pid() { # stop_pid PIDFILE SECONDS
  local f=$1 limit=$2 p i
  p=$(cat "$f" 2>/dev/null) || return 0
  if [[ "$p" =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p" 2>/dev/null
    for ((i = 0; i < limit * 5; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$p" 2>/dev/null; then
      echo "teardown: $(basename "$f" .pid) (pid $p) ignored SIGTERM for ${limit}s; SIGKILL"
      kill -KILL "$p" 2>/dev/null; sleep 0.5
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
  rm -f "$BASE"/run/*.rc "$BASE"/run/*.secs
fi

for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^tl-/ {print $1}'); do
  ip netns del "$ns" || { echo "teardown: could not delete netns $ns" >&2; left=1; }
done
for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^tlv-' || true); do
  ip link del "$l" 2>/dev/null || true
done
ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"

# per-boot state; mounts under BASE should have gone with the guests' mount namespaces
if mount | grep -q " $BASE/"; then
  for m in $(mount | awk -v b="$BASE/" 'index($3, b) == 1 {print $3}' | sort -r); do umount "$m" 2>/dev/null || umount -l "$m" || true; done
fi
rm -rf "$BASE"/hosts/* "$BASE/hosts.json"

# ---- verify nothing is left
if ip netns list 2>/dev/null | grep -q '^tl-'; then echo "teardown: LEFT namespaces: $(ip netns list | grep '^tl-')" >&2; left=1; fi
if ip link show "$BRIDGE" >/dev/null 2>&1; then echo "teardown: LEFT bridge $BRIDGE" >&2; left=1; fi
if mount | grep -q " $BASE/"; then echo "teardown: LEFT mounts:" >&2; mount | grep " $BASE/" >&2; left=1; fi
for pat in "systemd-nspawn.*$BASE" "docker-registry serve $BASE"; do
  if pgrep -f -- "$pat" >/dev/null; then echo "teardown: LEFT processes: $(pgrep -af -- "$pat")" >&2; left=1; fi
done
[ $left = 0 ] && echo "teardown: clean (kept rootfs, engine image tar, registry data under $BASE)"
exit $left
