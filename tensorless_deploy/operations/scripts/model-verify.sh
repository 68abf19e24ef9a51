#!/bin/sh
# needs: lib.sh
# A blob that is there but not verified by this tool (or changed since): hash it, never trust it.
: "${blob:?}" "${stamp:?}" "${snapshot:?}" "${target:?}" "${sha:?}"
got=$(hashit "$blob")
if [ "$got" != "$sha" ]; then
  rm -f "$blob" "$stamp"
  echo "model file $blob has sha256 $got, not $sha: removed it; run deploy again" >&2
  exit 1
fi
stamp_and_link
echo "model file $blob verified: sha256 $sha"
