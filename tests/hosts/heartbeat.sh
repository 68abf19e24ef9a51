# shellcheck shell=bash
# heartbeat WHAT LOG COMMAND...: run COMMAND with its output in LOG, and while it runs say every
# HEARTBEAT_S seconds (default 10) on stderr that WHAT is still at it, with the elapsed time and
# the last line it wrote (pip's "Collecting ...", "Installing ..."): a long step is never
# silent. On failure the log's last lines follow. Returns COMMAND's exit status. (./demo)
heartbeat() {
  local what=$1 log=$2
  shift 2
  local every=${HEARTBEAT_S:-10} start=$SECONDS last=$SECONDS pid rc line
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - last)) -ge "$every" ] && kill -0 "$pid" 2>/dev/null; then
      last=$SECONDS
      line=$(tail -n 1 "$log" 2>/dev/null | cut -c1-100)
      echo "$what: $((SECONDS - start)) s${line:+ ($line)}" >&2
    fi
  done
  rc=0
  wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "$what: failed (exit $rc) after $((SECONDS - start)) s; the last lines of $log:" >&2
    tail -n 15 "$log" >&2
  else
    echo "$what: done in $((SECONDS - start)) s" >&2
  fi
  return "$rc"
}
