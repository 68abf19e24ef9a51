#!/bin/sh
# Load an image the controller pushed as an OCI archive; refuse it unless its digest is the pin.
: "${engine:?}" "${archive:?}" "${digest:?}" "${repo:?}" "${image:?}"
rm -f "$archive.sha256"  # the receiver's record; the manifest digest below is what counts
id=$("$engine" pull -q "oci-archive:$archive" 2>&1) || {
  echo "loading the pushed image failed: $id" >&2; rm -f "$archive"; exit 1; }
got=$("$engine" image inspect --format '{{.Digest}}' "$id")
rm -f "$archive"
if [ "$got" != "$digest" ]; then
  "$engine" rmi -f "$id" >/dev/null 2>&1
  echo "the pushed image has digest $got, not $digest: refused and removed" >&2
  exit 1
fi
# an archive carries no repository name: name it, so image@digest resolves without a pull
"$engine" tag "$id" "$repo"
"$engine" image exists "$image" || {
  echo "the pushed image loaded but $image does not resolve to it" >&2; exit 1; }
echo "loaded the pushed image $digest"
