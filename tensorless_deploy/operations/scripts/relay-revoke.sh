#!/bin/sh
# Take a relay's access away from this host: for every hop directory matching the pattern
# (one hop's, or a whole run's), the authorized_keys lines that name it (by its mark, the
# key's comment) removed in place, the file removed if relay-grant.sh created it and nothing
# else was added since, a sender's hop still running stopped, and the directory (the receive
# program, a sender's key) removed.
: "${root:?}" "${pattern:?}"
umask 077
for d in "$root"/$pattern; do
  [ -d "$d" ] || continue
  mark=$(basename "$d")
  # a sender's hop still running (the run was stopped): its shell and its ssh end now
  if [ -f "$d/pids" ]; then xargs kill < "$d/pids" 2>/dev/null || true; fi
  keys=$(cat "$d/keys" 2>/dev/null || true)
  if [ -n "$keys" ] && [ -f "$keys" ]; then
    grep -vF "tensorless-relay-$mark" "$keys" > "$keys.tl-relay" || true
    cat "$keys.tl-relay" > "$keys" && rm -f "$keys.tl-relay"
    if [ -f "$d/created" ] && [ ! -s "$keys" ]; then rm -f "$keys"; fi
  fi
  rm -rf "$d"
done
rmdir "$root" 2>/dev/null || true
echo "revoked"
