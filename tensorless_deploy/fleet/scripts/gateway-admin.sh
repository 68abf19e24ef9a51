#!/bin/sh
# needs: host.sh
# shellcheck disable=SC2154  # td_*: host.sh's parameters, bound before
# The door's stats page on its root-only unix socket: with an action, set one server of one pool
# to it (drain, ready, maint) first; then print the stats CSV.
: "${socket:?}" "${action=}" "${pool=}" "${server=}"
if [ -n "$action" ]; then
  curl -fsS --max-time "$td_http_max_time" --unix-socket "$socket" -o /dev/null \
    --data "s=$server&action=$action&b=$pool" http://door/ || exit 1
fi
curl -fsS --max-time "$td_http_max_time" --unix-socket "$socket" 'http://door/;csv'
