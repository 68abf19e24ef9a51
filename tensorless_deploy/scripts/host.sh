# shellcheck shell=sh
# What every host program shares with the Python side (tensorless_deploy.shell): prepended to a
# script that says "# needs: host.sh", with these values bound from the Python constants
# (shell.host_values): the unit files' directories and name prefix (shell.QUADLET_DIR,
# SYSTEMD_DIR, UNIT_PREFIX; the front door's unit, DOOR_UNIT, is not a model's), the time bound of one GET of a server (shell.HEALTH_TIMEOUT_S) and
# the verification stamp's stat format (hub.STAMP_STAT).
: "${td_unit_prefix:?}" "${td_quadlet_dir:?}" "${td_systemd_dir:?}" "${td_http_max_time:?}"
: "${td_stamp_stat:?}" "${td_door_unit:?}"

hashit() {  # OpenSSL where the host has it: six times faster than coreutils sha256sum
  (openssl dgst -sha256 -r "$1" 2>/dev/null || sha256sum "$1") | cut -d" " -f1
}

hash_stream() {  # the sha256 of stdin, as the bytes arrive (never a second read of a file)
  if command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r; else sha256sum; fi |
    cut -d" " -f1
}

stamp_of() {  # stamp_of FILE: the verification stamp of FILE as it is now (hub.stamp_text)
  stat -c "$td_stamp_stat" "$1"
}

http_code() {  # http_code [-I] URL: the HTTP status a GET (-I: HEAD) of URL answers (000: none)
  # -k: a TLS server's certificate is the operator's; this only asks whether it is up
  curl -s -k -o /dev/null -w '%{http_code}' --max-time "$td_http_max_time" "$@" 2>/dev/null
}

health_url() {  # health_url FILE: the address a unit's io.tensorless.health label names
  grep -o 'io\.tensorless\.health=[^" ]*' "$1" | head -n 1 | cut -d= -f2-
}
