#!/bin/sh
# needs: host.sh
# needs: api.sh
# needs: unit-lib.sh
# Bring back the previous unit kept beside the current one, gated like a deploy (healthy, and on
# the device its io.tensorless.device label names): the current unit becomes the kept one, so a
# second rollback returns to it. When the previous unit does not pass, the current one is put back
# and restarted.
: "${path:?}" "${svc:?}" "${kind:?}" "${timeout:?}" "${device_re:?}"
# idle, key: wait up to idle seconds for the current instance's requests in flight first
: "${idle=}" "${key=}"
prev="$path.tensorless-prev"
if [ ! -f "$prev" ]; then
  echo "no previous unit is kept for $svc: nothing to roll back to" >&2
  exit 1
fi
url=$(health_url "$prev")
swap() {  # current <-> kept, with the sha256 each was written with
  mv -f "$path" "$path.tensorless-swap"
  mv -f "$prev" "$path"
  mv -f "$path.tensorless-swap" "$prev"
  if [ -f "$path.tensorless-sha" ]; then mv -f "$path.tensorless-sha" "$path.tensorless-sha-swap"; fi
  if [ -f "$path.tensorless-prev-sha" ]; then mv -f "$path.tensorless-prev-sha" "$path.tensorless-sha"; fi
  if [ -f "$path.tensorless-sha-swap" ]; then mv -f "$path.tensorless-sha-swap" "$path.tensorless-prev-sha"; fi
}
healthy() {
  deadline=$(( $(date +%s) + timeout ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    [ "$(http_code "$1")" = 200 ] && return 0
    [ "$(systemctl is-active "$svc" 2>/dev/null)" = failed ] && return 1
    sleep 1
  done
  return 1
}
[ -z "$idle" ] || wait_idle "$(health_url "$path")" "$key" "$idle" "rolled back"
t0=$(date +%s)
swap
systemctl daemon-reload
[ "$kind" = service ] && systemctl enable -q "$svc" 2>/dev/null
systemctl reset-failed "$svc" 2>/dev/null || true
want=$(device_label "$path")
if timeout "$timeout" systemctl restart "$svc" 2>/dev/null && healthy "$url"; then
  took=$(( $(date +%s) - t0 ))
  lines=
  [ -z "$want" ] || [ "$want" = cpu ] || lines=$(device_lines "$svc")
  if [ -z "$want" ] || printf '%s\n' "$lines" | on_card "$want"; then
    echo "$svc rolled back: the previous unit is healthy after $took s at $url"
    exit 0
  fi
  echo "the previous unit of $svc answers /health after $took s, but is not on its card" \
    "($want)." >&2
  echo "device lines of this start:" >&2
  [ -z "$lines" ] || printf '%s\n' "$lines" | sed 's/^/  > /' >&2
else
  echo "the previous unit of $svc failed after $(( $(date +%s) - t0 )) s (its start may take" \
    "$timeout s)." >&2
  echo "journal of this start (journalctl -u $svc --since @$t0):" >&2
  journalctl -q -u "$svc" --since "@$t0" --no-pager -o cat 2>&1 | tail -n 300 | sed 's/^/  | /' >&2
fi
swap
systemctl daemon-reload
timeout "$timeout" systemctl restart "$svc" 2>/dev/null
echo "put the current unit back and restarted it" >&2
exit 1
