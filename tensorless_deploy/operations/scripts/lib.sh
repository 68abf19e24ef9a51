# shellcheck shell=sh
# Functions the model scripts share; prepended to them, with their parameters bound before.
# shellcheck disable=SC2154  # blob, partial, sha, stamp, snapshot, target: the caller's params

hashit() {  # OpenSSL where the host has it: six times faster than coreutils sha256sum
  (openssl dgst -sha256 -r "$1" 2>/dev/null || sha256sum "$1") | cut -d" " -f1
}

hash_stream() {  # the sha256 of stdin, as the bytes arrive (never a second read of a file)
  if command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r; else sha256sum; fi |
    cut -d" " -f1
}

size_of() { stat -c %s "$1" 2>/dev/null || echo 0; }

admit() {  # admit WHAT GOT: the complete partial becomes the blob only with the recipe's sha256
  if [ "$2" != "$sha" ]; then
    rm -f "$partial" "$partial.sha256"
    echo "$1 has sha256 $2, not $sha: refused and deleted" >&2
    exit 1
  fi
  rm -f "$partial.sha256"
  mv -f "$partial" "$blob"
}

refuse_oversize() {  # refuse_oversize WHAT: more bytes than size_bytes is never the file
  if [ "$(size_of "$partial")" -gt "$size" ]; then
    rm -f "$partial" "$partial.sha256"
    echo "$1 is longer than the recipe's $size bytes: stopped there, refused and deleted" >&2
    exit 1
  fi
}

stamp_and_link() {  # the snapshot link, and the stamp that spares the next run a hash
  mkdir -p "$(dirname "$stamp")" "$(dirname "$snapshot")"
  ln -sfn "$target" "$snapshot"
  echo "$(stat -c '%s %Y' "$blob") $blob" > "$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
}
