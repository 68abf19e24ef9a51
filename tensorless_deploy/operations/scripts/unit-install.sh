#!/bin/sh
# Rename the new unit into place, keeping the old one for a restore.
: "${path:?}" "${new:?}"
if [ -f "$path" ]; then cp -p "$path" "$path.tensorless-prev"; else rm -f "$path.tensorless-prev"; fi
mv -f "$new" "$path"
