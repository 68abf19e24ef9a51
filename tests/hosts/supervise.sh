#!/bin/bash
# Keep a persistent-root test host (persist1) up across its own reboots (docs/test-hosts.md):
#   supervise.sh systemd-nspawn -b -D ROOT ...
# Runs the command; when it exits 133 (systemd-nspawn: the guest asked for a reboot) runs it
# again; any other exit status stops the supervisor with that status. SIGTERM/SIGINT are passed
# on to the command (nspawn: clean poweroff of the guest), then the supervisor exits 0. More than
# MAX_REBOOTS reboots within 60 s (a guest that reboots in a loop) stop it with status 1.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: supervise.sh COMMAND..." >&2; exit 2; }
MAX_REBOOTS=${MAX_REBOOTS:-10}
child=0
stopping=0
boot=0
recent=()
# shellcheck disable=SC2317  # invoked by the trap
on_signal() {
  stopping=1
  if [ "$child" != 0 ]; then kill -TERM "$child" 2>/dev/null || true; fi
}
trap on_signal TERM INT
while [ "$stopping" = 0 ]; do
  boot=$((boot + 1))
  echo "supervise: boot $boot at $(date -u +%FT%TZ)"
  "$@" &
  child=$!
  rc=0
  while :; do
    # a trapped signal interrupts wait (status > 128) while the child still runs: wait again
    wait "$child" && rc=0 || rc=$?
    kill -0 "$child" 2>/dev/null || break
  done
  child=0
  if [ "$stopping" = 1 ]; then break; fi
  if [ "$rc" != 133 ]; then
    echo "supervise: exit status $rc (not a reboot): stopping"
    exit "$rc"
  fi
  t=$(date +%s)
  kept=()
  for r in "${recent[@]}" "$t"; do [ $((t - r)) -lt 60 ] && kept+=("$r"); done
  recent=("${kept[@]}")
  if [ "${#recent[@]}" -gt "$MAX_REBOOTS" ]; then
    echo "supervise: more than $MAX_REBOOTS reboots within 60 s: stopping"
    exit 1
  fi
  echo "supervise: the guest rebooted (exit 133): starting it again"
done
echo "supervise: stopped by signal after $boot boot(s)"
exit 0
