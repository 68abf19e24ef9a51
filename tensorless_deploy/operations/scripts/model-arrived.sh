#!/bin/sh
# needs: lib.sh
# The controller pushed the bytes into the partial file: verify them on arrival.
: "${blob:?}" "${stamp:?}" "${snapshot:?}" "${target:?}" "${sha:?}" "${partial:?}" "${size:?}"
have=$(stat -c %s "$partial" 2>/dev/null || echo 0)
if [ "$have" -ne "$size" ]; then
  echo "the pushed model is $have of $size bytes; run deploy again to resume" >&2
  exit 1
fi
admit "the pushed model"
stamp_and_link
echo "pushed model verified: sha256 $sha"
