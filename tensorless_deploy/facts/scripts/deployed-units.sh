#!/bin/sh
# Every unit tensorless-deploy wrote on this host and what runs from it, for status, stop, logs,
# bench, rollback and prune (read by facts.parsers.parse_deployed_units). Per unit: its kind and
# path, systemd's view of it, the file's sha256 and the one this tool recorded when it wrote it,
# whether a previous unit is kept (rollback), the file itself (one @@text line per line), the
# running container's labels and image, and /health at the labelled URL. Given secrets_root (the
# directory of the units' secrets), a unit labelled io.tensorless.metrics=true also has its
# llama-server /metrics read (@@metric NAME VALUE for each llamacpp: sample, @@metrics CODE), with
# the unit's API key sent as a header read from curl's stdin (-H @-), never in argv. Given
# device_re (facts.device.DEVICE_LINE), the device lines of the running start's log
# (@@device LINE): where llama-server says the model went.
: "${secrets_root=}" "${device_re=}"
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
  if [ -n "$device_re" ] && [ "$(systemctl is-active "$n.service" 2>/dev/null)" = active ]; then
    inv=$(systemctl show -p InvocationID --value "$n.service" 2>/dev/null)
    [ -n "$inv" ] && journalctl -q --no-pager -o cat _SYSTEMD_INVOCATION_ID="$inv" 2>/dev/null |
      grep -E -m 40 "$device_re" | sed 's/^/@@device /'
  fi
  url=$(grep -o 'io\.tensorless\.health=[^" ]*' "$f" | head -n 1 | cut -d= -f2-)
  if [ -n "$url" ]; then
    echo "@@health $(curl -s -k -o /dev/null -w '%{http_code}' --max-time 3 "$url" 2>/dev/null)"
    if [ -n "$secrets_root" ] && grep -q 'io\.tensorless\.metrics=true' "$f"; then
      key="$secrets_root/$n/api-key"
      if [ -r "$key" ]; then
        body=$({ printf 'Authorization: Bearer '; cat "$key"; } |
          curl -s -k --max-time 3 -H @- -w '\n@@metrics %{http_code}' "${url%/health}/metrics" 2>/dev/null)
      else
        body=$(curl -s -k --max-time 3 -w '\n@@metrics %{http_code}' "${url%/health}/metrics" 2>/dev/null)
      fi
      printf '%s\n' "$body" | sed -n -e 's/^llamacpp:\([a-z_]*\) \([-+.0-9eE]*\)$/@@metric \1 \2/p' -e '/^@@metrics [0-9]*$/p'
    fi
  fi
done
true
