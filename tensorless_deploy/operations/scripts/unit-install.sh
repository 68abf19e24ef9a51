#!/bin/sh
# Rename the new unit into place, keeping the old one (and its recorded sha256) for a restore
# and a later rollback, and record the sha256 of what this tool wrote (status reads it: a unit
# edited by hand no longer matches).
: "${path:?}" "${new:?}" "${sha:?}" "${model=}"
# A unit of the same name that serves another model is never replaced (two recipes whose names
# fold to one unit name): the new file is dropped and the old unit keeps serving.
if [ -n "$model" ] && [ -f "$path" ]; then
  have=$(grep -o 'io\.tensorless\.model=[^" ]*' "$path" | head -n 1 | cut -d= -f2-)
  fold() { printf '%s' "$1" | tr '[:upper:]' '[:lower:]'; }
  if [ -n "$have" ] && [ "$(fold "$have")" != "$(fold "$model")" ]; then
    rm -f "$new"
    echo "refusing to replace $path: it serves $have, not $model (two recipes share this unit name)" >&2
    exit 1
  fi
fi
if [ -f "$path" ]; then
  cp -p "$path" "$path.tensorless-prev"
  if [ -f "$path.tensorless-sha" ]; then cp -p "$path.tensorless-sha" "$path.tensorless-prev-sha"; fi
else
  rm -f "$path.tensorless-prev" "$path.tensorless-prev-sha"
fi
mv -f "$new" "$path"
echo "$sha" > "$path.tensorless-sha.tmp" && mv -f "$path.tensorless-sha.tmp" "$path.tensorless-sha"
