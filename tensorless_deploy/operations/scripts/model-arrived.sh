#!/bin/sh
# needs: lib.sh
# The controller pushed the bytes into the partial file, and the host hashed them as they
# arrived (model-receive.sh left "SHA256 SIZE MTIME" beside it): admit them by that hash. A
# partial without a record that still names its size and mtime is hashed here instead.
: "${blob:?}" "${stamp:?}" "${snapshot:?}" "${target:?}" "${sha:?}" "${partial:?}" "${size:?}"
refuse_oversize "the pushed model"
have=$(size_of "$partial")
if [ "$have" -ne "$size" ]; then
  echo "the pushed model is $have of $size bytes; run deploy again to resume" >&2
  exit 1
fi
got=""
if [ -f "$partial.sha256" ]; then
  read -r rsha rsize rmtime < "$partial.sha256" || true
  if [ "$rsize $rmtime" = "$(stat -c '%s %Y' "$partial")" ]; then got=$rsha; fi
fi
[ -n "$got" ] || got=$(hashit "$partial")
admit "the pushed model" "$got"
stamp_and_link
echo "pushed model verified: sha256 $sha"
