#!/bin/sh
# Rename the new unit into place, keeping the old one (and its recorded sha256) for a restore
# and a later rollback, and record the sha256 of what this tool wrote (status reads it: a unit
# edited by hand no longer matches).
: "${path:?}" "${new:?}" "${sha:?}"
if [ -f "$path" ]; then
  cp -p "$path" "$path.tensorless-prev"
  if [ -f "$path.tensorless-sha" ]; then cp -p "$path.tensorless-sha" "$path.tensorless-prev-sha"; fi
else
  rm -f "$path.tensorless-prev" "$path.tensorless-prev-sha"
fi
mv -f "$new" "$path"
echo "$sha" > "$path.tensorless-sha.tmp" && mv -f "$path.tensorless-sha.tmp" "$path.tensorless-sha"
