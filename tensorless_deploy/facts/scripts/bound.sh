#!/bin/sh
# How the survey runs its probes (facts.survey.survey_script), each under one time bound:
#   td_start SECONDS SCRIPT   start SCRIPT in `sh -c` (stdin /dev/null, stderr into stdout) in
#                             the background, its output to a file of its own;
#   td_wait                   wait until every probe started has ended, or the bound has passed;
#   td_show                   print the next probe's output (in the order they were started) and
#                             return its exit status: 124 when it did not end in time.
# coreutils `timeout` (where the host has it) ends a probe that runs past SECONDS with its whole
# process group: exit 124 (137 when it had to SIGKILL). A probe no signal can end (nvidia-smi in
# uninterruptible sleep on a wedged GPU: SIGKILL waits for the driver) is left behind SECONDS + 5
# after the start: it reads as 124 and the survey goes on. Its output goes to a file, never to the
# SSH channel, so it holds nothing open. The probes run side by side: a survey takes as long as
# its slowest probe. The watchdog is one plain `sleep` that the last probe to end kills, so
# `wait` on it returns at the first of the two.
td_dir=$(mktemp -d "${TMPDIR:-/tmp}/tensorless-survey.XXXXXX") || exit 1
trap 'rm -rf "$td_dir"' EXIT
td_n=0
td_shown=0
td_bound=0
td_start() {
  td_n=$((td_n + 1))
  [ "$1" -gt "$td_bound" ] && td_bound=$1
  if command -v timeout >/dev/null 2>&1; then
    td_run="timeout -k 2 $1"
  else
    td_run=
  fi
  td_i=$td_n
  (
    # shellcheck disable=SC2086  # td_run is the command prefix, split on purpose
    $td_run sh -c "$2" </dev/null >"$td_dir/$td_i.out" 2>&1
    echo "$?" >"$td_dir/$td_i.rc.part" && mv "$td_dir/$td_i.rc.part" "$td_dir/$td_i.rc"
    td_left=0
    for td_f in "$td_dir"/*.started; do
      [ -f "${td_f%.started}.rc" ] || td_left=1
    done
    if [ "$td_left" = 0 ] && [ -f "$td_dir/watchdog" ]; then
      kill "$(cat "$td_dir/watchdog")" 2>/dev/null
    fi
  ) </dev/null >/dev/null 2>&1 &
  : >"$td_dir/$td_i.started"
}
td_wait() {
  td_left=0
  for td_f in "$td_dir"/*.started; do
    [ -f "$td_f" ] || continue
    [ -f "${td_f%.started}.rc" ] || td_left=1
  done
  [ "$td_left" = 0 ] && return 0
  if command -v timeout >/dev/null 2>&1; then td_s=$((td_bound + 5)); else td_s=$td_bound; fi
  sleep "$td_s" >/dev/null 2>&1 &
  echo "$!" >"$td_dir/watchdog"
  td_sleep=$!
  # a probe that ended while the watchdog was being started
  td_left=0
  for td_f in "$td_dir"/*.started; do
    [ -f "${td_f%.started}.rc" ] || td_left=1
  done
  [ "$td_left" = 0 ] && kill "$td_sleep" 2>/dev/null
  wait "$td_sleep" 2>/dev/null
  return 0
}
td_show() {
  td_shown=$((td_shown + 1))
  cat "$td_dir/$td_shown.out" 2>/dev/null
  if [ -f "$td_dir/$td_shown.rc" ]; then
    return "$(cat "$td_dir/$td_shown.rc")"
  fi
  return 124
}
