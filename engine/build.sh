#!/bin/bash
# Build (and push) one GPU engine image: llama-server from the pinned llama.cpp source, one CUDA
# architecture per image, from Debian packages pinned by version and sha256. Needs root, a Debian
# mirror, debootstrap, python3 and (to push) skopeo; no container engine, no GPU, never CI.
# `--check` and `--digest-line` are the pure parts, safe anywhere (no network, no root).
#   engine/build.sh --check ARCH                 validate the pins for ARCH, exit 1 if any is unfilled
#   engine/build.sh --digest-line NAME DIGEST    print the [engine] image line for a pushed digest
#   engine/build.sh --print-sha256 ARCH          download the pinned archive, print its sha256 (to review, then pin)
#   engine/build.sh ARCH [--release engine-vX.Y.Z] [--push REGISTRY/NAME [--insecure]]
# Pins: engine/source.env (llama.cpp), engine/ARCH/engine.env (CUDA architecture),
#   engine/debian/suite.env and engine/debian/{build,runtime}.lock (every Debian package).
# Env: ENGINE_WORK (default /var/tmp/tensorless-engine/build-ARCH), ENGINE_CACHE (downloaded
#   source, default /var/tmp/tensorless-engine/cache), JOBS (compile jobs, default 2),
#   COMPILE_TIMEOUT (seconds, default 10800), MIRROR (Debian mirror).
# Writes ENGINE_WORK/oci (an OCI layout, tag X.Y.Z-ARCH), ENGINE_WORK/logs, ENGINE_WORK/timings.tsv.
# Exit: 0 done, 1 refused or failed (one line says why and which log to read), 2 usage.
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)

die() { echo "build.sh: $*" >&2; exit 1; }
usage() { sed -n '6,9s/^#  //p' "$0" >&2; exit 2; }

# --- pure parts -----------------------------------------------------------------------------

arch_env() {  # ARCH -> path of its engine.env (refuses an unknown arch)
  [[ $1 =~ ^sm[0-9]+$ ]] || die "arch '$1' is not of the form smNN (sm60, sm90)"
  local known=() f
  for f in "$HERE"/sm*/engine.env; do [ -f "$f" ] && known+=("$(basename "$(dirname "$f")")"); done
  [ -f "$HERE/$1/engine.env" ] || die "no engine/$1/engine.env (known: ${known[*]:-none})"
  echo "$HERE/$1/engine.env"
}

pin() {  # FILE NAME -> the value of `NAME=value` (quotes dropped; empty when absent)
  sed -n "s/^$2=\"\\{0,1\\}\\([^\"]*\\)\"\\{0,1\\}\$/\\1/p" "$1" | head -1
}

check_lock() {  # FILE: every entry "package version arch sha256", none a placeholder
  local file=$1 bad=0 n=0 line
  [ -s "$file" ] || { echo "build.sh: ${file#"$HERE"/} is missing or empty: engine/lib/rootfs.sh ROLE DIR --write-lock" >&2; return 1; }
  while IFS= read -r line; do
    [[ -z $line || $line == \#* ]] && continue
    n=$((n + 1))
    if [[ $line == *PLACEHOLDER* ]]; then
      echo "build.sh: ${file#"$HERE"/}: '$line' is a placeholder" >&2; bad=1
    elif [[ ! $line =~ ^[a-z0-9][a-z0-9+.-]+\ [A-Za-z0-9.+~:-]+\ (amd64|all)\ [0-9a-f]{64}$ ]]; then
      echo "build.sh: ${file#"$HERE"/}: '$line' is not 'package version arch sha256'" >&2; bad=1
    fi
  done <"$file"
  [ "$n" -gt 0 ] || { echo "build.sh: ${file#"$HERE"/} pins no package" >&2; bad=1; }
  return $bad
}

check_pins() {  # ARCH: every pin well-formed and filled; prints each problem, returns 1 if any
  local arch=$1 env bad=0 url tree sha cc epoch role
  env=$(arch_env "$arch") || return 1
  url=$(pin "$HERE/source.env" LLAMA_CPP_URL); tree=$(pin "$HERE/source.env" LLAMA_CPP_TREE)
  sha=$(pin "$HERE/source.env" LLAMA_CPP_SHA256)
  if [[ ! $url =~ ^https://(files\.pythonhosted\.org/packages/[0-9a-f/]+/[A-Za-z0-9_.-]+\.tar\.gz|github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/archive/[0-9a-f]{40}\.tar\.gz)$ ]]; then
    echo "build.sh: $arch: LLAMA_CPP_URL='$url' is neither a PyPI sdist file nor a GitHub archive of a 40-hex commit" >&2; bad=1; fi
  if [[ ! $tree =~ ^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$ ]] || [[ $tree == *..* ]]; then
    echo "build.sh: $arch: LLAMA_CPP_TREE='$tree' is not a clean path inside the archive" >&2; bad=1; fi
  if [[ $sha == *PLACEHOLDER* ]]; then
    echo "build.sh: $arch: LLAMA_CPP_SHA256 is a placeholder; fill it as engine/README.md says (engine/build.sh --print-sha256 $arch, then verify)" >&2; bad=1
  elif [[ ! $sha =~ ^[0-9a-f]{64}$ ]]; then
    echo "build.sh: $arch: LLAMA_CPP_SHA256='$sha' is not 64 lowercase hex characters" >&2; bad=1; fi
  cc=$(pin "$env" CUDA_ARCHITECTURES)
  if [ "$cc" != "${arch#sm}" ]; then
    echo "build.sh: $arch: CUDA_ARCHITECTURES is '$cc', must be exactly ${arch#sm} (one arch per image)" >&2; bad=1; fi
  epoch=$(pin "$HERE/debian/suite.env" SOURCE_DATE_EPOCH)
  [[ $epoch =~ ^[0-9]{9,11}$ ]] || { echo "build.sh: $arch: SOURCE_DATE_EPOCH='$epoch' in engine/debian/suite.env is not a Unix time" >&2; bad=1; }
  [[ $(pin "$HERE/debian/suite.env" SUITE) =~ ^[a-z]+$ ]] || { echo "build.sh: $arch: no SUITE in engine/debian/suite.env" >&2; bad=1; }
  for role in build runtime; do check_lock "$HERE/debian/$role.lock" || bad=1; done
  return $bad
}

digest_line() {  # NAME DIGEST -> the [engine] image line
  local name=$1 digest=$2
  [[ $name =~ ^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+$ ]] \
    || die "'$name' is not a REGISTRY/NAME without tag or digest (e.g. ghcr.io/org/tensorless-engine)"
  [[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || die "'$digest' is not a sha256:64-hex digest"
  echo "image   = \"$name@$digest\""
}

image_tag() {  # RELEASE ARCH -> the pushed tag, engine-v0.1.0 + sm60 -> 0.1.0-sm60
  local release=$1 arch=$2
  [[ $release =~ ^engine-v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--release '$release' is not engine-vX.Y.Z"
  echo "${release#engine-v}-$arch"
}

cuda_version() {  # the CUDA release of the runtime lock, from libcudart12's Debian version (12.4.127~12.4.1-2 -> 12.4.1)
  awk '$1 == "libcudart12" { v = $2; sub(/^[^~]*~/, "", v); sub(/-[^-]*$/, "", v); print v }' "$HERE/debian/runtime.lock"
}

# --- effects (build machine only) -----------------------------------------------------------

fetch_archive() {  # URL DEST: download the archive (nothing is trusted until sha256sum -c)
  command -v curl >/dev/null || die "curl is not installed"
  curl -fsSL --retry 3 -o "$2" "$1" || die "cannot download $1"
}

T0=0
step() { STEP=$1; T0=$(date +%s.%N); echo "build.sh: === $STEP"; }
done_step() {
  local secs; secs=$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
  printf '%s\t%s\n' "$STEP" "$secs" >>"$WORK/timings.tsv"
  echo "build.sh: $STEP took ${secs}s"
}

# in_root ROOT [--net] CMD...: run CMD chrooted in ROOT with /proc, a clean environment and, unless
# --net, no network at all; the mounts live in a namespace of their own and vanish with it
in_root() {
  local root=$1 net=--net; shift
  if [ "${1:-}" = --net ]; then net=; shift; fi
  # shellcheck disable=SC2016  # the inner script is single-quoted on purpose
  unshare --mount --propagation private ${net:+"$net"} sh -c '
    mount -t proc proc "$0/proc" && exec chroot "$0" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
      HOME=/root LANG=C.UTF-8 TZ=UTC SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" JOBS="$JOBS" "$@"' "$root" "$@"
}

finalize_runtime() {  # ROOT OUT: llama-server into the runtime tree, then make the tree reproducible
  local root=$1 out=$2 day
  mkdir -p "$root/usr/lib/llama-server"
  cp -P "$out"/lib/* "$root/usr/lib/llama-server/"
  install -m 0755 "$out/bin/llama-server" "$root/usr/bin/llama-server"
  echo /usr/lib/llama-server >"$root/etc/ld.so.conf.d/llama-server.conf"
  # the plain user of the contract (uid 10001); written directly, not by useradd, so that no
  # "last changed" date of today lands in /etc/shadow
  echo 'llama:x:10001:10001:llama-server:/nonexistent:/usr/sbin/nologin' >>"$root/etc/passwd"
  echo 'llama:x:10001:' >>"$root/etc/group"
  # what debootstrap and dpkg leave that differs run to run or is not needed at run time: logs,
  # apt and debconf caches, backups, docs, man pages, locales, the host's resolv.conf and hostname
  rm -rf "$root"/var/log/* "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* \
         "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old "$root"/etc/*- \
         "$root"/var/cache/ldconfig/aux-cache "$root"/usr/share/doc/* "$root"/usr/share/man/* \
         "$root"/usr/share/info/* "$root"/etc/resolv.conf "$root"/etc/hostname "$root"/etc/machine-id \
         "$root"/var/lib/dpkg/lock* "$root"/var/lib/apt/extended_states "$root"/root/.bash_history \
         "$root"/tmp/* "$root"/var/tmp/*
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  day=$((SOURCE_DATE_EPOCH / 86400))
  for f in "$root/etc/shadow" "$root/etc/gshadow"; do
    [ -f "$f" ] || continue
    [ "$f" = "$root/etc/gshadow" ] || awk -F: -v OFS=: -v d="$day" '$3 != "" { $3 = d } { print }' "$f" >"$f.new"
    [ ! -f "$f.new" ] || { cat "$f.new" >"$f"; rm -f "$f.new"; }
  done
  in_root "$root" ldconfig
  rm -f "$root/var/cache/ldconfig/aux-cache"
  # every library of llama-server and of its backend modules resolves except libcuda.so.1, which
  # CDI or the container toolkit mounts from the host driver
  : >"$WORK/logs/ldd.txt"
  local f
  for f in /usr/bin/llama-server $(cd "$root" && find usr/lib/llama-server -name '*.so*' -type f | sort); do
    { echo "== $f"; in_root "$root" ldd "/${f#/}" 2>&1 || true; } >>"$WORK/logs/ldd.txt"
  done
  grep -q 'libcudart\.so\.12 => ' "$WORK/logs/ldd.txt" \
    || die "no library in the runtime tree links the CUDA runtime: not a CUDA build? read $WORK/logs/ldd.txt"
  if grep -v 'libcuda\.so\.1' "$WORK/logs/ldd.txt" | grep -q 'not found'; then
    grep 'not found' "$WORK/logs/ldd.txt" >&2
    die "unresolved libraries in the runtime tree (libcuda.so.1 is the only one allowed); read $WORK/logs/ldd.txt"
  fi
}

build() {
  local arch=$1 release=$2 push=$3 insecure=$4 url tree sha cc cuda tag out digest pushed
  check_pins "$arch" || die "$arch: refused, fix the pins above first"
  [ -z "$push" ] || [ "$release" != unreleased ] || die "--push needs --release engine-vX.Y.Z"
  [ "$release" = unreleased ] || image_tag "$release" "$arch" >/dev/null
  [ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot, unshare)"
  command -v python3 >/dev/null || die "python3 is not installed"
  [ -z "$push" ] || command -v skopeo >/dev/null || die "skopeo is not installed (apt-get install skopeo)"
  url=$(pin "$HERE/source.env" LLAMA_CPP_URL); tree=$(pin "$HERE/source.env" LLAMA_CPP_TREE)
  sha=$(pin "$HERE/source.env" LLAMA_CPP_SHA256); cc=$(pin "$(arch_env "$arch")" CUDA_ARCHITECTURES)
  cuda=$(cuda_version); [[ $cuda =~ ^12\.[0-9]+\.[0-9]+$ ]] || die "runtime.lock: CUDA '$cuda' is not 12.x"
  SOURCE_DATE_EPOCH=$(pin "$HERE/debian/suite.env" SOURCE_DATE_EPOCH); JOBS=${JOBS:-2}
  export SOURCE_DATE_EPOCH JOBS
  if [ "$release" = unreleased ]; then tag=unreleased-$arch; else tag=$(image_tag "$release" "$arch"); fi
  WORK=${ENGINE_WORK:-/var/tmp/tensorless-engine/build-$arch}
  local cache=${ENGINE_CACHE:-/var/tmp/tensorless-engine/cache}
  rm -rf "$WORK"; mkdir -p "$WORK/logs" "$cache"; : >"$WORK/timings.tsv"

  step source
  local archive=$cache/llama.cpp-$sha.tar.gz
  if [ ! -f "$archive" ]; then
    echo "build.sh: downloading $url"
    fetch_archive "$url" "$archive.part"; mv "$archive.part" "$archive"
  else
    echo "build.sh: $archive from the cache (checked below like a download)"
  fi
  (cd "$(dirname "$archive")" && echo "$sha  $(basename "$archive")" | sha256sum -c --quiet -) \
    || die "llama.cpp archive sha256 is $(sha256sum "$archive" | cut -d' ' -f1), pinned $sha: refused (delete $archive)"
  echo "build.sh: archive sha256 ok ($sha)"
  done_step

  step builder-rootfs
  LOGDIR=$WORK/logs/build-rootfs nice -n 19 "$HERE/lib/rootfs.sh" build "$WORK/build-root"
  done_step

  step compile
  mkdir -p "$WORK/build-root/src"
  cp "$archive" "$WORK/build-root/src/llama.cpp.tar.gz"
  install -m 0755 "$HERE/lib/compile.sh" "$WORK/build-root/src/compile.sh"
  echo "build.sh: compiling llama-server for sm_$cc with CUDA $cuda, $JOBS jobs, no network (log: $WORK/logs/compile.log)"
  if ! timeout "${COMPILE_TIMEOUT:-10800}" nice -n 19 bash -c "$(declare -f in_root); in_root \"\$@\"" _ \
       "$WORK/build-root" /src/compile.sh "$cc" "$sha" "$tree" >"$WORK/logs/compile.log" 2>&1; then
    tail -25 "$WORK/logs/compile.log" >&2
    die "compile failed or ran past ${COMPILE_TIMEOUT:-10800}s; read $WORK/logs/compile.log"
  fi
  done_step

  step runtime-rootfs
  LOGDIR=$WORK/logs/runtime-rootfs nice -n 19 "$HERE/lib/rootfs.sh" runtime "$WORK/runtime-root"
  finalize_runtime "$WORK/runtime-root" "$WORK/build-root/out"
  done_step

  step image
  out=$(nice -n 19 python3 "$HERE/lib/oci.py" "$WORK/runtime-root" "$WORK/oci" --tag "$tag" \
        --epoch "$SOURCE_DATE_EPOCH" --created-by "engine/build.sh $arch (llama.cpp sha256:$sha, CUDA $cuda)" \
        --label "org.opencontainers.image.title=tensorless engine ($arch)" \
        --label "org.opencontainers.image.description=llama-server, CUDA $cuda, CMAKE_CUDA_ARCHITECTURES=$cc" \
        --label "org.opencontainers.image.source=$url" \
        --label "org.opencontainers.image.revision=sha256:$sha" \
        --label "org.opencontainers.image.version=$release" \
        --label "org.opencontainers.image.base.name=debian:$(pin "$HERE/debian/suite.env" SUITE) (engine/debian/runtime.lock)" \
        --label "io.tensorless.engine.arch=$arch" \
        --label "io.tensorless.engine.cuda-architectures=$cc" \
        --label "io.tensorless.engine.cuda=$cuda") || die "writing the OCI layout failed"
  echo "$out" >"$WORK/oci.txt"
  digest=$(sed -n 's/^manifest=\(sha256:[0-9a-f]*\) .*/\1/p' <<<"$out")
  echo "build.sh: image $WORK/oci:$tag manifest $digest ($(sed -n 's/.* size=\([0-9]*\).*/\1/p' <<<"$out") bytes compressed, $(du -sm "$WORK/runtime-root" | cut -f1) MB unpacked)"
  done_step
  awk -F'\t' '{ s += $2 } END { printf "build.sh: total %ds (%s)\n", s, FILENAME }' "$WORK/timings.tsv"

  [ -n "$push" ] || { echo "build.sh: not pushed (no --push); nothing to record"; return 0; }
  step push
  timeout 1800 skopeo copy --quiet ${insecure:+--dest-tls-verify=false} --digestfile "$WORK/pushed.digest" \
    "oci:$WORK/oci:$tag" "docker://$push:$tag" >"$WORK/logs/push.log" 2>&1 \
    || die "push to $push:$tag failed or ran past 1800s; read $WORK/logs/push.log"
  pushed=$(cat "$WORK/pushed.digest")
  [ "$pushed" = "$digest" ] || die "the registry reports $pushed, the layout holds $digest: refused"
  done_step
  echo "build.sh: pushed $push:$tag; put this in the [engine] table of every $arch recipe of $release:"
  digest_line "$push" "$digest"
}

# --- arguments ------------------------------------------------------------------------------

[ $# -ge 1 ] || usage
case $1 in
  --check)
    [ $# -eq 2 ] || usage
    check_pins "$2" || die "$2: refused (pins above are unfilled or malformed)"
    echo "build.sh: $2: pins ok" ;;
  --digest-line)
    [ $# -eq 3 ] || usage
    digest_line "$2" "$3" ;;
  --print-sha256)
    [ $# -eq 2 ] || usage
    arch_env "$2" >/dev/null; tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
    fetch_archive "$(pin "$HERE/source.env" LLAMA_CPP_URL)" "$tmp"
    echo "LLAMA_CPP_SHA256=$(sha256sum "$tmp" | cut -d' ' -f1)"
    echo "build.sh: review before pinning (engine/README.md, 'Moving the source pin')" >&2 ;;
  -h|--help) usage ;;
  -*) usage ;;
  *)
    arch=$1; shift; release=unreleased; push=; insecure=
    while [ $# -gt 0 ]; do
      case $1 in
        --release) [ $# -ge 2 ] || usage; release=$2; shift 2 ;;
        --push) [ $# -ge 2 ] || usage; push=$2; shift 2 ;;
        --insecure) insecure=1; shift ;;
        *) usage ;;
      esac
    done
    [ -z "$push" ] || digest_line "$push" "sha256:$(printf '0%.0s' {1..64})" >/dev/null
    build "$arch" "$release" "$push" "$insecure" ;;
esac
