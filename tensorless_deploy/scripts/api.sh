# shellcheck shell=sh
# needs: host.sh
# shellcheck disable=SC2154  # td_*: host.sh's parameters, bound before
# A serving instance's API read on the host (tensorless_deploy.shell: a base library, as host.sh
# is, for the scripts of every layer): `api_get`, the one GET with the unit's API key (status's
# /metrics, units.sh; the drain's /slots), `in_flight` and `wait_idle`, the wait before a unit
# that serves is restarted or stopped until its requests in flight finished.

api_get() {  # api_get URL [KEY_FILE]: URL's body, then a last line "@@http CODE" (000: none)
  # the unit's API key, where it has one, goes as a header read from curl's stdin (-H @-),
  # never in argv; -k: inside the host, the certificate names the host, not its loopback
  if [ -n "${2:-}" ] && [ -r "$2" ]; then
    { printf 'Authorization: Bearer '; cat "$2"; } |
      curl -s -k --max-time "$td_http_max_time" -H @- -w '\n@@http %{http_code}' "$1" 2>/dev/null
  else
    curl -s -k --max-time "$td_http_max_time" -w '\n@@http %{http_code}' "$1" 2>/dev/null
  fi
}

in_flight() {  # in_flight HEALTH_URL [KEY_FILE]: the requests llama-server works on now
  # /slots' slots that are processing (on by default), else /metrics' requests_processing
  # (where the unit enables it); nothing printed: neither answered, so it cannot be told
  _td_body=$(api_get "${1%/health}/slots" "${2:-}")
  case $_td_body in
    *"@@http 200")
      printf '%s\n' "$_td_body" | grep -o '"is_processing": *true' | wc -l | tr -d ' '
      return 0 ;;
  esac
  _td_body=$(api_get "${1%/health}/metrics" "${2:-}")
  case $_td_body in
    *"@@http 200")
      printf '%s\n' "$_td_body" | sed -n 's/^llamacpp:requests_processing \([0-9]*\).*$/\1/p' |
        head -n 1 ;;
  esac
}

wait_idle() {  # wait_idle HEALTH_URL KEY_FILE SECONDS WHAT: until no request is in flight
  # (bounded by SECONDS; 0: no wait), then one line saying how it went; WHAT is what happens
  # next ("restarted", "stopped", ...). Idle is two reads in a row half a second apart: a
  # request queued behind a busy slot shows in no slot until the one before it ends. A server
  # that does not answer has nothing to drain.
  [ "$(http_code "$1")" = 200 ] || return 0
  _td_t0=$(date +%s)
  _td_n=$(in_flight "$1" "$2")
  if [ -z "$_td_n" ]; then
    echo "drain: cannot tell the requests in flight (neither /slots nor /metrics answered)"
    return 0
  fi
  _td_first=$_td_n
  _td_idle=0
  while [ "$(( $(date +%s) - _td_t0 ))" -lt "$3" ]; do
    if [ "$_td_n" -gt 0 ]; then _td_idle=0; else _td_idle=$((_td_idle + 1)); fi
    [ "$_td_idle" -ge 2 ] && break
    sleep 0.5
    _td_n=$(in_flight "$1" "$2")
    [ -n "$_td_n" ] || _td_n=0
  done
  _td_took=$(( $(date +%s) - _td_t0 ))
  if [ "$_td_n" -gt 0 ]; then
    echo "drain: $4 with $_td_n requests in flight after ${_td_took}s (drain timeout ${3}s)"
  elif [ "$_td_first" -gt 0 ]; then
    echo "drain: idle after ${_td_took}s ($_td_first requests were in flight)"
  else
    echo "drain: idle (no request in flight)"
  fi
}
