#!/bin/sh
# needs: host.sh
# needs: api.sh
# Stop and remove a unit (and with purge=yes its model file), then read back that it is gone:
# the service not active, its container gone, its port (the unit's io.tensorless.port label)
# closed, its files removed; a container of the unit's name left after the stop is removed too.
# Whatever is left is said on a "left:" line and fails the step; a unit whose stop fails keeps
# its file (it still runs from it). Nothing there is not an error.
: "${path:?}" "${svc:?}" "${kind:?}" "${purge:?}"
: "${blob=}" "${partial=}" "${stamp=}" "${snapshot=}" "${repo_dir=}"
# idle, key: wait up to idle seconds for the instance's requests in flight first (wait_idle)
: "${idle=}" "${key=}"
name=${svc%.service}
left=""
leave() { left="${left:+$left; }$1"; }
said=""
say() { said="${said:+$said; }$1"; }
unit_left() {  # what of the unit is still there, read back from systemd, the engines, ss
  st=$(systemctl is-active "$svc" 2>/dev/null)
  case "$st" in
    active | activating | deactivating | reloading | refreshing) leave "$svc is $st" ;;
  esac
  for e in podman docker; do
    command -v "$e" >/dev/null 2>&1 || continue
    "$e" container inspect "$name" >/dev/null 2>&1 && leave "container $name still exists ($e)"
  done
  if [ -n "$port" ] && command -v ss >/dev/null 2>&1 &&
    ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
    leave "port $port still listening"
  fi
  for f in "$path" "$path.tensorless-prev"; do
    if [ -e "$f" ]; then leave "$f still there"; fi
  done
}
if [ -f "$path" ]; then
  port=$(grep -o 'io\.tensorless\.port=[0-9]*' "$path" | head -n 1 | cut -d= -f2)
  if [ -n "$idle" ] && [ "$(systemctl is-active "$svc" 2>/dev/null)" = active ]; then
    wait_idle "$(health_url "$path")" "$key" "$idle" stopped
  fi
  if out=$(timeout 60 systemctl stop "$svc" 2>&1); then
    [ "$kind" = service ] && systemctl disable -q "$svc" 2>/dev/null
    out=$(rm -f "$path" "$path.tensorless-prev" "$path.tensorless-sha" \
      "$path.tensorless-prev-sha" 2>&1) || say "$out"
    out=$(systemctl daemon-reload 2>&1) || say "daemon-reload: $out"
    systemctl reset-failed "$svc" 2>/dev/null
    # the unit's own container (named as the unit): a plain unit's `podman run --rm` killed by
    # the stop job leaves it behind, exited
    for e in podman docker; do
      command -v "$e" >/dev/null 2>&1 || continue
      if "$e" container inspect "$name" >/dev/null 2>&1; then
        out=$("$e" rm -f "$name" 2>&1 >/dev/null) || say "$e rm -f $name: $out"
      fi
    done
    tries=5  # a container and its socket may take a moment to go after the stop job
  else
    say "systemctl stop $svc failed: $(printf '%s' "$out" | tr '\n' ' ')"
    tries=0  # it still runs from its file: nothing to wait for
  fi
  while :; do
    left=""
    unit_left
    [ -z "$left" ] || [ "$tries" -le 0 ] && break
    tries=$((tries - 1))
    sleep 1
  done
  if [ -z "$left" ]; then
    echo "stopped $svc and removed $path; read back: inactive, container gone${port:+, port $port closed}"
  fi
fi
if [ "$purge" = yes ]; then
  rm -f "$blob" "$partial" "$stamp" "$snapshot"
  find "$repo_dir" -depth -type d -empty -delete 2>/dev/null
  kept=""
  for f in "$blob" "$partial" "$stamp" "$snapshot"; do
    if [ -e "$f" ] || [ -L "$f" ]; then
      leave "$f still there"
      kept=yes
    fi
  done
  [ -z "$kept" ] && echo "removed the model file $blob"
fi
if [ -n "$left" ]; then
  [ -n "$said" ] && echo "$said" >&2
  echo "left: $left" >&2
  echo "fix: see why on the host (systemctl status $svc; journalctl -u $svc -n 20), then run stop again" >&2
  exit 1
fi
true
