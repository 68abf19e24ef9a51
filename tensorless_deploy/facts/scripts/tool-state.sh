#!/bin/sh
# What tensorless-deploy put on this host, for the survey (read by facts.parsers.parse_tool_state):
# its unit files (sha256, io.tensorless.* labels, /health at the labelled URL), the model blobs
# under the models directory with their verification stamps, the snapshot links (target first,
# then the link), and the images the engine holds: everything a converged deploy needs to know.
# Given device_re (facts.device.DEVICE_LINE), a unit that answers /health 200 also has the device
# lines of its running start's log (@device LINE): where llama-server says the model went.
: "${models_dir:?}" "${state_dir:?}" "${device_re=}"
hashit() { (openssl dgst -sha256 -r "$1" 2>/dev/null || sha256sum "$1") | cut -d' ' -f1; }
for f in /etc/containers/systemd/tensorless-*.container /etc/systemd/system/tensorless-*.service; do
  [ -f "$f" ] || continue
  echo "@unit $(hashit "$f") $f"
  grep -o 'io\.tensorless\.[a-z-]*=[^" ]*' "$f" | sed 's/^/@label /'
  url=$(grep -o 'io\.tensorless\.health=[^" ]*' "$f" | head -n 1 | cut -d= -f2-)
  if [ -n "$url" ]; then
    code=$(curl -s -k -o /dev/null -w '%{http_code}' --max-time 3 "$url" 2>/dev/null)
    echo "@health $code"
    if [ "$code" = 200 ] && [ -n "$device_re" ]; then
      n=$(basename "$f"); inv=$(systemctl show -p InvocationID --value "${n%.*}.service" 2>/dev/null)
      [ -n "$inv" ] && journalctl -q --no-pager -o cat _SYSTEMD_INVOCATION_ID="$inv" 2>/dev/null |
        grep -E -m 40 "$device_re" | sed 's/^/@device /'
    fi
  fi
done
for b in "$models_dir"/models--*/blobs/*; do
  [ -f "$b" ] || continue
  echo "@blob $(stat -c '%s %Y' "$b") $b"
  s="$state_dir/verified/${b##*/}"
  if [ -f "$s" ]; then echo "@stamp $(cat "$s")"; fi
done
for l in "$models_dir"/models--*/snapshots/*/* "$models_dir"/models--*/snapshots/*/*/*; do
  [ -L "$l" ] && echo "@link $(readlink "$l") $l"
done
for engine in podman docker; do
  command -v "$engine" >/dev/null 2>&1 || continue
  if "$engine" images --digests --format '@image {{.Repository}}@{{.Digest}}' 2>/dev/null; then
    echo "@images-ok $engine"
  fi
  break
done
exit 0
