#!/bin/sh
# The host's HAProxy, as installed from its packages: at least major.minor, else a failure naming
# the version found.
: "${haproxy:?}" "${major:?}" "${minor:?}"
line=$("$haproxy" -v 2>/dev/null | head -n 1)
have=$(printf '%s\n' "$line" | sed -n 's/^HAProxy version \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1/p')
sub=$(printf '%s\n' "$line" | sed -n 's/^HAProxy version \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\2/p')
if [ -z "$have" ] || [ -z "$sub" ]; then
  echo "$haproxy -v printed no HAProxy version (got: $line)" >&2
  exit 1
fi
if [ "$have" -lt "$major" ] || { [ "$have" -eq "$major" ] && [ "$sub" -lt "$minor" ]; }; then
  echo "HAProxy $have.$sub is older than $major.$minor (json_query): upgrade this host's haproxy" >&2
  exit 1
fi
echo "HAProxy $have.$sub"
