#!/bin/sh
# needs: host.sh
# One line per file of a secrets directory: NAME MODE UID GID SHA256 (nothing: no directory).
# The directory itself first, as "." MODE UID GID -.
: "${dir:?}"
[ -d "$dir" ] || exit 0
echo ". $(stat -c '%a %u %g' "$dir") -"
for f in "$dir"/* "$dir"/.secret.*; do
  [ -f "$f" ] || continue
  echo "${f##*/} $(stat -c '%a %u %g' "$f") $(hashit "$f")"
done
