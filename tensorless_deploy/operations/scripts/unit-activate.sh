#!/bin/sh
# needs: host.sh
# needs: api.sh
# needs: unit-lib.sh
# (Re)start a unit, wait for /health 200, then read its start log: the instance must say it runs
# where its unit's io.tensorless.device label says (on_card, unit-lib.sh). A new unit that fails either
# way gives way to the previous one. A failure says how long it really took and shows the journal
# of this start ("  | " lines; the controller puts its first error line first, fleet.journal).
: "${svc:?}" "${url:?}" "${timeout:?}" "${path:?}" "${kind:?}" "${verb:?}" "${device_re:?}"
# idle: before a restart, wait up to this many seconds for the serving instance's requests in
# flight to finish (wait_idle, api.sh; its /slots and /metrics read with key, the unit's API
# key file); empty: no wait
: "${idle=}" "${key=}"
poll() {  # until /health answers 200, the unit fails, or the deadline passes
  deadline=$(( $(date +%s) + $1 ))
  while :; do
    code=$(http_code "$url" || true)
    [ "$code" = 200 ] && return 0
    st=$(systemctl is-active "$svc" 2>/dev/null || true)
    if [ "$st" = failed ]; then last="unit failed"; return 1; fi
    # llama-server never exits while it loads: a restart means it died (bad flag, bad file)
    nr=$(systemctl show -p NRestarts --value "$svc" 2>/dev/null || echo 0)
    if [ "${nr:-0}" -gt 0 ]; then last="the server exited and systemd restarted it"; return 1; fi
    last="HTTP ${code:-000} (${st})"
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 1
  done
}
# With Notify=healthy (podman 5) the start job lasts until podman's startup probe passes, and
# systemd runs that probe's timer about once a second at a phase of its own (AccuracySec=1s),
# so a server that began listening just after one probe was ready 1.5-2 s later. While the job
# runs, hurry runs the probe itself as soon as /health answers 200: ready within one probe of
# the server listening. Ended when the job returns.
hurry() {  # hurry CONTAINER
  until [ "$(systemctl is-active "$svc" 2>/dev/null)" = activating ]; do sleep 0.1; done
  until [ "$(http_code "$url")" = 200 ]; do sleep 0.1; done
  podman healthcheck run "$1" >/dev/null 2>&1 || true
}
journal_since() {  # the unit's journal since $1 (a Unix time): what this start wrote
  echo "journal of this start (journalctl -u $svc --since @$1):"
  journalctl -q -u "$svc" --since "@$1" --no-pager -o cat 2>&1 | tail -n 300 | sed 's/^/  | /'
}
show_devices() {  # the device lines the verdict was made from (none: the header alone)
  echo "device lines of this start:"
  [ -z "$1" ] || printf '%s\n' "$1" | sed 's/^/  > /'
}
t0=$(date +%s)
last=""
systemctl daemon-reload
[ "$kind" = service ] && systemctl enable -q "$svc" 2>/dev/null
# a crash loop that hit a start limit (units of older versions) leaves the unit failed
systemctl reset-failed "$svc" 2>/dev/null || true
want=$(device_label "$path")
if [ "$verb" = restart ] && [ -n "$idle" ]; then
  # the instance serving now is the previous unit's, on its own address
  was=$url
  [ -f "$path.tensorless-prev" ] && was=$(health_url "$path.tensorless-prev")
  wait_idle "${was:-$url}" "$key" "$idle" restarted
  t0=$(date +%s)
fi
# Blocking: the old instance is gone before the first poll (with Notify=healthy, the start
# job itself waits for the container's health check, which hurry runs in time).
hurrying=
if grep -qx 'Notify=healthy' "$path"; then
  hurry "$(sed -n 's/^ContainerName=//p' "$path")" >/dev/null 2>&1 &
  hurrying=$!
fi
started=0
timeout "$timeout" systemctl "$verb" "$svc" 2>/dev/null || started=$?
[ -z "$hurrying" ] || { kill "$hurrying" 2>/dev/null; wait "$hurrying" 2>/dev/null; } || true
if [ "$started" = 0 ] && poll "$timeout"; then
  took=$(( $(date +%s) - t0 ))
  if [ -z "$want" ]; then
    echo "$svc healthy after $took s at $url (its unit names no device: not checked)"
    exit 0
  fi
  lines=
  # a CPU engine is on the CPU by design: no log to wait for
  [ "$want" = cpu ] || lines=$(device_lines "$svc")
  if printf '%s\n' "$lines" | on_card "$want"; then
    # the previous unit stays as $path.tensorless-prev: `rollback` brings it back
    echo "$svc healthy after $took s at $url, on its device ($want)"
    [ "$want" = cpu ] || show_devices "$lines"
    exit 0
  fi
  echo "$svc answers /health after $took s, but is not on its card ($want)." >&2
  show_devices "$lines" >&2
else
  echo "$svc failed after $(( $(date +%s) - t0 )) s (its start may take $timeout s):" \
    "${last:-the start job failed}." >&2
  journal_since "$t0" >&2
fi
if [ "$verb" = start ]; then
  exit 1  # the unit did not change: nothing to restore, nothing to remove
fi
if [ -f "$path.tensorless-prev" ]; then
  mv -f "$path.tensorless-prev" "$path"
  # poll the restored unit where it serves (its own health label), not the new unit's address
  back=$(health_url "$path")
  [ -n "$back" ] && url=$back
  if [ -f "$path.tensorless-prev-sha" ]; then mv -f "$path.tensorless-prev-sha" "$path.tensorless-sha"; fi
  systemctl daemon-reload
  timeout "$timeout" systemctl restart "$svc" 2>/dev/null
  if poll "$timeout"; then
    echo "restored the previous unit; it is healthy again" >&2
  else
    echo "restored the previous unit, but it is not healthy either: $last" >&2
  fi
else
  systemctl stop "$svc" 2>/dev/null
  [ "$kind" = service ] && systemctl disable -q "$svc" 2>/dev/null
  rm -f "$path" "$path.tensorless-sha"
  systemctl daemon-reload
  echo "removed the new unit: nothing served here before it" >&2
fi
exit 1
