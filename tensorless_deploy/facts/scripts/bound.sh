#!/bin/sh
# How the survey runs its probes (facts.survey.survey_script), each under one time bound:
#   td_start SECONDS SCRIPT   start SCRIPT in `sh -c` (stdin /dev/null, stderr into stdout) in
#                             the background, its output to a file of its own;
#   td_wait                   wait until every probe started has ended, or the bound has passed;
#   td_frame N HEAD EXIT      (the survey) queue probe N's output between the line HEAD and
#                             the line EXIT followed by its exit status, in the order called;
#   td_emit                   print everything td_frame queued, with one `cat`;
#   td_show                   (one bounded command) print the next probe's output (in the order
#                             they were started) and return its exit status.
# A probe that did not end in time has exit status 124. coreutils `timeout` (where the host has
# it) ends a probe that runs past SECONDS with its whole process group: exit 124 (137 when it had
# to SIGKILL). A probe no signal can end (nvidia-smi in uninterruptible sleep on a wedged GPU:
# SIGKILL waits for the driver) is left behind SECONDS + 5 after the start: it reads as 124 and
# the survey goes on. Its output goes to a file, never to the SSH channel, so it holds nothing
# open. The probes run side by side: a survey takes as long as its slowest probe. The watchdog is
# one plain `sleep` that the last probe to end kills, so `wait` on it returns at the first of
# the two.
# Few processes per probe (a survey starts about 27 of them on hosts that may have 2 cores): the
# status is one small write (the file is empty until it is whole: `[ -s ]`, no rename), read back
# with the shell's own `read`, and every output is printed by a single `cat`.
td_dir=$(mktemp -d "${TMPDIR:-/tmp}/tensorless-survey.XXXXXX") || exit 1
trap 'rm -rf "$td_dir"' EXIT
td_n=0
td_shown=0
td_bound=0
td_queue=
if command -v timeout >/dev/null 2>&1; then td_timeout=1; else td_timeout=; fi
td_done() {  # every probe started has written its status
  for td_f in "$td_dir"/*.started; do
    [ -f "$td_f" ] || continue
    [ -s "${td_f%.started}.rc" ] || return 1
  done
  return 0
}
td_start() {
  td_n=$((td_n + 1))
  [ "$1" -gt "$td_bound" ] && td_bound=$1
  if [ -n "$td_timeout" ]; then
    td_run="timeout -k 2 $1"
  else
    td_run=
  fi
  td_i=$td_n
  (
    # shellcheck disable=SC2086  # td_run is the command prefix, split on purpose
    $td_run sh -c "$2" </dev/null >"$td_dir/$td_i.out" 2>&1
    echo "$?" >"$td_dir/$td_i.rc"
    if td_done && [ -f "$td_dir/watchdog" ]; then
      read -r td_w <"$td_dir/watchdog" && kill "$td_w" 2>/dev/null
    fi
  ) </dev/null >/dev/null 2>&1 &
  : >"$td_dir/$td_i.started"
}
td_wait() {
  td_done && return 0
  if [ -n "$td_timeout" ]; then td_s=$((td_bound + 5)); else td_s=$td_bound; fi
  sleep "$td_s" >/dev/null 2>&1 &
  echo "$!" >"$td_dir/watchdog"
  td_sleep=$!
  # a probe that ended while the watchdog was being started
  td_done && kill "$td_sleep" 2>/dev/null
  wait "$td_sleep" 2>/dev/null
  return 0
}
td_status() {  # td_status N: probe N's exit status in td_rc (124: it did not end in time)
  td_rc=124
  if [ -s "$td_dir/$1.rc" ]; then read -r td_rc <"$td_dir/$1.rc" || td_rc=124; fi
}
td_frame() {
  td_status "$1"
  printf '%s\n' "$2" >"$td_dir/$1.head"
  [ -f "$td_dir/$1.out" ] || : >"$td_dir/$1.out"
  printf '%s%s\n' "$3" "$td_rc" >"$td_dir/$1.tail"
  td_queue="$td_queue $1.head $1.out $1.tail"
}
td_emit() {
  # relative names: the queue is split on spaces, and the directory's own path may have some
  # shellcheck disable=SC2086
  [ -z "$td_queue" ] || (cd "$td_dir" && exec cat $td_queue)
}
td_show() {
  td_shown=$((td_shown + 1))
  cat "$td_dir/$td_shown.out" 2>/dev/null
  td_status "$td_shown"
  return "$td_rc"
}
