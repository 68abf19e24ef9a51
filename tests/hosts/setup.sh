#!/bin/bash
# Real test hosts for tensorless-deploy (see docs/test-hosts.md).
#
#   bash tests/hosts/setup.sh [N]        N GPU hosts gpu1..gpuN (default 2, at most 16) + legacy1
#
# Creates, under BASE (default /var/tmp/tensorless-hosts; env BASE overrides):
#   - an SSH client key, per-host SSH host keys, a known_hosts and an ssh config of its own;
#   - a bridge tlbr0 10.253.0.1/24 in the root namespace (the "gateway") and, per host, its own
#     network namespace tl-<name> with a veth into the bridge;
#   - GPU hosts gpu1..gpuN (Debian trixie, systemd PID 1, sshd, podman 5 + quadlet) booted by
#     systemd-nspawn -b --volatile=overlay from ONE shared rootfs, plus legacy1 (Debian bookworm,
#     podman 4.3, no quadlet); each with its own ext4-backed /var/lib/containers;
#   - a registry (Debian docker-registry) on 10.253.0.1:5000 with the CPU engine image (a real
#     llama-server from Debian sid's llama.cpp-tools, see engine/cpu/build.sh), pinned by digest;
#   - a tiny GGUF (tests/hosts/tiny_gguf.py);
#   - the default GPU stand-in profile on each host (gpu1=p100, gpu2=h200, legacy1=p100);
#   - BASE/hosts.json describing all of it.
# Idempotent: re-running reuses rootfs trees, the image and running hosts. Every wait is bounded;
# every failure says what failed and which log to read. Undo with tests/hosts/teardown.sh.
set -Eeuo pipefail
umask 022

SCRIPT_DIR=$(dirname "$(readlink -f "$0")")
REPO=$(readlink -f "$SCRIPT_DIR/../..")
N=${1:-${TL_GPU_HOSTS:-2}}
[[ "$N" =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] && [ "$N" -le 16 ] || { echo "setup: N must be 1..16 (got '$N')" >&2; exit 2; }
BASE=${BASE:-/var/tmp/tensorless-hosts}
MIRROR=${MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
BRIDGE=tlbr0
GW=10.253.0.1
REGISTRY=$GW:5000
IMAGE_NAME=tensorless-engine-cpu
BOOT_TIMEOUT=${BOOT_TIMEOUT:-90}          # seconds for all hosts to answer SSH
DEBOOTSTRAP_TIMEOUT=${DEBOOTSTRAP_TIMEOUT:-900}

TRIXIE_PKGS=systemd,systemd-sysv,dbus,openssh-server,podman,crun,netavark,aardvark-dns,nftables,iproute2,curl,ca-certificates,catatonit,openssl,coreutils,procps
BOOKWORM_PKGS=systemd,systemd-sysv,dbus,openssh-server,podman,crun,runc,netavark,aardvark-dns,iptables,iproute2,curl,ca-certificates,catatonit,openssl,coreutils,procps
HOST_PKGS="podman crun runc uidmap catatonit skopeo docker-registry openssh-client debootstrap
  systemd-container iproute2 curl nftables openssl ca-certificates"

[ "$(id -u)" = 0 ] || { echo "setup: must run as root" >&2; exit 1; }
mkdir -p "$BASE"/{logs,run,ssh/hostkeys,rootfs,engine,registry/data,hosts,models,podman-host}
LOGS=$BASE/logs
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)

now() { date +%s.%N; }
STEP=init
trap 'echo "setup: FAILED in step $STEP, line $LINENO: $BASH_COMMAND (logs in $BASE/logs)" >&2' ERR
T_ALL=$(now)
: > "$BASE/timings.tsv"
T_STEP=0
step() { STEP=$1; T_STEP=$(now); echo "=== $STEP"; }
record() { # record NAME SECONDS
  printf '%s\t%.1f\n' "$1" "$2" >> "$BASE/timings.tsv"
  printf '[timing] %-26s %7.1fs\n' "$1" "$2"
}
done_step() { record "$STEP" "$(awk -v a="$T_STEP" -v b="$(now)" 'BEGIN{print b-a}')"; }
fail() { # fail MESSAGE [LOG]
  echo "setup: FAILED in step '$STEP': $1" >&2
  if [ -n "${2:-}" ]; then echo "setup: read $2 (last lines below)" >&2; tail -25 "$2" >&2 || true; fi
  exit 1
}
# wait_for SECONDS DESCRIPTION COMMAND... : poll every 0.2 s, bounded
wait_for() {
  local limit=$1 what=$2; shift 2
  local end; end=$(awk -v a="$(now)" -v l="$limit" 'BEGIN{printf "%.3f", a+l}')
  until "$@" >/dev/null 2>&1; do
    if awk -v n="$(now)" -v e="$end" 'BEGIN{exit !(n>e)}'; then return 1; fi
    sleep 0.2
  done
}

# ---------------------------------------------------------------- host list / address plan
NAMES=(); IPS=(); SUITES=(); PROFILES=()
for i in $(seq 1 "$N"); do
  NAMES+=("gpu$i"); IPS+=("10.253.0.$((10 + i))"); SUITES+=(trixie)
  case $i in 1) PROFILES+=(p100);; 2) PROFILES+=(h200);; *) PROFILES+=(p100);; esac
done
NAMES+=(legacy1); IPS+=(10.253.0.100); SUITES+=(bookworm); PROFILES+=(p100)

# ---------------------------------------------------------------- 1. host packages
step apt
# keep maintainer scripts from starting sshd/registry (no systemd here, but be explicit)
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\n# tensorless test hosts: never auto-start services from packages\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
fi
missing=()
for p in $HOST_PKGS; do [[ "$(dpkg-query -W -f '${Status}' "$p" 2>/dev/null)" == *"ok installed"* ]] || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]} (log: $LOGS/apt.log)"
  timeout 300 apt-get update -q > "$LOGS/apt.log" 2>&1 || fail "apt-get update" "$LOGS/apt.log"
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >> "$LOGS/apt.log" 2>&1 || fail "apt-get install ${missing[*]}" "$LOGS/apt.log"
fi
done_step

# ---------------------------------------------------------------- 2. rootfs builds, in parallel
step debootstrap-start
# marker = package list: a rootfs built with another list is rebuilt
build_rootfs() { # build_rootfs SUITE PKGS  (runs in background; writes $BASE/run/rootfs-SUITE.rc)
  local suite=$1 pkgs=$2 root=$BASE/rootfs/$1 t0; t0=$(now)
  local log=$LOGS/debootstrap-$suite.log
  rm -rf "$root.tmp"
  if timeout "$DEBOOTSTRAP_TIMEOUT" debootstrap --variant=minbase --include="$pkgs" \
       "$suite" "$root.tmp" "$MIRROR" > "$log" 2>&1; then
    rm -rf "$root.tmp"/var/cache/apt/archives/*.deb "$root.tmp"/var/lib/apt/lists/*_Packages
    echo "$pkgs" > "$root.tmp/.tensorless-rootfs-ok"
    rm -rf "$root"; mv "$root.tmp" "$root"
    echo 0 > "$BASE/run/rootfs-$suite.rc"
  else
    echo "$?" > "$BASE/run/rootfs-$suite.rc"
  fi
  awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f\n", b-a}' > "$BASE/run/rootfs-$suite.secs"
}
rootfs_ok() { [ -f "$BASE/rootfs/$1/.tensorless-rootfs-ok" ] && [ "$(cat "$BASE/rootfs/$1/.tensorless-rootfs-ok")" = "$2" ]; }
BG_PIDS=()
# on failure, do not leave background debootstraps running
kill_tree() { local c; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$c"; done; kill -TERM "$1" 2>/dev/null || true; }
trap 'rc=$?; if [ $rc != 0 ]; then for p in "${BG_PIDS[@]}"; do kill_tree "$p"; done; fi' EXIT
for spec in "trixie:$TRIXIE_PKGS" "bookworm:$BOOKWORM_PKGS"; do
  suite=${spec%%:*}; pkgs=${spec#*:}
  rm -f "$BASE/run/rootfs-$suite.rc" "$BASE/run/rootfs-$suite.secs"
  if rootfs_ok "$suite" "$pkgs"; then
    echo "rootfs $suite: reusing $BASE/rootfs/$suite"; echo 0 > "$BASE/run/rootfs-$suite.rc"; echo 0 > "$BASE/run/rootfs-$suite.secs"
  else
    echo "rootfs $suite: debootstrap in background (log: $LOGS/debootstrap-$suite.log)"
    build_rootfs "$suite" "$pkgs" & BG_PIDS+=($!)
  fi
done
ENGINE_TAR=$BASE/engine/engine-cpu.tar
rm -f "$BASE/run/engine.rc" "$BASE/run/engine.secs"
BUILD_SHA=$(sha256sum "$REPO/engine/cpu/build.sh" | cut -d' ' -f1)
# reuse the tar only when it was built by this very build script
if [ -s "$ENGINE_TAR" ] && [ -s "$ENGINE_TAR.info" ] && [ "$(cat "$ENGINE_TAR.build-sha" 2>/dev/null)" = "$BUILD_SHA" ]; then
  echo "engine image tar: reusing $ENGINE_TAR"; echo 0 > "$BASE/run/engine.rc"; echo 0 > "$BASE/run/engine.secs"
else
  echo "engine image: engine/cpu/build.sh in background (log: $LOGS/engine-build.log)"
  (
    t0=$(now)
    if MIRROR=$MIRROR DEBOOTSTRAP_TIMEOUT=$DEBOOTSTRAP_TIMEOUT LOG=$LOGS/debootstrap-sid.log \
         bash "$REPO/engine/cpu/build.sh" "$ENGINE_TAR" "$BASE/engine/rootfs-sid" > "$LOGS/engine-build.log" 2>&1; then
      rm -rf "$BASE/engine/rootfs-sid"; echo "$BUILD_SHA" > "$ENGINE_TAR.build-sha"; echo 0 > "$BASE/run/engine.rc"
    else echo 1 > "$BASE/run/engine.rc"; fi
    awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f\n", b-a}' > "$BASE/run/engine.secs"
  ) & BG_PIDS+=($!)
fi
done_step

# ---------------------------------------------------------------- 3. SSH material
step ssh-keys
SSH_KEY=$BASE/ssh/id_ed25519
KNOWN=$BASE/ssh/known_hosts
SSH_CONFIG=$BASE/ssh/config
[ -f "$SSH_KEY" ] || ssh-keygen -q -t ed25519 -N '' -C tensorless-tests -f "$SSH_KEY"
: > "$KNOWN.tmp"; : > "$SSH_CONFIG.tmp"
for idx in "${!NAMES[@]}"; do
  name=${NAMES[$idx]}; ip=${IPS[$idx]}; hk=$BASE/ssh/hostkeys/$name
  mkdir -p "$hk"
  [ -f "$hk/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C "root@$name" -f "$hk/ssh_host_ed25519_key"
  chmod 600 "$hk/ssh_host_ed25519_key"
  echo "$name,$ip $(cut -d' ' -f1,2 "$hk/ssh_host_ed25519_key.pub")" >> "$KNOWN.tmp"
  cat >> "$SSH_CONFIG.tmp" <<EOF
Host $name $ip
  HostName $ip
  User root
  IdentityFile $SSH_KEY
  IdentitiesOnly yes
  UserKnownHostsFile $KNOWN
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR

EOF
done
mv "$KNOWN.tmp" "$KNOWN"; mv "$SSH_CONFIG.tmp" "$SSH_CONFIG"
done_step

# ---------------------------------------------------------------- 4. bridge + namespaces
step network
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge || fail "ip link add $BRIDGE type bridge"
fi
[[ "$(ip -4 addr show dev "$BRIDGE")" == *"inet $GW/24"* ]] || ip addr add "$GW/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
for idx in "${!NAMES[@]}"; do
  name=${NAMES[$idx]}; ip=${IPS[$idx]}; ns=tl-$name; v=tlv-$name; p=tlp-$name
  [ -e "/run/netns/$ns" ] || ip netns add "$ns" || fail "ip netns add $ns"
  if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
    ip link del "$v" 2>/dev/null || true
    ip link add "$v" type veth peer name "$p" || fail "veth $v"
    ip link set "$p" netns "$ns"
    ip -n "$ns" link set "$p" name eth0
  fi
  [[ "$(ip -n "$ns" -4 addr show dev eth0)" == *"inet $ip/24"* ]] || ip -n "$ns" addr add "$ip/24" dev eth0
  ip -n "$ns" link set lo up; ip -n "$ns" link set eth0 up
  ip link set "$v" master "$BRIDGE"; ip link set "$v" up
done
done_step

# ---------------------------------------------------------------- 5. registry
step registry
cat > "$BASE/registry/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $BASE/registry/data
  delete:
    enabled: true
http:
  addr: "$REGISTRY"
EOF
registry_up() { curl -fsS -m 2 -o /dev/null "http://$REGISTRY/v2/" >/dev/null; }
if ! registry_up 2>/dev/null; then
  setsid nohup docker-registry serve "$BASE/registry/config.yml" > "$LOGS/registry.log" 2>&1 < /dev/null &
  echo $! > "$BASE/run/registry.pid"
  wait_for 20 registry registry_up || fail "registry did not answer on http://$REGISTRY/v2/ within 20 s" "$LOGS/registry.log"
fi
done_step

# ---------------------------------------------------------------- 6. tiny GGUF
step tiny-gguf
GGUF=$BASE/models/tiny.gguf
"$PY" "$SCRIPT_DIR/tiny_gguf.py" "$GGUF.tmp" > "$LOGS/tiny-gguf.log" 2>&1 || fail "tiny GGUF generation with $PY" "$LOGS/tiny-gguf.log"
if cmp -s "$GGUF.tmp" "$GGUF"; then rm -f "$GGUF.tmp"; else mv "$GGUF.tmp" "$GGUF"; fi
GGUF_SHA=$(sha256sum "$GGUF" | cut -d' ' -f1); GGUF_SIZE=$(stat -c %s "$GGUF")
echo "tiny GGUF: $GGUF $GGUF_SIZE bytes sha256 $GGUF_SHA"
done_step

# ---------------------------------------------------------------- 7. wait for rootfs trees
step debootstrap-wait
for suite in trixie bookworm; do
  end=$(( $(date +%s) + DEBOOTSTRAP_TIMEOUT + 60 ))
  while [ ! -f "$BASE/run/rootfs-$suite.rc" ]; do
    [ "$(date +%s)" -lt "$end" ] || fail "rootfs $suite: no result after $DEBOOTSTRAP_TIMEOUT s" "$LOGS/debootstrap-$suite.log"
    sleep 1
  done
  [ "$(cat "$BASE/run/rootfs-$suite.rc")" = 0 ] || fail "debootstrap $suite (rc $(cat "$BASE/run/rootfs-$suite.rc"))" "$LOGS/debootstrap-$suite.log"
  record "debootstrap-$suite" "$(cat "$BASE/run/rootfs-$suite.secs")"
done
done_step

# ---------------------------------------------------------------- 8. configure rootfs trees
step configure-rootfs
host_running() { local f=$BASE/run/nspawn-$1.pid; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; }
configure_rootfs() { # configure_rootfs SUITE
  local suite=$1 root=$BASE/rootfs/$1
  install -d -m 700 "$root/root/.ssh"
  install -m 600 "$SSH_KEY.pub" "$root/root/.ssh/authorized_keys"
  # per-host: hostname from nspawn --hostname, SSH host key bound in read-only
  rm -f "$root/etc/hostname" "$root"/etc/ssh/ssh_host_{rsa,ecdsa}_key{,.pub}
  : > "$root/etc/machine-id"
  mkdir -p "$root/etc/ssh/sshd_config.d"
  cat > "$root/etc/ssh/sshd_config.d/10-tensorless-tests.conf" <<'EOF'
# tensorless test host: one per-host ed25519 host key (bound in by systemd-nspawn), keys only
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
PermitRootLogin prohibit-password
EOF
  # fails in a container (no modules to load)
  ln -sf /dev/null "$root/etc/systemd/system/systemd-modules-load.service"
  mkdir -p "$root/etc/containers/registries.conf.d" "$root/etc/cdi" "$root/var/lib/containers"
  if [ "$suite" = trixie ]; then
    cat > "$root/etc/containers/containers.conf" <<'EOF'
# tensorless test host (systemd-nspawn guest)
[containers]
# the outer machine binds every cgroup controller to v1: the guest's cgroup2 tree has no pids controller
pids_limit = 0

[network]
firewall_driver = "nftables"
EOF
  else
    # podman 4.3 raises RLIMIT_NOFILE/NPROC past the hard limits and crun 1.8 insists on raising
    # RLIMIT_MEMLOCK for its eBPF device filter: without CAP_SYS_RESOURCE (the outer VM has
    # none) both fail, so legacy1 uses runc and ulimits within the inherited hard limits
    cat > "$root/etc/containers/containers.conf" <<EOF
# tensorless test host (systemd-nspawn guest, podman 4.3)
[containers]
pids_limit = 0
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=4096:4096"]

[engine]
runtime = "runc"

[network]
network_backend = "netavark"
EOF
  fi
  cat > "$root/etc/containers/registries.conf.d/50-tensorless-tests.conf" <<EOF
# the test registry on the gateway speaks plain HTTP
[[registry]]
location = "$REGISTRY"
insecure = true
EOF
}
for suite in trixie bookworm; do
  busy=0
  for idx in "${!NAMES[@]}"; do [ "${SUITES[$idx]}" = "$suite" ] && host_running "${NAMES[$idx]}" && busy=1; done
  if [ $busy = 1 ]; then echo "rootfs $suite: hosts running from it, left as is"; else configure_rootfs "$suite"; fi
done
done_step

# ---------------------------------------------------------------- 9. boot hosts
step boot-hosts
ssh_ok() { ssh -F "$SSH_CONFIG" -o ConnectTimeout=2 "$1" true; }
started=()
for idx in "${!NAMES[@]}"; do
  name=${NAMES[$idx]}; suite=${SUITES[$idx]}; hk=$BASE/ssh/hostkeys/$name; st=$BASE/hosts/$name
  if host_running "$name" && ssh_ok "$name" >/dev/null 2>&1; then echo "$name: already running"; continue; fi
  if host_running "$name"; then
    echo "$name: running but not answering SSH; restarting"
    kill -TERM "$(cat "$BASE/run/nspawn-$name.pid")" 2>/dev/null || true
    wait_for 20 "stop $name" bash -c "! kill -0 $(cat "$BASE/run/nspawn-$name.pid")" || kill -KILL "$(cat "$BASE/run/nspawn-$name.pid")" 2>/dev/null || true
  fi
  rm -rf "$st"; mkdir -p "$st/containers"
  # --volatile=overlay: every boot starts from the pristine rootfs (writes land in a tmpfs overlay);
  # podman storage cannot live on overlayfs, so each host gets its own ext4 directory bound in.
  SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 SYSTEMD_NSPAWN_API_VFS_WRITABLE=network SYSTEMD_NSPAWN_LOCK=0 \
  setsid nohup systemd-nspawn -b -D "$BASE/rootfs/$suite" --register=no --keep-unit \
    --machine="$name" --hostname="$name" \
    --network-namespace-path="/run/netns/tl-$name" \
    --capability=all --system-call-filter='@keyring bpf' --bind=/dev/fuse \
    --volatile=overlay --bind="$st/containers:/var/lib/containers" \
    --bind-ro="$hk/ssh_host_ed25519_key:/etc/ssh/ssh_host_ed25519_key" \
    --bind-ro="$hk/ssh_host_ed25519_key.pub:/etc/ssh/ssh_host_ed25519_key.pub" \
    --resolv-conf=off --link-journal=no --console=read-only \
    > "$LOGS/nspawn-$name.log" 2>&1 < /dev/null &
  echo $! > "$BASE/run/nspawn-$name.pid"
  started+=("$name")
done
end=$(( $(date +%s) + BOOT_TIMEOUT ))
for name in "${started[@]}"; do
  until ssh_ok "$name" >/dev/null 2>&1; do
    host_running "$name" || fail "systemd-nspawn for $name exited" "$LOGS/nspawn-$name.log"
    [ "$(date +%s)" -lt "$end" ] || fail "$name did not answer SSH within $BOOT_TIMEOUT s" "$LOGS/nspawn-$name.log"
    sleep 0.3
  done
done
for name in "${NAMES[@]}"; do
  state=$(ssh -F "$SSH_CONFIG" "$name" 'timeout 60 systemctl is-system-running --wait' 2>&1 || true)
  echo "$name: system $state"
  case $state in running|degraded) ;; *) fail "$name: systemctl is-system-running says '$state'" "$LOGS/nspawn-$name.log";; esac
  ssh -F "$SSH_CONFIG" "$name" "curl -fsS -m 5 http://$REGISTRY/v2/ >/dev/null" \
    || fail "$name cannot reach the registry http://$REGISTRY/v2/" "$LOGS/registry.log"
done
done_step

# ---------------------------------------------------------------- 10. engine image -> registry
step engine-image
end=$(( $(date +%s) + DEBOOTSTRAP_TIMEOUT + 60 ))
while [ ! -f "$BASE/run/engine.rc" ]; do
  [ "$(date +%s)" -lt "$end" ] || fail "engine build: no result" "$LOGS/engine-build.log"
  sleep 1
done
[ "$(cat "$BASE/run/engine.rc")" = 0 ] || fail "engine/cpu/build.sh" "$LOGS/engine-build.log"
record engine-build "$(cat "$BASE/run/engine.secs")"
PH=$BASE/podman-host
cat > "$PH/containers.conf" <<'EOF'
# host-side podman 4.3 on the outer VM: root lacks CAP_SYS_RESOURCE, cgroups are v1 hybrid
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
cat > "$PH/storage.conf" <<EOF
# host-side podman storage of the test harness only (vfs: no mounts left behind)
[storage]
driver = "vfs"
graphroot = "$PH/storage"
runroot = "$PH/run"
EOF
export CONTAINERS_CONF=$PH/containers.conf CONTAINERS_STORAGE_CONF=$PH/storage.conf
DIGEST_FILE=$BASE/engine/engine-cpu.digest
manifest_ok() {
  curl -fsS -m 5 -o /dev/null -I \
    -H 'Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json' \
    "http://$REGISTRY/v2/$IMAGE_NAME/manifests/$(cat "$DIGEST_FILE")"
}
if [ -s "$DIGEST_FILE" ] && [ "$DIGEST_FILE" -nt "$ENGINE_TAR" ] && manifest_ok; then
  echo "engine image: $REGISTRY/$IMAGE_NAME@$(cat "$DIGEST_FILE") already in the registry"
else
  SERVER=$(sed -n 's/^llama_server=//p' "$ENGINE_TAR.info")
  timeout 300 podman import -q --change "ENTRYPOINT [\"$SERVER\"]" --change 'EXPOSE 8080' \
    --change 'LABEL org.opencontainers.image.title=tensorless-engine-cpu' \
    "$ENGINE_TAR" "localhost/$IMAGE_NAME:local" > "$LOGS/engine-import.log" 2>&1 \
    || fail "podman import of $ENGINE_TAR" "$LOGS/engine-import.log"
  timeout 300 podman push -q --tls-verify=false --digestfile "$DIGEST_FILE" \
    "localhost/$IMAGE_NAME:local" "$REGISTRY/$IMAGE_NAME:latest" >> "$LOGS/engine-import.log" 2>&1 \
    || fail "podman push to $REGISTRY" "$LOGS/engine-import.log"
  podman rmi -f "localhost/$IMAGE_NAME:local" >/dev/null 2>&1 || true
  manifest_ok || fail "registry has no manifest $(cat "$DIGEST_FILE") after push" "$LOGS/registry.log"
fi
IMAGE_REF=$REGISTRY/$IMAGE_NAME@$(cat "$DIGEST_FILE")
echo "engine image: $IMAGE_REF"
done_step

# ---------------------------------------------------------------- 11. default GPU profiles
step profiles
for idx in "${!NAMES[@]}"; do
  "$PY" "$SCRIPT_DIR/harness.py" --base "$BASE" apply-profile "${NAMES[$idx]}" "${PROFILES[$idx]}" \
    >> "$LOGS/profiles.log" 2>&1 || fail "apply profile ${PROFILES[$idx]} on ${NAMES[$idx]}" "$LOGS/profiles.log"
done
done_step

# ---------------------------------------------------------------- 12. hosts.json
step hosts-json
TOTAL=$(awk -v a="$T_ALL" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}')
record TOTAL "$TOTAL"
HOSTSPEC=""
for idx in "${!NAMES[@]}"; do HOSTSPEC+="${NAMES[$idx]}:${IPS[$idx]}:${SUITES[$idx]}:${PROFILES[$idx]} "; done
"$PY" "$SCRIPT_DIR/harness.py" --base "$BASE" write-hosts-json --hosts "$HOSTSPEC" \
  --registry "$REGISTRY" --image-ref "$IMAGE_REF" --gguf "$GGUF" --gateway "$GW" \
  > "$LOGS/hosts-json.log" 2>&1 || fail "writing $BASE/hosts.json" "$LOGS/hosts-json.log"
echo "wrote $BASE/hosts.json"
echo "setup: done in ${TOTAL}s (per-step timings in $BASE/timings.tsv)"
