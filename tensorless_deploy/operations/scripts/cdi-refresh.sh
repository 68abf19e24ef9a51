#!/bin/sh
# toolkit.cdi: generate the CDI spec for the installed driver and keep it fresh after driver
# changes: with the toolkit's own refresh units where it ships them (1.18 and later; the spec is
# then /var/run/cdi/nvidia.yaml), else with tensorless-deploy's path unit and service (the spec
# is then /etc/cdi/nvidia.yaml). Any other spec of kind nvidia.com/gpu is moved aside (renamed
# *.tensorless-moved, which CDI does not read): two specs of one kind make podman refuse both.
: "${service:?}" "${path_unit:?}" "${unit_dir:?}" "${service_text:?}" "${path_text:?}"
: "${etc_spec:?}" "${run_spec:?}" "${toolkit_paths:?}"
set -e
retry() { # retry COMMAND...: a path unit's start fails while the kernel has no inotify watch to spare
  n=1
  until "$@"; do [ "$n" -lt 3 ] || return 1; n=$((n + 1)); sleep 1; done
}
toolkit=no
for f in $toolkit_paths; do [ -f "$f" ] && toolkit=yes; done
if [ "$toolkit" = yes ]; then
  out=$run_spec
  retry systemctl enable --now nvidia-cdi-refresh.path
  systemctl enable nvidia-cdi-refresh.service
  if [ -f "$unit_dir/$path_unit" ] || [ -f "$unit_dir/$service" ]; then
    systemctl disable --now "$path_unit" "$service" || true
    rm -f "$unit_dir/$path_unit" "$unit_dir/$service"
    systemctl daemon-reload
    echo "the toolkit's nvidia-cdi-refresh units replace $path_unit"
  fi
  echo "refresh: the toolkit's nvidia-cdi-refresh.path, enabled"
else
  out=$etc_spec
  changed=no
  put() { # put FILE TEXT: write only when different, by rename
    printf '%s' "$2" > "$1.tensorless-new"
    if cmp -s "$1.tensorless-new" "$1"; then rm -f "$1.tensorless-new"; else mv -f "$1.tensorless-new" "$1"; changed=yes; fi
  }
  put "$unit_dir/$service" "$service_text"
  put "$unit_dir/$path_unit" "$path_text"
  [ "$changed" = no ] || systemctl daemon-reload
  systemctl enable "$service"
  retry systemctl enable --now "$path_unit"
  echo "refresh: $path_unit (and $service at boot), enabled"
fi
mkdir -p "$(dirname "$out")"
nvidia-ctk cdi generate --output="$out"
echo "CDI spec $out generated"
for f in /etc/cdi/*.yaml /etc/cdi/*.json /var/run/cdi/*.yaml /var/run/cdi/*.json; do
  if [ ! -f "$f" ] || [ "$f" = "$out" ]; then continue; fi
  grep -Eq '"?kind"?[[:space:]]*:[[:space:]]*"?nvidia\.com/gpu"?' "$f" || continue
  mv -f "$f" "$f.tensorless-moved"
  echo "moved $f aside to $f.tensorless-moved: it declared nvidia.com/gpu too"
done
