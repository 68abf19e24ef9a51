#!/bin/sh
# needs: lib.sh
# Take a file the controller streams on stdin into its partial, resuming: say how many bytes
# are here ("have N"), then append what arrives, never more than size bytes, hashing it on the
# way in (the prefix an earlier run left first). A complete file leaves "SHA256 SIZE MTIME" in
# PARTIAL.sha256 for model-arrived.sh; a longer one is refused and deleted. lock: the flock
# every writer of the partial holds (model-download.sh too): a send an interrupted run left
# still arriving is waited for, never appended to alongside.
: "${partial:?}" "${size:?}" "${lock:?}"
umask 022
mkdir -p "$(dirname "$partial")" "$(dirname "$lock")"
if command -v flock >/dev/null 2>&1; then
  exec 8>>"$lock"
  if ! flock -w 60 8; then
    echo "another writer of $partial is still running on this host after 60 s: refused" >&2
    exit 1
  fi
fi
have=$(size_of "$partial")
[ "$have" -le "$size" ] || { rm -f "$partial"; have=0; }
rm -f "$partial.sha256"
echo "have $have"
got=$(
  {
    [ "$have" -eq 0 ] || head -c "$have" "$partial"
    head -c $((size - have + 1)) | tee -a "$partial"
  } | hash_stream
)
refuse_oversize "the pushed file"
now=$(size_of "$partial")
if [ "$now" -ne "$size" ]; then
  echo "the push stopped at $now of $size bytes; run deploy again to resume" >&2
  exit 1
fi
echo "$got $(stat -c '%s %Y' "$partial")" > "$partial.sha256.tmp"
mv -f "$partial.sha256.tmp" "$partial.sha256"
echo "received $((size - have)) bytes (resumed from $have), sha256 $got"
