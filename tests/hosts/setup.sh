#!/bin/bash
# Real test hosts for tensorless-deploy (see docs/test-hosts.md).
#
#   [TL_SET=S] bash tests/hosts/setup.sh [N]   N GPU hosts gpu1..gpuN (default 2, at most 16)
#                                              + legacy1 + persist1, as host set S (0..7)
#
# The set's names and addresses come from `harness.py plan` (HostSet in tests/hosts/harness.py):
# set 0 = BASE /var/tmp/tensorless-hosts, bridge tlbr0, 10.253.0.0/24; set S = BASE
# /var/tmp/tensorless-hosts-S, bridge tlbrS, 10.253.S.0/24. Several sets run side by side.
# Creates, under the set's BASE:
#   - an SSH client key (authorized for root and for `operator`, who has passwordless sudo),
#     per-host SSH host keys, a known_hosts and an ssh config of its own;
#   - the bridge with the gateway address (.1) in the root namespace and, per host, its own
#     network namespace with a veth into the bridge;
#   - GPU hosts gpu1..gpuN (Debian trixie, systemd PID 1, sshd, podman 5 + quadlet) booted by
#     systemd-nspawn -b --volatile=overlay from ONE shared rootfs, legacy1 (Debian bookworm,
#     podman 4.3, no quadlet), and persist1 (trixie, its own persistent root: it can reboot),
#     each with its own ext4-backed /var/lib/containers;
#   - a registry (Debian docker-registry) on the gateway, port 5000, with the CPU engine image (a
#     real llama-server from Debian sid's llama.cpp-tools, see engine/cpu/build.sh), by digest;
#   - a tiny GGUF (tests/hosts/tiny_gguf.py);
#   - the default GPU stand-in profile on each host (gpu2=h200, every other host p100);
#   - BASE/hosts.json describing all of it.
# Shared by all sets, under SHARED (/var/tmp/tensorless-hosts; env TL_SHARED): the rootfs trees
# and the engine image tar, each built once under a flock (SHARED/.rootfs.lock, .engine.lock).
# Idempotent: re-running reuses rootfs trees, the image and running hosts. Every wait is bounded;
# every failure says what failed and which log to read. Undo with tests/hosts/teardown.sh.
set -Eeuo pipefail
umask 022

SCRIPT_DIR=$(dirname "$(readlink -f "$0")")
REPO=$(readlink -f "$SCRIPT_DIR/../..")
N=${1:-${TL_GPU_HOSTS:-2}}
if ! [[ "$N" =~ ^[0-9]+$ ]] || [ "$N" -lt 1 ] || [ "$N" -gt 16 ]; then echo "setup: N must be 1..16 (got '$N')" >&2; exit 2; fi
[ "$(id -u)" = 0 ] || { echo "setup: must run as root" >&2; exit 1; }
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
PLAN=$("$PY" "$SCRIPT_DIR/harness.py" plan --gpus "$N") || { echo "setup: no plan for TL_SET='${TL_SET:-}' ($PY $SCRIPT_DIR/harness.py plan)" >&2; exit 2; }
# the plan: TL_SET BASE SHARED BRIDGE GW SUBNET REGISTRY UNREACHABLE NETNS_PREFIX VETH_PREFIX
# ALL_REGISTRIES SUDO_USER_NAME and the per-host arrays NAMES IPS SUITES PROFILES NETNS VETHS
# PEERS PERSISTENT
eval "$PLAN"
MIRROR=${MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
IMAGE_NAME=tensorless-engine-cpu
BOOT_TIMEOUT=${BOOT_TIMEOUT:-90}          # seconds for all hosts to answer SSH
DEBOOTSTRAP_TIMEOUT=${DEBOOTSTRAP_TIMEOUT:-900}
LOCK_TIMEOUT=${LOCK_TIMEOUT:-1800}        # seconds to wait for another set's build of the shared trees

TRIXIE_PKGS=systemd,systemd-sysv,dbus,openssh-server,podman,crun,netavark,aardvark-dns,nftables,iproute2,curl,ca-certificates,catatonit,openssl,coreutils,procps,sudo,libnss-myhostname,systemd-journal-remote
BOOKWORM_PKGS=systemd,systemd-sysv,dbus,openssh-server,podman,crun,runc,netavark,aardvark-dns,iptables,iproute2,curl,ca-certificates,catatonit,openssl,coreutils,procps,sudo,libnss-myhostname
HOST_PKGS="podman crun runc uidmap catatonit skopeo docker-registry openssh-client debootstrap
  systemd-container iproute2 curl nftables openssl ca-certificates util-linux"

mkdir -p "$BASE"/{logs,run,ssh/hostkeys,engine,registry/data,hosts,models,podman-host} "$SHARED"/{rootfs,engine}
LOGS=$BASE/logs

now() { date +%s.%N; }
STEP=init
trap 'echo "setup: FAILED in step $STEP, line $LINENO: $BASH_COMMAND (logs in $LOGS)" >&2' ERR
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
  echo "setup: FAILED in step '$STEP' (set $TL_SET): $1" >&2
  if [ -n "${2:-}" ]; then echo "setup: read $2 (last lines below)" >&2; tail -25 "$2" >&2 || true; fi
  exit 1
}
# wait_for SECONDS DESCRIPTION COMMAND... : poll every 0.2 s, bounded
wait_for() {
  local limit=$1; shift 2
  local end; end=$(awk -v a="$(now)" -v l="$limit" 'BEGIN{printf "%.3f", a+l}')
  until "$@" >/dev/null 2>&1; do
    if awk -v n="$(now)" -v e="$end" 'BEGIN{exit !(n>e)}'; then return 1; fi
    sleep 0.2
  done
}
echo "setup: host set $TL_SET: BASE $BASE, bridge $BRIDGE, $SUBNET, shared trees under $SHARED"

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

# ---------------------------------------------------------------- 2. shared trees, in parallel
# SHARED/rootfs/base-SUITE: debootstrap output (marker = package list), never booted;
# SHARED/rootfs/SUITE-KEY: a configured copy that hosts boot from, never changed once built
# (KEY = hash of the package list and of configure_rootfs); running hosts of any set keep their
# tree, trees no process uses any more are removed. Builds hold SHARED/.rootfs.lock (flock), so
# a second set's setup waits and then reuses them.
configure_rootfs() { # configure_rootfs ROOT SUITE: set-independent (per-set parts are bound in)
  local root=$1 suite=$2 r
  rm -f "$root/etc/hostname" "$root"/etc/ssh/ssh_host_*_key{,.pub}
  : > "$root/etc/machine-id"
  mkdir -p "$root/etc/ssh/sshd_config.d" "$root/etc/ssh/tensorless-test"
  # the set's client key is bound read-only over this file (nspawn --bind-ro)
  : > "$root/etc/ssh/tensorless-test/authorized_keys"
  cat > "$root/etc/ssh/sshd_config.d/10-tensorless-tests.conf" <<'EOF'
# tensorless test host: one per-host ed25519 host key and the set's client key (both bound in by
# systemd-nspawn), keys only
HostKey /etc/ssh/ssh_host_ed25519_key
AuthorizedKeysFile .ssh/authorized_keys /etc/ssh/tensorless-test/authorized_keys
PasswordAuthentication no
PermitRootLogin prohibit-password
EOF
  # a non-root user with the same key and passwordless sudo (pyinfra _sudo); '*' = no password
  # but not locked. Debian's base-passwd already has a group "operator" (gid 37): use it.
  chroot "$root" groupadd -f "$SUDO_USER_NAME" || return 1
  chroot "$root" useradd --create-home --gid "$SUDO_USER_NAME" --shell /bin/bash "$SUDO_USER_NAME" || return 1
  chroot "$root" usermod -p '*' "$SUDO_USER_NAME" || return 1
  printf '%s ALL=(ALL:ALL) NOPASSWD: ALL\n' "$SUDO_USER_NAME" > "$root/etc/sudoers.d/50-tensorless-tests"
  chmod 440 "$root/etc/sudoers.d/50-tensorless-tests"
  chroot "$root" visudo -c -q -f /etc/sudoers.d/50-tensorless-tests || return 1
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
  # every set's registry (each set reaches only its own: one bridge, no default route)
  {
    echo "# the test registries on the gateways (one per host set) speak plain HTTP"
    for r in $ALL_REGISTRIES; do printf '[[registry]]\nlocation = "%s"\ninsecure = true\n\n' "$r"; done
  } > "$root/etc/containers/registries.conf.d/50-tensorless-tests.conf"
  # The front door's engine (HAProxy, `gateway`) is the host's own package, not installed:
  # prepare installs it. The hosts reach no mirror, so its .debs and the suite's package lists are
  # left in apt's cache, as on a host behind a local mirror: there `apt-get update` fails softly
  # (a warning, exit 0) and `apt-get install haproxy` reads the cache.
  chroot "$root" apt-get update -q || return 1
  chroot "$root" apt-get install -y -q --download-only haproxy || return 1
  # runs inside `if` (errexit is off there): the last command checks what the steps made
  ls "$root"/var/cache/apt/archives/haproxy_*.deb >/dev/null \
    && chroot "$root" id -u "$SUDO_USER_NAME" >/dev/null && [ -d "$root/home/$SUDO_USER_NAME" ] \
    && [ -s "$root/etc/containers/containers.conf" ] && [ -s "$root/etc/ssh/sshd_config.d/10-tensorless-tests.conf" ]
}
prepare_rootfs() { # prepare_rootfs SUITE PKGS DEST (background; writes $BASE/run/rootfs-SUITE.{rc,secs})
  local suite=$1 pkgs=$2 dest=$3 t0 rc=0; t0=$(now)
  local tree=$SHARED/rootfs/base-$suite log=$LOGS/debootstrap-$suite.log
  {
    if [ "$(cat "$tree/.tensorless-rootfs-ok" 2>/dev/null)" != "$pkgs" ]; then
      rm -rf "$tree.tmp"
      if timeout "$DEBOOTSTRAP_TIMEOUT" debootstrap --variant=minbase --include="$pkgs" \
           "$suite" "$tree.tmp" "$MIRROR" > "$log" 2>&1; then
        rm -rf "$tree.tmp"/var/cache/apt/archives/*.deb "$tree.tmp"/var/lib/apt/lists/*_Packages
        echo "$pkgs" > "$tree.tmp/.tensorless-rootfs-ok"
        rm -rf "$tree"; mv "$tree.tmp" "$tree"
      else
        rc=$?; echo "debootstrap $suite failed (rc $rc)" >> "$log"
      fi
    fi
    if [ "$rc" = 0 ]; then
      rm -rf "$dest.tmp"
      if cp -a "$tree" "$dest.tmp" && configure_rootfs "$dest.tmp" "$suite" >> "$LOGS/configure-$suite.log" 2>&1; then
        basename "$dest" > "$dest.tmp/.tensorless-rootfs-ok"
        mv "$dest.tmp" "$dest"
      else
        rc=1; echo "configure $suite failed: see $LOGS/configure-$suite.log" >> "$log"
      fi
    fi
  } || rc=$?
  echo "$rc" > "$BASE/run/rootfs-$suite.rc"
  awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f\n", b-a}' > "$BASE/run/rootfs-$suite.secs"
}
in_use() { # in_use DIR: does a running systemd-nspawn boot from DIR?
  local p
  for p in $(pgrep -x systemd-nspawn || true); do
    tr '\0' '\n' < "/proc/$p/cmdline" 2>/dev/null | grep -qxF -- "$1" && return 0
  done
  return 1
}
prune_rootfs() { # remove configured trees that are not current and that nothing boots from
  local d name
  for d in "$SHARED"/rootfs/*; do
    [ -d "$d" ] || continue
    name=$(basename "$d")
    case $name in base-*) continue;; esac
    [ "$d" = "${ROOTFS[trixie]}" ] || [ "$d" = "${ROOTFS[bookworm]}" ] && continue
    if in_use "$d"; then echo "rootfs: keeping $d (hosts still boot from it)"; continue; fi
    echo "rootfs: removing unused $d (in the background)"
    mkdir -p "$SHARED/rootfs/.trash"; mv "$d" "$SHARED/rootfs/.trash/$name.$$"
  done
  # deleting 300 MB of small files takes a while on a busy disk: do not wait for it
  if [ -d "$SHARED/rootfs/.trash" ]; then
    setsid nohup rm -rf "$SHARED/rootfs/.trash" > /dev/null 2>&1 < /dev/null 7>&- 8>&- &
  fi
}

step debootstrap-start
exec 8>"$SHARED/.rootfs.lock"
if ! flock -n 8; then
  echo "rootfs: another setup holds $SHARED/.rootfs.lock; waiting (at most $LOCK_TIMEOUT s)"
  flock -w "$LOCK_TIMEOUT" 8 || fail "$SHARED/.rootfs.lock still held after $LOCK_TIMEOUT s"
fi
declare -A ROOTFS
BG_PIDS=()
# on failure, do not leave background builds running
kill_tree() { local c; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$c"; done; kill -TERM "$1" 2>/dev/null || true; }
trap 'rc=$?; if [ $rc != 0 ]; then for p in "${BG_PIDS[@]}"; do kill_tree "$p"; done; fi' EXIT
for spec in "trixie:$TRIXIE_PKGS" "bookworm:$BOOKWORM_PKGS"; do
  suite=${spec%%:*}; pkgs=${spec#*:}
  key=$({ echo "$pkgs"; declare -f configure_rootfs; echo "$ALL_REGISTRIES $SUDO_USER_NAME $(ulimit -Hn)"; } | sha256sum | cut -c1-12)
  ROOTFS[$suite]=$SHARED/rootfs/$suite-$key
  rm -f "$BASE/run/rootfs-$suite.rc" "$BASE/run/rootfs-$suite.secs"
  if [ "$(cat "${ROOTFS[$suite]}/.tensorless-rootfs-ok" 2>/dev/null)" = "$suite-$key" ]; then
    echo "rootfs $suite: reusing ${ROOTFS[$suite]}"; echo 0 > "$BASE/run/rootfs-$suite.rc"; echo 0 > "$BASE/run/rootfs-$suite.secs"
  else
    echo "rootfs $suite: building ${ROOTFS[$suite]} in background (logs: $LOGS/debootstrap-$suite.log, $LOGS/configure-$suite.log)"
    prepare_rootfs "$suite" "$pkgs" "${ROOTFS[$suite]}" 8>&- & BG_PIDS+=($!)
  fi
done
ENGINE_TAR=$SHARED/engine/engine-cpu.tar
exec 7>"$SHARED/.engine.lock"
if ! flock -n 7; then
  echo "engine image tar: another setup holds $SHARED/.engine.lock; waiting (at most $LOCK_TIMEOUT s)"
  flock -w "$LOCK_TIMEOUT" 7 || fail "$SHARED/.engine.lock still held after $LOCK_TIMEOUT s"
fi
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
         bash "$REPO/engine/cpu/build.sh" "$ENGINE_TAR" "$SHARED/engine/rootfs-sid" > "$LOGS/engine-build.log" 2>&1; then
      rm -rf "$SHARED/engine/rootfs-sid"; echo "$BUILD_SHA" > "$ENGINE_TAR.build-sha"; echo 0 > "$BASE/run/engine.rc"
    else echo 1 > "$BASE/run/engine.rc"; fi
    awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f\n", b-a}' > "$BASE/run/engine.secs"
  ) 7>&- 8>&- & BG_PIDS+=($!)
fi
done_step

# ---------------------------------------------------------------- 3. SSH material
step ssh-keys
SSH_KEY=$BASE/ssh/id_ed25519
KNOWN=$BASE/ssh/known_hosts
SSH_CONFIG=$BASE/ssh/config
AUTH_KEYS=$BASE/ssh/authorized_keys
[ -f "$SSH_KEY" ] || ssh-keygen -q -t ed25519 -N '' -C "tensorless-tests-set$TL_SET" -f "$SSH_KEY"
install -m 644 "$SSH_KEY.pub" "$AUTH_KEYS"
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
  ip=${IPS[$idx]}; ns=${NETNS[$idx]}; v=${VETHS[$idx]}; p=${PEERS[$idx]}
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
  setsid nohup docker-registry serve "$BASE/registry/config.yml" > "$LOGS/registry.log" 2>&1 < /dev/null 7>&- 8>&- &
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
step rootfs-wait
# say_waiting T0 WHAT LOG: every 15 s, what is still running, for how long, its last log line
say_waiting() {
  local waited=$(( $(date +%s) - $1 ))
  if [ "$waited" -gt 0 ] && [ $(( waited % 15 )) -eq 0 ]; then
    echo "  still $2: ${waited} s so far; last log line: $(tail -n 1 "$3" 2>/dev/null | cut -c1-100)"
  fi
}
for suite in trixie bookworm; do
  end=$(( $(date +%s) + DEBOOTSTRAP_TIMEOUT + 120 ))
  t0=$(date +%s)
  while [ ! -f "$BASE/run/rootfs-$suite.rc" ]; do
    [ "$(date +%s)" -lt "$end" ] || fail "rootfs $suite: no result after $DEBOOTSTRAP_TIMEOUT s" "$LOGS/debootstrap-$suite.log"
    say_waiting "$t0" "building the $suite host tree (debootstrap: about 2 minutes on a fresh machine)" "$LOGS/debootstrap-$suite.log"
    sleep 1
  done
  [ "$(cat "$BASE/run/rootfs-$suite.rc")" = 0 ] || fail "building rootfs $suite (rc $(cat "$BASE/run/rootfs-$suite.rc"))" "$LOGS/debootstrap-$suite.log"
  record "rootfs-$suite" "$(cat "$BASE/run/rootfs-$suite.secs")"
done
prune_rootfs
flock -u 8; exec 8>&-
done_step

# ---------------------------------------------------------------- 8. boot hosts
step boot-hosts
host_running() { local f=$BASE/run/nspawn-$1.pid; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; }
stop_host() { # stop_host NAME: SIGTERM (clean poweroff; a supervisor passes it on), bounded
  local f=$BASE/run/nspawn-$1.pid p
  p=$(cat "$f")
  kill -TERM "$p" 2>/dev/null || true
  # a guest whose halt fails waits forever; nspawn ends it on a second SIGTERM (teardown.sh)
  wait_for 10 "stop $1" bash -c "! kill -0 $p" || kill -TERM "$p" 2>/dev/null || true
  wait_for 20 "stop $1" bash -c "! kill -0 $p" || kill -KILL "$p" 2>/dev/null || true
  rm -f "$f"
}
ssh_ok() { ssh -F "$SSH_CONFIG" -o ConnectTimeout=2 "$1" true; }
export SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 SYSTEMD_NSPAWN_API_VFS_WRITABLE=network SYSTEMD_NSPAWN_LOCK=0
started=()
for idx in "${!NAMES[@]}"; do
  name=${NAMES[$idx]}; suite=${SUITES[$idx]}; hk=$BASE/ssh/hostkeys/$name; st=$BASE/hosts/$name
  src=${ROOTFS[$suite]}
  if host_running "$name"; then
    if [ "$(cat "$BASE/run/host-$name.rootfs" 2>/dev/null)" != "$src" ]; then
      echo "$name: running from an older rootfs ($(cat "$BASE/run/host-$name.rootfs" 2>/dev/null || echo unrecorded)); restarting from $src"
      stop_host "$name"
    elif ssh_ok "$name" >/dev/null 2>&1; then
      echo "$name: already running"; continue
    else
      echo "$name: running but not answering SSH; restarting"
      stop_host "$name"
    fi
  fi
  rm -rf "$st"; mkdir -p "$st/containers"
  args=(-b --register=no --keep-unit --machine="$name" --hostname="$name"
    --network-namespace-path="/run/netns/${NETNS[$idx]}"
    --capability=all --system-call-filter='@keyring bpf' --bind=/dev/fuse
    --bind="$st/containers:/var/lib/containers"
    --bind-ro="$hk/ssh_host_ed25519_key:/etc/ssh/ssh_host_ed25519_key"
    --bind-ro="$hk/ssh_host_ed25519_key.pub:/etc/ssh/ssh_host_ed25519_key.pub"
    --bind-ro="$AUTH_KEYS:/etc/ssh/tensorless-test/authorized_keys"
    --resolv-conf=off --link-journal=no --console=read-only)
  if [ "${PERSISTENT[$idx]}" = 1 ]; then
    # its own root (a copy of the shared tree), kept across reboots; the supervisor starts
    # nspawn again when it exits 133 (the guest rebooted). Podman storage: the ext4 folder above.
    cp -a "$src" "$st/root" || fail "copy $src to $st/root"
    setsid nohup bash "$SCRIPT_DIR/supervise.sh" systemd-nspawn -D "$st/root" "${args[@]}" \
      > "$LOGS/nspawn-$name.log" 2>&1 < /dev/null 7>&- &
  else
    # --volatile=overlay: every boot starts from the pristine shared tree (writes land in a tmpfs
    # overlay); podman storage cannot live on overlayfs, so each host gets its own ext4 folder.
    setsid nohup systemd-nspawn -D "$src" --volatile=overlay "${args[@]}" \
      > "$LOGS/nspawn-$name.log" 2>&1 < /dev/null 7>&- &
  fi
  echo $! > "$BASE/run/nspawn-$name.pid"
  echo "$src" > "$BASE/run/host-$name.rootfs"
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
check_host() { # check_host NAME: systemd up, registry reachable, operator has passwordless sudo
  local name=$1 state
  state=$(ssh -F "$SSH_CONFIG" "$name" 'timeout 60 systemctl is-system-running --wait' 2>&1 || true)
  if [ "$state" = degraded ]; then
    # seen now and then under load: a unit fails at boot with "Failed to spawn executor: No
    # such file or directory" (result 'resources'); when that is systemd-user-sessions,
    # /run/nologin stays and only root can log in. Start the failed units once more.
    failed=$(ssh -F "$SSH_CONFIG" "$name" 'systemctl list-units --failed --no-legend --plain | cut -d" " -f1 | xargs' 2>&1 || true)
    echo "$name: degraded at boot (failed: ${failed:-?}); restarting those units once"
    ssh -F "$SSH_CONFIG" "$name" "systemctl reset-failed; timeout 60 systemctl restart $failed" || true
    state=$(ssh -F "$SSH_CONFIG" "$name" 'timeout 60 systemctl is-system-running --wait' 2>&1 || true)
  fi
  case $state in running|degraded) ;; *) echo "$name: systemctl is-system-running says '$state' (log: $LOGS/nspawn-$name.log)"; return 1;; esac
  ssh -F "$SSH_CONFIG" "$name" "curl -fsS -m 5 http://$REGISTRY/v2/ >/dev/null" \
    || { echo "$name cannot reach the registry http://$REGISTRY/v2/ (log: $LOGS/registry.log)"; return 1; }
  ssh -F "$SSH_CONFIG" -l "$SUDO_USER_NAME" "$name" 'sudo -n true' \
    || { echo "$name: $SUDO_USER_NAME cannot log in or has no passwordless sudo (log: $LOGS/nspawn-$name.log)"; return 1; }
  echo "$name: system $state"
}
checks=()
for name in "${NAMES[@]}"; do check_host "$name" > "$BASE/run/check-$name.out" 2>&1 & checks+=("$!:$name"); done
bad=0
for c in "${checks[@]}"; do
  wait "${c%%:*}" || bad=1
  cat "$BASE/run/check-${c#*:}.out"; rm -f "$BASE/run/check-${c#*:}.out"
done
[ $bad = 0 ] || fail "host checks failed (above)"
done_step

# ---------------------------------------------------------------- 9. engine image -> registry
step engine-image
end=$(( $(date +%s) + DEBOOTSTRAP_TIMEOUT + 60 ))
t0=$(date +%s)
while [ ! -f "$BASE/run/engine.rc" ]; do
  [ "$(date +%s)" -lt "$end" ] || fail "engine build: no result" "$LOGS/engine-build.log"
  say_waiting "$t0" "building the CPU engine image (Debian's llama-server by debootstrap)" "$LOGS/engine-build.log"
  sleep 1
done
[ "$(cat "$BASE/run/engine.rc")" = 0 ] || fail "engine/cpu/build.sh" "$LOGS/engine-build.log"
flock -u 7; exec 7>&-
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

# ---------------------------------------------------------------- 10. hosts.json, profiles
step hosts-json
NEW_JSON=$BASE/hosts.json.new
"$PY" "$SCRIPT_DIR/harness.py" --base "$BASE" write-hosts-json --gpus "$N" --out "$NEW_JSON" \
  --rootfs "trixie=${ROOTFS[trixie]}" --rootfs "bookworm=${ROOTFS[bookworm]}" \
  --image-ref "$IMAGE_REF" --gguf "$GGUF" --engine-tar "$ENGINE_TAR" \
  > "$LOGS/hosts-json.log" 2>&1 || fail "probing the hosts for $NEW_JSON" "$LOGS/hosts-json.log"
done_step
step profiles
# freshly booted hosts get their default profile (a reset of a pristine host does only that);
# running hosts are left alone: every host test resets them before it starts
if [ ${#started[@]} -gt 0 ]; then
  "$PY" "$SCRIPT_DIR/harness.py" --base "$BASE" reset --hosts-json "$NEW_JSON" "${started[@]}" \
    >> "$LOGS/profiles.log" 2>&1 || fail "default profiles on ${started[*]}" "$LOGS/profiles.log"
fi
TOTAL=$(awk -v a="$T_ALL" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}')
done_step
record TOTAL "$TOTAL"
"$PY" - "$NEW_JSON" "$BASE/timings.tsv" <<'EOF' || fail "timings into $NEW_JSON"
import json, sys
path, tsv = sys.argv[1], sys.argv[2]
data = json.load(open(path))
data["timings"] = {k: float(v) for k, v in (ln.split("\t") for ln in open(tsv).read().splitlines() if ln)}
open(path, "w").write(json.dumps(data, indent=2) + "\n")
EOF
mv "$NEW_JSON" "$BASE/hosts.json"
echo "wrote $BASE/hosts.json"
echo "setup: set $TL_SET done in ${TOTAL}s (per-step timings in $BASE/timings.tsv)"
