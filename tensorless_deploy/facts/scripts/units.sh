# shellcheck shell=sh
# needs: host.sh
# needs: api.sh
# shellcheck disable=SC2154  # td_*: host.sh's parameters, bound before
# The one reader of the unit files tensorless-deploy wrote on this host (read by
# facts.parsers.read_unit_blocks): `read_units` prints a block per unit, for the survey
# (tool-state.sh) and for status, stop, logs, bench, rollback and prune (deployed-units.sh).
# Per unit: its name, kind and path, systemd's view of it, the file's sha256 and the one this
# tool recorded when it wrote it, whether a previous unit is kept (rollback), the file itself (one
# @@text line per line), and /health at the labelled URL. Given device_re (facts.device.
# DEVICE_LINE), the device lines of a running unit's start (@@device LINE): where llama-server
# says the model went. Given containers, the running container's labels and image. Given
# secrets_root (the directory of the units' secrets), a unit labelled io.tensorless.metrics=true
# also has its llama-server /metrics read (@@metric NAME VALUE for each llamacpp: sample,
# @@metrics CODE), with the unit's API key sent as a header read from curl's stdin (-H @-),
# never in argv.
: "${device_re=}" "${containers=}" "${secrets_root=}"

read_units() {
  for f in "$td_quadlet_dir/$td_unit_prefix"*.container "$td_systemd_dir/$td_unit_prefix"*.service; do
    [ -f "$f" ] || continue
    b=$(basename "$f"); n=${b%.*}
    [ "$n" = "$td_door_unit" ] && continue  # the front door's: no model's unit
    case "$f" in *.container) k=quadlet;; *) k=service;; esac
    echo "@@unit $n $k $f"
    # systemd's view in one call (is-active prints ActiveState); its lines come in its own order
    active='' restarts='' result='' sub='' inv=''
    while IFS='=' read -r key value; do
      case $key in
        ActiveState) active=$value ;;
        NRestarts) restarts=$value ;;
        Result) result=$value ;;
        SubState) sub=$value ;;
        InvocationID) inv=$value ;;
      esac
    done <<UNIT
$(systemctl show -p ActiveState -p NRestarts -p Result -p SubState -p InvocationID "$n.service" 2>/dev/null)
UNIT
    echo "@@active $active"
    echo "@@systemd $restarts $result $sub"
    echo "@@sha $(hashit "$f") $(cat "$f.tensorless-sha" 2>/dev/null)"
    if [ -f "$f.tensorless-prev" ]; then
      echo "@@prev $(hashit "$f.tensorless-prev")"
      sed 's/^/@@prevtext /' "$f.tensorless-prev"
    fi
    sed 's/^/@@text /' "$f"
    [ -z "$containers" ] || inspect_container "$n"
    if [ -n "$device_re" ] && [ "$active" = active ]; then
      [ -n "$inv" ] && journalctl -q --no-pager -o cat _SYSTEMD_INVOCATION_ID="$inv" 2>/dev/null |
        grep -E -m 40 "$device_re" | sed 's/^/@@device /'
    fi
    url=$(health_url "$f")
    [ -n "$url" ] || continue
    echo "@@health $(http_code "$url")"
    if [ -n "$secrets_root" ] && grep -q 'io\.tensorless\.metrics=true' "$f"; then
      read_metrics "$url" "$secrets_root/$n/api-key"
    fi
  done
  return 0
}

inspect_container() {  # only the fields status needs: labels, image reference, image id
  if command -v podman >/dev/null 2>&1; then
    eng=podman; fmt='{{json .Config.Labels}}	{{.ImageName}}	{{.Image}}'
  else
    eng=docker; fmt='{{json .Config.Labels}}	{{.Config.Image}}	{{.Image}}'
  fi
  info=$($eng inspect --format "$fmt" "$1" 2>/dev/null) ||
    { sleep 1; info=$($eng inspect --format "$fmt" "$1" 2>/dev/null); }
  echo "@@inspect $info"
}

read_metrics() {  # read_metrics HEALTH_URL KEY_FILE: the llamacpp: samples of /metrics beside it
  api_get "${1%/health}/metrics" "$2" |
    sed -n -e 's/^llamacpp:\([a-z_]*\) \([-+.0-9eE]*\)$/@@metric \1 \2/p' -e 's/^@@http \([0-9]*\)$/@@metrics \1/p'
}
