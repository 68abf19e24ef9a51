#!/bin/bash
# The playground: test hosts up, an inventory, the tiny recipe and the model server, so every
# example of docs/ can be typed as written (docs/install.md, "The playground"):
#
#   eval "$([TL_SET=S] bash tests/hosts/playground.sh [N])"     (as root)
#
# Boots (or reuses) the set with tests/hosts/setup.sh (N GPU hosts; default: as many as the set
# already has, else 2), then tests/hosts/playground.py resets the hosts, gives legacy1 the mixed
# profile, writes BASE/playground/{inventory.py,recipes}, starts the model server (PID in
# BASE/run/hf-server.pid) and prints the environment to export on stdout, nothing else.
# Everything else goes to stderr. Undo: [TL_SET=S] bash tests/hosts/teardown.sh (it stops the
# model server too).
set -euo pipefail
SCRIPT_DIR=$(dirname "$(readlink -f "$0")")
REPO=$(readlink -f "$SCRIPT_DIR/../..")
[ "$(id -u)" = 0 ] || { echo "playground: must run as root (like tests/hosts/setup.sh)" >&2; exit 2; }
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || { echo "playground: no $PY; install first (docs/install.md)" >&2; exit 2; }
t0=$(date +%s.%N)
eval "$("$PY" "$SCRIPT_DIR/harness.py" plan)"  # BASE of TL_SET
if [ $# -gt 0 ]; then
  N=$1
elif [ -f "$BASE/hosts.json" ]; then  # never shrink a running set (hosts.json lists what setup booted)
  N=$("$PY" -c 'import json,sys; print(max(2, sum(1 for h in json.load(open(sys.argv[1]))["hosts"] if h.get("gpu_host"))))' "$BASE/hosts.json")
else
  N=2
fi
bash "$SCRIPT_DIR/setup.sh" "$N" >"$BASE/logs/playground-setup.log" 2>&1 \
  || { tail -5 "$BASE/logs/playground-setup.log" >&2; echo "playground: setup failed (log $BASE/logs/playground-setup.log)" >&2; exit 1; }
echo "playground: test hosts up ($(tail -1 "$BASE/logs/playground-setup.log"))" >&2
cd "$REPO"
"$PY" -m tests.hosts.playground
awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "playground: done in %.1f s\n", b-a}' >&2
