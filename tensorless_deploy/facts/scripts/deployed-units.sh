#!/bin/sh
# Every unit tensorless-deploy wrote on this host and what runs from it, for status, stop, logs,
# bench, rollback and prune (read by facts.parsers.parse_deployed_units). Per unit: its kind and
# path, systemd's view of it, the file's sha256 and the one this tool recorded when it wrote it,
# whether a previous unit is kept (rollback), the file itself (one @@text line per line), the
# running container's labels and image, and /health at the labelled URL.
hashit() { (openssl dgst -sha256 -r "$1" 2>/dev/null || sha256sum "$1") | cut -d' ' -f1; }
for f in /etc/containers/systemd/tensorless-*.container /etc/systemd/system/tensorless-*.service; do
  [ -f "$f" ] || continue
  b=$(basename "$f"); n=${b%.*}
  case "$f" in *.container) k=quadlet;; *) k=service;; esac
  echo "@@unit $n $k $f"
  echo "@@active $(systemctl is-active "$n.service" 2>/dev/null)"
  echo "@@systemd $(systemctl show -p NRestarts -p Result -p SubState --value "$n.service" 2>/dev/null | tr '\n' ' ')"
  echo "@@sha $(hashit "$f") $(cat "$f.tensorless-sha" 2>/dev/null)"
  if [ -f "$f.tensorless-prev" ]; then
    echo "@@prev $(hashit "$f.tensorless-prev")"
    sed 's/^/@@prevtext /' "$f.tensorless-prev"
  fi
  sed 's/^/@@text /' "$f"
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
    echo "@@health $(curl -s -k -o /dev/null -w '%{http_code}' --max-time 3 "$url" 2>/dev/null)"
  fi
done
true
