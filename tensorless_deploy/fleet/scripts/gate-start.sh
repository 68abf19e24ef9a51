#!/bin/sh
# needs: host.sh
# gate run's scratch instance: the container the deploy path runs (its argv is
# launch.container.run_argv's), as a transient systemd unit of its own name: no unit file, no
# daemon-reload, nothing a serving unit could notice. RuntimeMaxSec bounds it, so a controller
# that vanishes mid-run leaves nothing running for long; KillMode=mixed stops it as podman's own
# units do (SIGTERM to `podman run` alone, which hands it to the container and removes that;
# never to conmon, whose death would leave the container behind). Waits for /health 200
# (refused and 503 mean loading), then names the image the container runs: @image DIGEST.
: "${svc:?}" "${name:?}" "${argv:?}" "${url:?}" "${timeout:?}" "${runtime:?}" "${engine:?}"
eval "set -- $argv"  # argv: shell words quoted by the controller (shlex.join)
if [ "$(systemctl show -p LoadState --value "$svc" 2>/dev/null)" != not-found ] ||
  "$engine" inspect --type container "$name" >/dev/null 2>&1; then
  echo "$svc or its container already exists here: refusing to touch it" >&2
  exit 1
fi
expand=
if systemd-run --help 2>/dev/null | grep -q -- --expand-environment; then
  expand=--expand-environment=no  # systemd 254+: "$" in an argument stays "$"
fi
# shellcheck disable=SC2086  # $expand is one word or none
if ! systemd-run --quiet --collect --unit="$svc" \
  --description="tensorless-deploy gate run: scratch instance $name" \
  --property=RuntimeMaxSec="$runtime" --property=TimeoutStopSec=30 \
  --property=KillMode=mixed $expand -- "$@"; then
  echo "systemd-run could not start $svc" >&2
  exit 1
fi
t0=$(date +%s)
deadline=$((t0 + timeout))
last=
while :; do
  code=$(http_code "$url" || true)
  st=$(systemctl is-active "$svc" 2>/dev/null || true)
  case $st in
    active | activating) ;;
    *) last="the scratch instance ended ($st)"; break ;;
  esac
  if [ "$code" = 200 ]; then
    echo "$svc healthy after $(($(date +%s) - t0)) s at $url"
    if [ "${engine##*/}" = docker ]; then
      id=$("$engine" inspect --format '{{.Image}}' "$name" 2>/dev/null) &&
        "$engine" image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$id" |
        sed -n 's/^.*@/@image /p'
    else
      echo "@image $("$engine" inspect --format '{{.ImageDigest}}' "$name" 2>/dev/null)"
    fi
    exit 0
  fi
  last="HTTP ${code:-000} ($st)"
  [ "$(date +%s)" -ge "$deadline" ] && break
  sleep 1
done
echo "$svc not healthy within $timeout s: $last. Last journal lines:" >&2
journalctl -u "$svc" -n 30 --no-pager -o cat 2>&1 | sed 's/^/  | /' >&2
exit 1
