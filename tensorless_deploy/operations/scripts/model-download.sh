#!/bin/sh
# needs: lib.sh
# Download the model into its partial file with resume (curl -C -), then admit it by sha256.
# auth: a 0600 file holding the Authorization header (curl -H @file), or "" for none.
: "${blob:?}" "${stamp:?}" "${snapshot:?}" "${target:?}" "${sha:?}" "${partial:?}" "${size:?}"
: "${url:?}" "${attempts:?}"
: "${auth=}"
umask 022
mkdir -p "$(dirname "$blob")" "$(dirname "$stamp")" "$(dirname "$snapshot")"
have=$(stat -c %s "$partial" 2>/dev/null || echo 0)
[ "$have" -le "$size" ] || { rm -f "$partial"; have=0; }
start=$have
n=0
while [ "$have" -lt "$size" ] && [ "$n" -lt "$attempts" ]; do
  n=$((n + 1))
  if [ -n "$auth" ]; then
    curl -fsSL --connect-timeout 10 --speed-limit 1024 --speed-time 60 -C - -H "@$auth" \
      -o "$partial" "$url" || echo "curl exit $? (attempt $n), resuming" >&2
  else
    curl -fsSL --connect-timeout 10 --speed-limit 1024 --speed-time 60 -C - \
      -o "$partial" "$url" || echo "curl exit $? (attempt $n), resuming" >&2
  fi
  have=$(stat -c %s "$partial" 2>/dev/null || echo 0)
done
if [ -n "$auth" ]; then rm -f "$auth"; fi
if [ "$have" -ne "$size" ]; then
  echo "download of $url stopped at $have of $size bytes after $n attempts;" \
    "run deploy again to resume" >&2
  exit 1
fi
admit "downloaded file"
stamp_and_link
echo "downloaded $((size - start)) bytes (resumed from $start), sha256 verified"
