#!/bin/bash
# shellcheck disable=SC2016  # dpkg-query formats and the inner sh -c script are single-quoted on purpose
# Make one engine root filesystem (ROLE build or runtime) from Debian, every package pinned.
#   engine/lib/rootfs.sh ROLE DIR             install exactly engine/debian/ROLE.lock, refuse drift
#   engine/lib/rootfs.sh ROLE DIR --write-lock
#                                             resolve the ROLE packages afresh, write the lock
# Steps: debootstrap --variant=minbase SUITE (engine/debian/suite.env), then apt-get install of
# the role's packages inside the tree (every package=version from the lock, no recommends), then
# a check that the installed set is the lock's set and that each .deb apt and debootstrap fetched
# hashes to the lock's sha256 (both check the signed suite index first; the lock holds the bytes
# still when the mirror moves on). The .debs are then removed.
# Env: MIRROR (default: the first URIs: of /etc/apt/sources.list.d/debian.sources),
#      LOGDIR (default DIR.logs), ROOTFS_TIMEOUT (seconds per step, default 1800).
# Exit 0 done, 1 failed or refused (one line says what, and which log to read).
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
die() { echo "rootfs.sh: $*" >&2; exit 1; }
[ $# -ge 2 ] || { sed -n '3,5s/^#  //p' "$0" >&2; exit 2; }
ROLE=$1 DIR=$2 MODE=${3:-lock}
case $ROLE in build|runtime) ;; *) die "ROLE '$ROLE' is neither build nor runtime";; esac
case $MODE in lock|--write-lock) ;; *) die "unknown option '$MODE'";; esac
# shellcheck disable=SC1091  # engine/debian/suite.env
. "$HERE/debian/suite.env"
LOCK=$HERE/debian/$ROLE.lock
if [ "$ROLE" = build ]; then PACKAGES=$BUILD_PACKAGES; else PACKAGES=$RUNTIME_PACKAGES; fi
MIRROR=${MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
LOGDIR=${LOGDIR:-$DIR.logs}
LIMIT=${ROOTFS_TIMEOUT:-1800}
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot)"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
if [ "$MODE" = lock ]; then
  [ -s "$LOCK" ] || die "no $LOCK: write it first with: engine/lib/rootfs.sh $ROLE DIR --write-lock"
fi
mkdir -p "$LOGDIR"

lock_entries() {  # the lock's "package version arch sha256" lines (comments dropped)
  grep -v '^#' "$LOCK" | grep -v '^$'
}

rm -rf "$DIR"; mkdir -p "$DIR"
echo "rootfs.sh: $ROLE: debootstrap --variant=minbase --components=$COMPONENTS $SUITE (log: $LOGDIR/debootstrap.log)"
if ! timeout "$LIMIT" debootstrap --variant=minbase --components="$COMPONENTS" \
     "$SUITE" "$DIR" "$MIRROR" >"$LOGDIR/debootstrap.log" 2>&1; then
  tail -20 "$LOGDIR/debootstrap.log" >&2
  die "$ROLE: debootstrap of $SUITE failed or ran past ${LIMIT}s; read $LOGDIR/debootstrap.log"
fi

# The packages to ask apt for: the role's, each at its locked version (all locked packages that
# minbase lacks, so apt resolves nothing on its own), or unversioned to write a new lock.
want=()
if [ "$MODE" = lock ]; then
  while read -r pkg ver _arch _sha; do
    chroot "$DIR" dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' \
      || want+=("$pkg=$ver")
  done < <(lock_entries)
else
  read -r -a want <<<"$PACKAGES"
fi
# no service starts inside the tree; apt runs with /proc in a mount namespace of its own that
# vanishes with it (nothing is left mounted)
printf '#!/bin/sh\nexit 101\n' >"$DIR/usr/sbin/policy-rc.d"; chmod 755 "$DIR/usr/sbin/policy-rc.d"
echo "rootfs.sh: $ROLE: apt-get install ${#want[@]} packages (log: $LOGDIR/apt.log)"
if ! timeout "$LIMIT" unshare --mount --propagation private sh -c '
       mount -t proc proc "$1/proc" && shift &&
       chroot "$0" sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
         --no-install-recommends -o APT::Install-Suggests=0 \"\$@\"" sh "$@"' \
     "$DIR" "$DIR" "${want[@]}" >"$LOGDIR/apt.log" 2>&1; then
  tail -20 "$LOGDIR/apt.log" >&2
  die "$ROLE: apt-get install failed or ran past ${LIMIT}s (a locked version gone from the mirror?); read $LOGDIR/apt.log"
fi
rm -f "$DIR/usr/sbin/policy-rc.d"

# What is installed, and the sha256 of every .deb that brought it
installed=$(mktemp); trap 'rm -f "$installed" "$installed.debs"' EXIT
chroot "$DIR" dpkg-query -W -f '${Package} ${Version} ${Architecture}\n' | sort >"$installed"
: >"$installed.debs"
for deb in "$DIR"/var/cache/apt/archives/*.deb; do
  [ -e "$deb" ] || continue
  printf '%s %s\n' "$(dpkg-deb -f "$deb" Package Version Architecture | awk '{print $2}' | paste -sd' ')" \
    "$(sha256sum "$deb" | cut -d' ' -f1)" >>"$installed.debs"
done
sort -o "$installed.debs" "$installed.debs"
if [ "$MODE" = --write-lock ]; then
  missing=$(join -v1 <(awk '{print $1"_"$2"_"$3, $0}' "$installed" | sort) \
                     <(awk '{print $1"_"$2"_"$3}' "$installed.debs" | sort) | cut -d' ' -f2- || true)
  [ -z "$missing" ] || die "$ROLE: installed without a .deb to hash: $missing"
  { echo "# engine/debian/$ROLE.lock: every package of the $ROLE root filesystem, as"
    echo "# 'package version architecture sha256-of-the-.deb'. Written by engine/lib/rootfs.sh $ROLE DIR --write-lock"
    echo "# from Debian $SUITE ($COMPONENTS); the suite's InRelease then was:"
    echo "#   $(curl -fsS -m 30 "$MIRROR/dists/$SUITE/InRelease" | sed -n 's/^\(Version\|Date\): //p' | paste -sd' ') sha256 $(curl -fsS -m 30 "$MIRROR/dists/$SUITE/InRelease" | sha256sum | cut -d' ' -f1)"
    echo "# top-level packages: $PACKAGES"
    join <(awk '{print $1"_"$2"_"$3, $1, $2, $3}' "$installed" | sort) \
         <(awk '{print $1"_"$2"_"$3, $4}' "$installed.debs" | sort) | cut -d' ' -f2- | sort
  } >"$LOCK"
  echo "rootfs.sh: $ROLE: wrote $LOCK ($(lock_entries | wc -l) packages)"
else
  if ! diff <(lock_entries | awk '{print $1, $2, $3}' | sort) "$installed" >"$LOGDIR/lock.diff"; then
    sed 's/^/  /' "$LOGDIR/lock.diff" | head -20 >&2
    die "$ROLE: installed packages differ from $LOCK (< lock, > installed): the mirror moved on; refresh the lock as engine/README.md says"
  fi
  bad=$(join <(lock_entries | awk '{print $1"_"$2"_"$3, $4}' | sort) \
             <(awk '{print $1"_"$2"_"$3, $4}' "$installed.debs" | sort) | awk '$2 != $3 {print $1}')
  [ -z "$bad" ] || die "$ROLE: .deb sha256 differs from $LOCK for: $bad"
  echo "rootfs.sh: $ROLE: $(wc -l <"$installed") packages, each the locked version and .deb sha256"
fi
rm -rf "$DIR"/var/cache/apt/archives/*.deb "$DIR"/var/cache/apt/archives/partial/* "$DIR"/var/lib/apt/lists/*
