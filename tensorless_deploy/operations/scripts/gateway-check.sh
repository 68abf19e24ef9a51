#!/bin/sh
# The host's HAProxy, as installed from its packages: at least major.minor, else a failure naming
# the version found.
: "${haproxy:?}" "${major:?}" "${minor:?}"
line=$("$haproxy" -v 2>/dev/null | head -n 1)
v=$(printf '%s\n' "$line" | sed -n 's/^HAProxy version \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p')
if [ -z "$v" ]; then
  echo "$haproxy -v printed no HAProxy version (got: $line)" >&2
  exit 1
fi
set -- $v
if [ "$1" -lt "$major" ] || { [ "$1" -eq "$major" ] && [ "$2" -lt "$minor" ]; }; then
  echo "HAProxy $1.$2 is older than $major.$minor (json_query): upgrade this host's haproxy" >&2
  exit 1
fi
echo "HAProxy $1.$2"
