# shellcheck shell=sh
# Functions the unit scripts share (activate, rollback): where the instance says it runs. The rule
# is decisions.device.device_verdict's; tests/decisions/device/ holds both to the same cases.
# shellcheck disable=SC2154  # device_re: the caller's parameter (facts.device.DEVICE_LINE)

device_label() {  # device_label FILE: the unit's io.tensorless.device label (empty: none)
  grep -o 'io\.tensorless\.device=[^" ]*' "$1" | head -n 1 | cut -d= -f2-
}

device_lines() {  # device_lines SVC: the device lines of SVC's running start, as journald has them
  inv=$(systemctl show -p InvocationID --value "$1" 2>/dev/null)
  [ -n "$inv" ] || return 0
  tries=0
  while :; do
    found=$(journalctl -q --no-pager -o cat _SYSTEMD_INVOCATION_ID="$inv" 2>/dev/null |
      grep -E -m 40 "$device_re" || true)
    # /health answered, so the load (and its log) is over; journald may still be a beat behind
    case $found in *"offloaded "*" layers to GPU"*) break ;; esac
    tries=$((tries + 1))
    [ "$tries" -ge 4 ] && break
    sleep 1
  done
  [ -z "$found" ] || printf '%s\n' "$found"
}

on_card() {  # on_card LABEL < DEVICE LINES: 0 when the lines show the instance where LABEL says
  lines=$(cat)
  [ "$1" = cpu ] && return 0
  want=${1%%@*}
  bus=
  case $1 in *@*) bus=${1#*@} ;; esac
  used=$(printf '%s\n' "$lines" | grep ': using device ' || true)
  [ -n "$used" ] || return 1
  [ "$(printf '%s\n' "$used" | wc -l)" -eq 1 ] || return 1
  case $used in *": using device $want ("*) ;; *) return 1 ;; esac
  if [ -n "$bus" ]; then
    case $used in *") ($bus) - "*) ;; *) return 1 ;; esac
  fi
  n=$(printf '%s\n' "$lines" |
    sed -n 's/.*offloaded \([0-9][0-9]*\)\/[0-9][0-9]* layers to GPU.*/\1/p' | tail -n 1)
  [ "${n:-0}" -gt 0 ]
}
