#!/bin/sh
# needs: lib.sh
# Download the model into its partial file with resume, hashing the bytes as they arrive (the
# prefix an earlier run left is hashed first), never past size bytes; admit it by sha256.
# auth: a 0600 file holding the Authorization header (curl -H @file), or "" for none.
# owner: the pid of the process holding the host's lock for the run that started this (the
# fleet's run-lock.sh), or "" for none: once it is gone (the run ended, was interrupted, or lost
# its link) the download stops, and the partial keeps what arrived.
# lock: the flock every writer of the partial holds (model-receive.sh too); this download's
# other files go beside it.
: "${blob:?}" "${stamp:?}" "${snapshot:?}" "${target:?}" "${sha:?}" "${partial:?}" "${size:?}"
: "${url:?}" "${attempts:?}" "${lock:?}"
: "${auth=}" "${owner=}"
umask 022
mkdir -p "$(dirname "$blob")" "$(dirname "$stamp")" "$(dirname "$snapshot")"
# this download's own files, beside its lock (never among the blobs the survey lists)
work=$(dirname "$lock")
mkdir -p "$work"
rc_file="$work/$sha.curl-rc"
pid_file="$work/$sha.curl-pid"
headers="$work/$sha.headers"
stopped="$work/$sha.stopped"
refused="$work/$sha.refused"
full="$work/$sha.full"
watchdog=
cleanup() {
  if [ -n "$watchdog" ]; then kill "$watchdog" 2>/dev/null; fi
  rm -f "$rc_file" "$pid_file" "$headers" "$stopped" "$refused" "$full"
  if [ -n "$auth" ]; then rm -f "$auth"; fi
}
trap cleanup EXIT
# One download into one partial at a time: a download still running (one whose run is gone and
# is being stopped, or an orphaned curl, which holds the lock too) is waited for, never joined.
if command -v flock >/dev/null 2>&1; then
  exec 8>>"$lock"
  if ! flock -w 60 8; then
    echo "another download of $partial is still running on this host after 60 s:" \
      "refused, the partial is left to it" >&2
    exit 1
  fi
fi
rm -f "$rc_file" "$pid_file" "$headers" "$stopped" "$refused" "$full"
if [ -n "$owner" ]; then
  main=$$
  (
    while kill -0 "$owner" 2>/dev/null; do sleep 1; done
    : > "$stopped"
    while kill -0 "$main" 2>/dev/null; do
      if [ -s "$pid_file" ]; then kill "$(cat "$pid_file")" 2>/dev/null; fi
      sleep 1
    done
  ) 8>&- > /dev/null 2>&1 &
  watchdog=$!
fi

# trim TEXT: without its leading and trailing blanks
trim() {
  t=${1#"${1%%[! ]*}"}
  printf '%s' "${t%"${t##*[! ]}"}"
}

# answer: status, ctype, clen, crange of the last response in the curl -D dump ("-": absent)
answer() {
  status=- ctype=- clen=- crange=-
  while IFS= read -r line; do
    case "$line" in
      http/*)
        status=${line#* }
        status=${status%% *}
        ctype=- clen=- crange=-
        ;;
      content-type:*) ctype=$(trim "${line#*:}") ctype=${ctype%%;*} ;;
      content-length:*) clen=$(trim "${line#*:}") ;;
      content-range:*) crange=$(trim "${line#*:}") crange=${crange#bytes } ;;
    esac
  done <<EOF
$(tr -d '\r' < "$headers" | tr '[:upper:]' '[:lower:]')
EOF
}

# not_the_file FROM: why the last response is not the file's bytes from FROM on (empty: it is):
# its status, type and length must agree with what was asked
not_the_file() {
  answer
  bad=
  case "$ctype" in
    text/* | application/json | *+json | application/xml | *+xml | application/javascript)
      bad="Content-Type $ctype"
      ;;
  esac
  if [ "$1" -eq 0 ] && [ "$status" = 200 ]; then
    if [ "$clen" != - ] && [ "$clen" != "$size" ]; then bad="${bad:+$bad, }Content-Length $clen"; fi
  elif [ "$status" = 206 ]; then
    case "$crange" in
      "$1"-*/"$size") ;;
      *) bad="${bad:+$bad, }Content-Range $crange" ;;
    esac
  else
    bad="${bad:+$bad, }status $status"
  fi
  if [ -n "$bad" ]; then
    echo "the model server's answer was not the file (HTTP $status: $bad, where bytes $1-" \
      "of its $size were asked)"
  fi
}

# free_space DIR: "BYTES FILESYSTEM MOUNTPOINT" free on DIR's filesystem (df -P, in sh alone)
free_space() {
  df -Pk "$1" 2> /dev/null | {
    read -r _
    read -r fs _ _ avail _ mnt && echo "$((avail * 1024)) $fs $mnt"
  }
}

have=$(size_of "$partial")
[ "$have" -le "$size" ] || { rm -f "$partial"; have=0; }
start=$have
# One stream into one hash: the bytes already here, then every attempt's bytes as tee appends
# them. Each attempt asks for the rest only (curl -C), refuses a longer announced length
# (--max-filesize) and is cut one byte past the size whatever the server sends (head -c). An
# answer that is not the file (a page, a short JSON body: its status, type or length disagree
# with what was asked) is cut back off the partial, and the download stops there.
got=$(
  {
    [ "$have" -eq 0 ] || head -c "$have" "$partial"
    n=0
    while [ "$have" -lt "$size" ] && [ "$n" -lt "$attempts" ] && [ ! -e "$stopped" ]; do
      n=$((n + 1))
      rest=$((size - have))
      {
        if [ -n "$auth" ]; then
          curl -fsSL --connect-timeout 10 --speed-limit 1024 --speed-time 60 -C "$have" \
            --max-filesize "$rest" -D "$headers" -H "@$auth" "$url" &
        else
          curl -fsSL --connect-timeout 10 --speed-limit 1024 --speed-time 60 -C "$have" \
            --max-filesize "$rest" -D "$headers" "$url" &
        fi
        echo $! > "$pid_file"
        wait $!
        echo $? > "$rc_file"
        rm -f "$pid_file"
      } | head -c $((rest + 1)) | tee -a "$partial"
      before=$have
      have=$(size_of "$partial")
      rc=$(cat "$rc_file" 2>/dev/null || echo "?")
      if [ "$have" -gt "$size" ]; then break; fi
      if [ "$have" -gt "$before" ] && [ -s "$headers" ]; then
        why=$(not_the_file "$before")
        if [ -n "$why" ]; then
          dd if=/dev/null of="$partial" bs=1 seek="$before" 2> /dev/null
          have=$before
          echo "$why" > "$refused"
          break
        fi
      fi
      if [ "$rc" = 63 ]; then
        echo "the server announced more than the recipe's $size bytes (curl exit 63)" >&2
        break
      fi
      if [ "$have" -lt "$size" ]; then
        IFS=' ' read -r free fs mount <<EOF
$(free_space "$(dirname "$partial")")
EOF
        if [ -n "$free" ] && [ "$free" -lt $((size - have)) ]; then
          echo "the disk is full: $mount ($fs) has $free bytes free, and the model needs" \
            "$((size - have)) more (of $size) in $(dirname "$partial")" > "$full"
          break
        fi
        if [ ! -e "$stopped" ]; then echo "curl exit $rc (attempt $n), resuming" >&2; fi
      fi
    done
  } | hash_stream
)
rc=$(cat "$rc_file" 2>/dev/null || echo "?")
refuse_oversize "the downloaded file"
if [ "$rc" = 63 ]; then
  rm -f "$partial"
  echo "refused and deleted $partial: the file there is not the recipe's" >&2
  exit 1
fi
have=$(size_of "$partial")
if [ -e "$refused" ]; then
  echo "$(cat "$refused"): nothing of it was kept, the partial stays at $have bytes;" \
    "run deploy again once the server serves the file" >&2
  exit 1
fi
if [ -e "$stopped" ]; then
  echo "stopped at $have of $size bytes: the run that started this download is gone" \
    "(interrupted, or its link cut); the next deploy resumes from here" >&2
  exit 1
fi
if [ -e "$full" ]; then
  echo "$(cat "$full"): free space there (tensorless-deploy prune removes model files and" \
    "images no unit uses) or set tensorless_models_dir to a larger filesystem, then run deploy" \
    "again to resume from $have bytes" >&2
  exit 1
fi
if [ "$have" -ne "$size" ]; then
  echo "download of $url stopped at $have of $size bytes after $attempts attempts;" \
    "run deploy again to resume" >&2
  exit 1
fi
admit "downloaded file" "$got"
stamp_and_link
echo "downloaded $((size - start)) bytes (resumed from $start), sha256 verified as they arrived"
