#!/bin/sh
# The compute processes on each GPU and the container each belongs to (read by
# facts.parsers.parse_gpu_apps): one "@app GPU-UUID PID USED_MIB CONTAINER" line per process
# (CONTAINER "-" when the process is in none). What a model's own running instances hold on a
# card counts as free when that model is planned again. Exit 3: nvidia-smi could not list them.
command -v nvidia-smi >/dev/null 2>&1 || exit 0
apps=$(nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits) || exit 3
[ -n "$apps" ] || exit 0
ids=""
for engine in podman docker; do
  command -v "$engine" >/dev/null 2>&1 || continue
  ids=$("$engine" ps --no-trunc --format '{{.ID}} {{.Names}}' 2>/dev/null) && break
done
printf '%s\n' "$apps" | while IFS=, read -r uuid pid mib; do
  uuid=$(echo "$uuid" | tr -d ' '); pid=$(echo "$pid" | tr -d ' '); mib=$(echo "$mib" | tr -d ' ')
  cid=$(grep -o '[0-9a-f]\{64\}' "/proc/$pid/cgroup" 2>/dev/null | head -n 1)
  name=-
  if [ -n "$cid" ]; then
    name=$(printf '%s\n' "$ids" | awk -v id="$cid" '$1 == id { print $2; exit }')
    [ -n "$name" ] || name=-
  fi
  echo "@app $uuid $pid $mib $name"
done
exit 0
