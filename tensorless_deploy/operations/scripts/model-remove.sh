#!/bin/sh
# Remove a model blob no unit references: the links to it, the blob, its stamp, empty folders.
: "${blob:?}" "${stamp:?}"
repo=$(dirname "$(dirname "$blob")")
sha=$(basename "$blob")
if [ -d "$repo/snapshots" ]; then
  find "$repo/snapshots" -type l -lname "*/blobs/$sha" -delete
fi
rm -f "$blob"
# the stamp is named by the content hash: it is this blob's only when it names this blob
if [ -f "$stamp" ] && grep -q " $blob\$" "$stamp"; then rm -f "$stamp"; fi
find "$repo" -depth -type d -empty -delete 2>/dev/null
echo "removed $blob"
true
