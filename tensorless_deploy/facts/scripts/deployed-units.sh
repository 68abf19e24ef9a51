#!/bin/sh
# Every unit tensorless-deploy wrote on this host and what runs from it, for status and bench
# (read by facts.deployed.parse_deployed_units): per unit its kind, systemd state, the labels the
# file carries, the running container's labels and image, and /health at the labelled URL.
for f in /etc/containers/systemd/tensorless-*.container /etc/systemd/system/tensorless-*.service; do
  [ -f "$f" ] || continue
  b=$(basename "$f"); n=${b%.*}
  case "$f" in *.container) k=quadlet;; *) k=service;; esac
  echo "@@unit $n $k"
  echo "@@active $(systemctl is-active "$n.service" 2>/dev/null)"
  grep -o 'io\.tensorless\.[a-z-]*=[^" ]*' "$f" | sed 's/^/Label=/'
  # only the fields status needs: labels, image reference, image id (one line, tab-separated)
  if command -v podman >/dev/null 2>&1; then
    eng=podman; fmt='{{json .Config.Labels}}	{{.ImageName}}	{{.Image}}'
  else
    eng=docker; fmt='{{json .Config.Labels}}	{{.Config.Image}}	{{.Image}}'
  fi
  info=$($eng inspect --format "$fmt" "$n" 2>/dev/null) ||
    { sleep 1; info=$($eng inspect --format "$fmt" "$n" 2>/dev/null); }
  echo "@@inspect $info"
  url=$(grep -o 'io\.tensorless\.health=[^" ]*' "$f" | head -n 1 | cut -d= -f2-)
  if [ -n "$url" ]; then
    echo "@@health $(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "$url" 2>/dev/null)"
  fi
done
true
