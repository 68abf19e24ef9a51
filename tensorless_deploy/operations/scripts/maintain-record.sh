#!/bin/sh
# The maintenance window's record, written whole (temp name, then rename) or not at all.
: "${record:?}" "${text:?}"
mkdir -p "$(dirname "$record")"
umask 022
printf '%s' "$text" > "$record.tensorless-new" && mv -f "$record.tensorless-new" "$record" || exit 1
echo "maintenance window recorded in $record"
