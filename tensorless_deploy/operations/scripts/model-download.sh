#!/bin/sh
# needs: lib.sh
# Download the model into its partial file with resume, hashing the bytes as they arrive (the
# prefix an earlier run left is hashed first), never past size bytes; admit it by sha256.
# auth: a 0600 file holding the Authorization header (curl -H @file), or "" for none.
: "${blob:?}" "${stamp:?}" "${snapshot:?}" "${target:?}" "${sha:?}" "${partial:?}" "${size:?}"
: "${url:?}" "${attempts:?}"
: "${auth=}"
umask 022
mkdir -p "$(dirname "$blob")" "$(dirname "$stamp")" "$(dirname "$snapshot")"
have=$(size_of "$partial")
[ "$have" -le "$size" ] || { rm -f "$partial"; have=0; }
start=$have
rc_file="$partial.curl-rc"
rm -f "$rc_file"
# One stream into one hash: the bytes already here, then every attempt's bytes as tee appends
# them. Each attempt asks for the rest only (curl -C), refuses a longer announced length
# (--max-filesize) and is cut one byte past the size whatever the server sends (head -c).
got=$(
  {
    [ "$have" -eq 0 ] || head -c "$have" "$partial"
    n=0
    while [ "$have" -lt "$size" ] && [ "$n" -lt "$attempts" ]; do
      n=$((n + 1))
      rest=$((size - have))
      {
        if [ -n "$auth" ]; then
          curl -fsSL --connect-timeout 10 --speed-limit 1024 --speed-time 60 -C "$have" \
            --max-filesize "$rest" -H "@$auth" "$url"
        else
          curl -fsSL --connect-timeout 10 --speed-limit 1024 --speed-time 60 -C "$have" \
            --max-filesize "$rest" "$url"
        fi
        echo $? > "$rc_file"
      } | head -c $((rest + 1)) | tee -a "$partial"
      have=$(size_of "$partial")
      rc=$(cat "$rc_file" 2>/dev/null || echo "?")
      if [ "$have" -gt "$size" ]; then break; fi
      if [ "$rc" = 63 ]; then
        echo "the server announced more than the recipe's $size bytes (curl exit 63)" >&2
        break
      fi
      if [ "$have" -lt "$size" ]; then echo "curl exit $rc (attempt $n), resuming" >&2; fi
    done
    if [ "$have" -lt "$size" ]; then
      echo "download of $url stopped at $have of $size bytes after $n attempts;" \
        "run deploy again to resume" >&2
    fi
  } | hash_stream
)
rc=$(cat "$rc_file" 2>/dev/null || echo "?")
rm -f "$rc_file"
if [ -n "$auth" ]; then rm -f "$auth"; fi
refuse_oversize "the downloaded file"
if [ "$rc" = 63 ]; then
  rm -f "$partial"
  echo "refused and deleted $partial: the file there is not the recipe's" >&2
  exit 1
fi
[ "$(size_of "$partial")" -eq "$size" ] || exit 1
admit "downloaded file" "$got"
stamp_and_link
echo "downloaded $((size - start)) bytes (resumed from $start), sha256 verified as they arrived"
