#!/bin/sh
# Write stdin into a secret file: umask 077 throughout, the bytes land in a temporary file made
# by mktemp in the file's own 0700 root directory (never /tmp), which is given its owner and mode
# and renamed over the file. Nothing secret is in argv: the content comes only on stdin.
: "${path:?}" "${group:?}" "${mode:?}"
dir=$(dirname "$path")
(umask 022 && mkdir -p "$(dirname "$dir")") || exit 1
umask 077
mkdir -p "$dir" || exit 1
chown root:root "$dir" && chmod 700 "$dir" || exit 1
tmp=$(mktemp "$dir/.secret.XXXXXXXX") || exit 1
if ! cat > "$tmp" || ! chown "root:$group" "$tmp" || ! chmod "$mode" "$tmp"; then
  rm -f "$tmp"
  echo "could not write $path" >&2
  exit 1
fi
mv -f "$tmp" "$path" || { rm -f "$tmp"; exit 1; }
echo "wrote $path (root:$group, mode $mode)"
