#!/bin/sh
# Stop and remove a unit (and with purge=yes its model file); nothing there is not an error.
: "${path:?}" "${svc:?}" "${kind:?}" "${purge:?}"
: "${blob=}" "${partial=}" "${stamp=}" "${snapshot=}" "${repo_dir=}"
if [ -f "$path" ]; then
  timeout 60 systemctl stop "$svc" 2>/dev/null
  [ "$kind" = service ] && systemctl disable -q "$svc" 2>/dev/null
  rm -f "$path" "$path.tensorless-prev" "$path.tensorless-sha" "$path.tensorless-prev-sha"
  systemctl daemon-reload
  systemctl reset-failed "$svc" 2>/dev/null
  echo "stopped $svc and removed $path"
fi
if [ "$purge" = yes ]; then
  rm -f "$blob" "$partial" "$stamp" "$snapshot"
  find "$repo_dir" -depth -type d -empty -delete 2>/dev/null
  echo "removed the model file $blob"
fi
true
