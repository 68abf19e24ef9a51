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
#
# The Python it runs (and exports on PATH): $PYTHON, else the checkout's .venv, else the one
# behind the tensorless-deploy on PATH (docs/install.md's ~/.venvs/tensorless): the tool's own
# packages are all the playground needs.
set -euo pipefail
# Under eval a failure printed nothing on stdout, so eval "" left $? at 0: stdout (when it is
# not a terminal) ends with the exit status, which eval then returns.
status_for_eval() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ ! -t 1 ]; then echo "(exit $rc)"; fi
}
trap status_for_eval EXIT
SCRIPT_DIR=$(dirname "$(readlink -f "$0")")
REPO=$(readlink -f "$SCRIPT_DIR/../..")
[ "$(id -u)" = 0 ] || { echo "playground: must run as root (like tests/hosts/setup.sh)" >&2; exit 2; }
INSTALL="python3 -m venv ~/.venvs/tensorless && ~/.venvs/tensorless/bin/pip install -q $REPO && export PATH=~/.venvs/tensorless/bin:\"\$PATH\""
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -x "$REPO/.venv/bin/python" ]; then
  PY=$REPO/.venv/bin/python
elif TOOL=$(command -v tensorless-deploy 2>/dev/null); then
  PY=$(sed -n '1s/^#!//p' "$TOOL")  # pip's console script names its venv's python
else
  PY=
fi
if [ -z "$PY" ] || ! "$PY" -c 'import tensorless_deploy, pyinfra, gguf' 2>/dev/null; then
  echo "playground: no Python with tensorless-deploy installed (tried \$PYTHON, $REPO/.venv," \
    "the tensorless-deploy on PATH); install it first: $INSTALL" >&2
  exit 2
fi
export PYTHON=$PY  # setup.sh's tiny GGUF needs the same packages
t0=$(date +%s.%N)
eval "$("$PY" "$SCRIPT_DIR/harness.py" plan)"  # BASE of TL_SET
mkdir -p "$BASE/logs"  # a set never booted has none yet (setup.sh makes the rest)
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
"$PY" -m tests.hosts.playground || { echo "playground: failed (the lines above say why)" >&2; exit 1; }
awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "playground: done in %.1f s\n", b-a}' >&2
