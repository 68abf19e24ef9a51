#!/bin/bash
# Build the CPU engine image rootfs tarball: Debian sid + the packaged llama.cpp (llama.cpp-tools,
# CPU backend, llama-server) and curl, which every engine image carries for its /health check.
# Never compiles llama.cpp.
#   engine/cpu/build.sh OUT.tar [WORKDIR]
# Env: MIRROR (default: the first URIs: of /etc/apt/sources.list.d/debian.sources),
#      SUITE (default sid), DEBOOTSTRAP_TIMEOUT (seconds, default 900).
# Writes OUT.tar (a filesystem tree for `podman import`) and OUT.tar.info (package versions,
# llama-server path). Exit non-zero with the log's tail on failure.
set -euo pipefail
OUT=${1:?usage: build.sh OUT.tar [WORKDIR]}
OUT=$(readlink -f "$OUT")
WORK=${2:-$(dirname "$OUT")/engine-cpu-rootfs}
SUITE=${SUITE:-sid}
MIRROR=${MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
LOG=${LOG:-$(dirname "$OUT")/engine-cpu-debootstrap.log}
command -v debootstrap >/dev/null || { echo "build.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

rm -rf "$WORK"; mkdir -p "$WORK"
echo "build.sh: debootstrap --variant=minbase --include=llama.cpp-tools,curl $SUITE (log: $LOG)"
if ! timeout "${DEBOOTSTRAP_TIMEOUT:-900}" debootstrap --variant=minbase --include=llama.cpp-tools,curl \
     "$SUITE" "$WORK" "$MIRROR" >"$LOG" 2>&1; then
  echo "build.sh: debootstrap of $SUITE failed or timed out; last lines of $LOG:" >&2
  tail -25 "$LOG" >&2; exit 1
fi
SERVER=$(chroot "$WORK" sh -c 'command -v llama-server' || true)
[ -n "$SERVER" ] || { echo "build.sh: llama-server not found in the $SUITE rootfs ($WORK)" >&2; exit 1; }
VERSIONS=$(chroot "$WORK" dpkg-query -W -f '${Package} ${Version}\n' llama.cpp-tools libggml0 libllama0 2>/dev/null || true)
# trim: leftover .debs, apt lists, docs, man pages, locales (keeps the image about 125 MB)
rm -rf "$WORK"/var/cache/apt/archives/*.deb "$WORK"/var/cache/apt/*.bin "$WORK"/var/lib/apt/lists/* \
       "$WORK"/usr/share/doc/* "$WORK"/usr/share/man/* "$WORK"/usr/share/info/* "$WORK"/var/log/*.log \
       "$WORK"/var/cache/debconf/*-old "$WORK"/var/log/apt/*
find "$WORK/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true
mkdir -p "$WORK/models"
tar --numeric-owner -C "$WORK" -cf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
{ echo "llama_server=$SERVER"; echo "suite=$SUITE"; echo "$VERSIONS" | sed 's/^/package=/'; } > "$OUT.info"
echo "build.sh: wrote $OUT ($(du -m "$OUT" | cut -f1) MB), llama-server at $SERVER"
