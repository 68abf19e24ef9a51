#!/bin/sh
# needs: host.sh
# One hop of a relay, on its sender: send this host's copy of a file to the next host over
# SSH with the hop's own key (stdin; kept 0600 in dir, removed with dir when this ends), the
# receiver's host key pinned (known), no config of this host's read. Only verified bytes go:
# the record model-receive.sh left beside the file must name the expected sha256 and the
# file as it is now; or, with stamp (a blob this host held before the run), the blob must be
# named by that sha256 and its verification stamp be the blob as it is now. The receiver's
# program (relay-grant.sh) says how much it has; the rest is sent from there, and what the
# receiver says is passed on.
: "${dir:?}" "${file:?}" "${sha:?}" "${size:?}" "${addr:?}" "${port:?}" "${user:?}" "${known:?}"
: "${stamp=}"
umask 077
mkdir -p "$dir"
trap 'rm -rf "$dir"; rmdir "${dir%/*}" 2>/dev/null' EXIT
trap 'exit 1' INT TERM HUP
cat > "$dir/key"
printf '%s\n' "$known" > "$dir/known_hosts"
rsha="" rsize="" rmtime=""
if [ -n "$stamp" ]; then
  now=$(stamp_of "$file" 2>/dev/null)
  if [ "${file##*/}" != "$sha" ] || [ -z "$now" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$now" ] ||
    [ "${now%% *}" != "$size" ]; then
    echo "its copy is not verified (no stamp of $file as it is now): not sent" >&2
    exit 3
  fi
else
  [ -f "$file.sha256" ] && read -r rsha rsize rmtime < "$file.sha256"
  if [ "$rsha" != "$sha" ] || [ "$rsize" != "$size" ] ||
    [ "$rsize $rmtime" != "$(stat -c '%s %Y' "$file" 2>/dev/null)" ]; then
    echo "its copy is not verified (no record of sha256 $sha for $file as it is now): not sent" >&2
    exit 3
  fi
fi
mkfifo "$dir/up" "$dir/down"
ssh -F /dev/null -T -i "$dir/key" -o IdentitiesOnly=yes -o BatchMode=yes \
  -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$dir/known_hosts" \
  -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout=10 -o ServerAliveInterval=5 \
  -o ServerAliveCountMax=3 -p "$port" "$user@$addr" < "$dir/up" > "$dir/down" 2> "$dir/err" &
pid=$!
echo "$$ $pid" > "$dir/pids"
exec 4> "$dir/up" 5< "$dir/down"
word="" have=""
read -r word have <&5 || true
if [ "$word" != have ]; then
  exec 4>&-
  wait "$pid"
  echo "the receiver did not start: $(tr '\n' ' ' < "$dir/err")" >&2
  exit 1
fi
tail -c +$((have + 1)) "$file" >&4
exec 4>&-
cat <&5
wait "$pid"
code=$?
if [ "$code" -ne 0 ]; then
  echo "the hop stopped (exit $code): $(tr '\n' ' ' < "$dir/err")" >&2
  exit 1
fi
