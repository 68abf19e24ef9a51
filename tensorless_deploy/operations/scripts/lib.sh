# shellcheck shell=sh
# Functions the model scripts share; prepended to them, with their parameters bound before.
# shellcheck disable=SC2154  # blob, partial, sha, stamp, snapshot, target: the caller's params

hashit() {  # OpenSSL where the host has it: six times faster than coreutils sha256sum
  (openssl dgst -sha256 -r "$1" 2>/dev/null || sha256sum "$1") | cut -d" " -f1
}

admit() {  # admit WHAT: the complete partial file becomes the blob only with the recipe's sha256
  got=$(hashit "$partial")
  if [ "$got" != "$sha" ]; then
    rm -f "$partial"
    echo "$1 has sha256 $got, not $sha: refused and deleted" >&2
    exit 1
  fi
  mv -f "$partial" "$blob"
}

stamp_and_link() {  # the snapshot link, and the stamp that spares the next run a hash
  mkdir -p "$(dirname "$stamp")" "$(dirname "$snapshot")"
  ln -sfn "$target" "$snapshot"
  echo "$(stat -c '%s %Y' "$blob") $blob" > "$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
}
