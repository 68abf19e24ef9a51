#!/bin/sh
# Hold the host's lock for one run of tensorless-deploy: one change at a time per host. The lock
# is an flock on $lock held by this process, so it is never stale: it goes with the process. It
# holds it while the controller's stream stays open and says something at least every $deadline
# seconds (its heartbeat); at EOF (the run is over, or the controller died) or after $deadline s
# of silence (a cut link) it lets go. Says "locked PID" once held; "held AGE WHO" (and exit 75)
# when another run holds it, after waiting up to $wait s for it.
: "${lock:?}" "${wait:?}" "${deadline:?}" "${who:?}"
record="$lock.who"
umask 022
mkdir -p "$(dirname "$lock")" || exit 1
command -v flock >/dev/null 2>&1 || {
  echo "no flock on this host: the lock needs util-linux's flock" >&2
  exit 1
}
exec 9>>"$lock" || exit 1
if ! flock -n 9; then
  if [ "$wait" -eq 0 ] || ! flock -w "$wait" 9; then
    since=$(sed -n 's/^since=//p' "$record" 2>/dev/null)
    holder=$(sed -n 's/^who=//p' "$record" 2>/dev/null)
    age="?"
    [ -n "$since" ] && age=$(($(date +%s) - since))
    echo "held $age ${holder:-another run (no record of it)}"
    exit 75
  fi
fi
# a record left by a holder that is gone (killed before it could remove it) is replaced here
printf 'who=%s\nsince=%s\npid=%s\n' "$who" "$(date +%s)" "$$" > "$record.tmp" &&
  mv -f "$record.tmp" "$record"
echo "locked $$"
# every heartbeat line is one "beat"; EOF or silence ends the run's hold
while beat=$(timeout "$deadline" head -n 1 9>&-) && [ -n "$beat" ]; do :; done
[ "$(sed -n 's/^pid=//p' "$record" 2>/dev/null)" = "$$" ] && rm -f "$record"
exit 0
