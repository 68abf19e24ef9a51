#!/bin/sh
# gate run's scratch instance stopped and removed, then verified gone: its transient unit
# (collected: LoadState not-found), its container, and its port. Prints what is left and exits
# 1 when anything still is after 30 s.
: "${svc:?}" "${name:?}" "${port:?}" "${engine:?}"
timeout 60 systemctl stop "$svc" 2>/dev/null
timeout 60 "$engine" rm -f "$name" >/dev/null 2>&1
systemctl reset-failed "$svc" 2>/dev/null
i=0
while :; do
  left=
  load=$(systemctl show -p LoadState --value "$svc" 2>/dev/null)
  if [ -n "$load" ] && [ "$load" != not-found ]; then
    left="$left unit $svc ($load, $(systemctl is-active "$svc" 2>/dev/null));"
  fi
  if "$engine" inspect --type container "$name" >/dev/null 2>&1; then
    left="$left container $name;"
    timeout 30 "$engine" rm -f "$name" >/dev/null 2>&1  # again: a dying `run` may hold it
  fi
  if [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ]; then
    left="$left port $port listening;"
  fi
  [ -z "$left" ] && break
  i=$((i + 1))
  [ "$i" -ge 30 ] && break
  sleep 1
  systemctl reset-failed "$svc" 2>/dev/null
done
if [ -n "$left" ]; then
  echo "left on the host:$left" >&2
  exit 1
fi
echo "gone: unit $svc, container $name, port $port"
