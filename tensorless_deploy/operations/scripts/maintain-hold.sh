#!/bin/sh
# needs: host.sh
# needs: api.sh
# Keep a unit from starting during a maintenance window, then stop it: the drop-in's condition
# (the window's record exists) holds at boot, for a restart policy and for a start by hand.
: "${svc:?}" "${dropin:?}" "${text:?}"
# path, idle, key: the unit file; wait up to idle seconds for its requests in flight first
: "${path=}" "${idle=}" "${key=}"
mkdir -p "$(dirname "$dropin")"
printf '%s' "$text" > "$dropin.tensorless-new" && mv -f "$dropin.tensorless-new" "$dropin" || exit 1
systemctl daemon-reload
if [ "$(systemctl is-active "$svc" 2>/dev/null)" != inactive ]; then
  if [ -n "$idle" ] && [ -n "$path" ]; then wait_idle "$(health_url "$path")" "$key" "$idle" stopped; fi
  timeout 120 systemctl stop "$svc" || { echo "could not stop $svc" >&2; exit 1; }
  echo "stopped $svc"
fi
systemctl reset-failed "$svc" 2>/dev/null
echo "$svc kept from starting until maintain end ($dropin)"
