#!/bin/sh
# Put the door's new configuration in place only once HAProxy's own check accepts it, then make
# the door's unit run it: started (and enabled) when it is not running, restarted when its unit
# changed, else reloaded (hitless: a new worker takes the listeners, the old one finishes its
# connections). new: the new configuration's temporary name ("" when it did not change).
: "${config:?}" "${new=}" "${service:?}" "${haproxy:?}" "${unit_changed:?}"
if [ -n "$new" ]; then
  if ! out=$("$haproxy" -q -c -f "$new" 2>&1); then
    rm -f "$new"
    echo "haproxy -c refused the door's new configuration (the running one is kept): $out" >&2
    exit 1
  fi
  mv -f "$new" "$config" || exit 1
fi
systemctl daemon-reload || exit 1
if ! systemctl is-active --quiet "$service"; then
  systemctl enable --quiet "$service" 2>/dev/null
  systemctl start "$service" || { journalctl -u "$service" -n 20 --no-pager >&2; exit 1; }
  echo "started $service"
elif [ "$unit_changed" = 1 ]; then
  systemctl restart "$service" || exit 1
  echo "restarted $service (its unit changed)"
elif [ -n "$new" ]; then
  systemctl reload "$service" || exit 1
  echo "reloaded $service"
fi
