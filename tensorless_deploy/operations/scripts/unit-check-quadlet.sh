#!/bin/sh
# Let quadlet itself read the new unit before it replaces anything.
: "${new:?}" "${name:?}" "${quadlet:?}"
d=$(mktemp -d) && cp "$new" "$d/$name" && QUADLET_UNIT_DIRS="$d" "$quadlet" -dryrun >/dev/null 2>"$d/err"
rc=$?
if [ $rc -ne 0 ]; then
  cat "$d/err" >&2
  rm -rf "$d" "$new"
  echo "quadlet refused the new unit; the old one is untouched" >&2
  exit 1
fi
rm -rf "$d"
