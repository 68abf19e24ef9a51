# shellcheck shell=sh
# needs: host.sh
# Functions the model scripts share; prepended to them, with their parameters bound before
# (hashit, hash_stream and stamp_of: host.sh).
# shellcheck disable=SC2154  # blob, partial, sha, stamp, snapshot, target: the caller's params

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
  stamp_of "$blob" > "$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
}
