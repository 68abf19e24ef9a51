#!/bin/bash
# Check an engine image against the image contract of engine/README.md, from its bytes.
#   engine/inspect.sh REF [--arch smNN] [--max-mb N] [--insecure] [--run] [--no-ldd]
# REF: any skopeo reference (oci:DIR:TAG, docker://HOST/NAME@sha256:..., containers-storage:...)
#   or a plain HOST/NAME@sha256:... (read as docker://). --insecure: plain-HTTP registry (the
#   test registry). --arch: the family expected (default: the image's own label, which must be
#   smNN). --max-mb: the most the image may weigh unpacked (default 2048). --no-ldd: skip the ldd
#   of the unpacked tree (for a test image without a libc; never for a release).
# --run also starts it with podman (a private storage and config under ENGINE_PODMAN, default
#   /var/tmp/tensorless-engine/podman): ldd inside the container, then `llama-server --version`.
# Needs skopeo, python3, tar; root for the ldd check on the unpacked tree (skipped otherwise).
# Prints one 'ok ...' line per term met and ends with 'inspect: REF meets the contract';
# exit 1 at the first term broken (the line says which), 2 usage.
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
die() { echo "inspect: FAILED: $*" >&2; exit 1; }
usage() { sed -n '3,3s/^#  //p' "$0" >&2; exit 2; }
ok() { echo "ok   $*"; }

[ $# -ge 1 ] || usage
REF=$1; shift
ARCH='' MAX_MB=2048 INSECURE='' RUN='' LDD=1
while [ $# -gt 0 ]; do
  case $1 in
    --arch) [ $# -ge 2 ] || usage; ARCH=$2; shift 2 ;;
    --max-mb) [ $# -ge 2 ] || usage; MAX_MB=$2; shift 2 ;;
    --insecure) INSECURE=1; shift ;;
    --run) RUN=1; shift ;;
    --no-ldd) LDD=''; shift ;;
    *) usage ;;
  esac
done
[[ $REF == *:* ]] || usage
case $REF in oci:*|docker://*|containers-storage:*|oci-archive:*|docker-archive:*|dir:*) ;; *) REF=docker://$REF ;; esac
for tool in skopeo python3 tar; do command -v "$tool" >/dev/null || die "$tool is not installed"; done

TMP=$(mktemp -d /var/tmp/tensorless-engine-inspect.XXXXXX); trap 'rm -rf "$TMP"' EXIT
timeout 900 skopeo copy --quiet ${INSECURE:+--src-tls-verify=false} "$REF" "oci:$TMP/img:x" >"$TMP/copy.log" 2>&1 \
  || { cat "$TMP/copy.log" >&2; die "cannot read $REF (skopeo copy failed or ran past 900s)"; }

# manifest, config and layers, from the copy (python3: no jq needed)
python3 - "$TMP/img" >"$TMP/facts" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
blob = lambda d: root / "blobs" / d.split(":")[0] / d.split(":")[1]
index = json.loads((root / "index.json").read_text())
manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
config = json.loads(blob(manifest["config"]["digest"]).read_text())
c = config.get("config", {})
print("user=" + str(c.get("User", "")))
print("entrypoint=" + json.dumps(c.get("Entrypoint")))
print("cmd=" + json.dumps(c.get("Cmd")))
print("ports=" + " ".join(sorted(c.get("ExposedPorts") or {})))
for k, v in sorted((c.get("Labels") or {}).items()):
    print(f"label:{k}={v}")
print("compressed=" + str(sum(layer["size"] for layer in manifest["layers"])))
for layer in manifest["layers"]:
    print("layer=" + str(blob(layer["digest"])))
PY
fact() { sed -n "s/^$1=//p" "$TMP/facts" | head -1; }
label() { sed -n "s/^label:$1=//p" "$TMP/facts" | head -1; }

# --- the config -----------------------------------------------------------------------------
user=$(fact user)
[[ -n $user && ${user%%:*} != 0 && ${user%%:*} != root ]] || die "runs as '${user:-root (no User)}', must be a plain user (uid 10001)"
[ "${user%%:*}" = 10001 ] || die "User is '$user', the contract says uid 10001"
ok "user $user"
[ "$(fact entrypoint)" = '["/usr/bin/llama-server"]' ] || die "Entrypoint is $(fact entrypoint), must be [\"/usr/bin/llama-server\"] (exec form)"
ok "entrypoint [\"/usr/bin/llama-server\"], exec form"
[ "$(fact cmd)" = null ] || die "Cmd is $(fact cmd); the units pass every argument, so there is none"
ok "no Cmd"
[[ " $(fact ports) " == *" 8080/tcp "* ]] || die "does not EXPOSE 8080 (ports: '$(fact ports)')"
ok "exposes 8080/tcp"
arch=$(label io.tensorless.engine.arch)
[[ $arch =~ ^sm[0-9]+$ ]] || die "label io.tensorless.engine.arch is '$arch', not smNN"
[ -z "$ARCH" ] || [ "$arch" = "$ARCH" ] || die "label io.tensorless.engine.arch is $arch, expected $ARCH"
[ "$(label io.tensorless.engine.cuda-architectures)" = "${arch#sm}" ] \
  || die "label io.tensorless.engine.cuda-architectures is '$(label io.tensorless.engine.cuda-architectures)', must be ${arch#sm}"
[[ $(label org.opencontainers.image.revision) =~ ^(sha256:[0-9a-f]{64}|[0-9a-f]{40})$ ]] \
  || die "label org.opencontainers.image.revision '$(label org.opencontainers.image.revision)' is neither sha256:64-hex nor a commit"
[ -n "$(label org.opencontainers.image.version)" ] || die "no label org.opencontainers.image.version"
ok "labels: arch $arch, cuda-architectures ${arch#sm}, revision $(label org.opencontainers.image.revision | cut -c1-19)..., version $(label org.opencontainers.image.version)"

# --- the contents ---------------------------------------------------------------------------
mkdir "$TMP/root"
while read -r layer; do
  tar -xzf "$layer" -C "$TMP/root" --no-same-owner 2>>"$TMP/tar.log" || die "cannot unpack layer $layer"
  # whiteouts: a later layer deleting a file
  find "$TMP/root" -name '.wh.*' -print0 | while IFS= read -r -d '' wh; do
    gone=$(dirname "$wh")/$(basename "$wh" | sed 's/^\.wh\.//'); rm -rf "${gone:?}" "$wh"; done
done < <(sed -n 's/^layer=//p' "$TMP/facts")
R=$TMP/root
[[ -x $R/usr/bin/llama-server && ! -L $R/usr/bin/llama-server ]] || die "no executable /usr/bin/llama-server"
ok "/usr/bin/llama-server"
[ -x "$R/usr/bin/curl" ] || die "no /usr/bin/curl (the units' health check runs curl inside the container)"
ok "/usr/bin/curl"
for t in sh sha256sum stat head tee cut mv ln; do  # the exports' init step: model-download.sh
  [[ -e $R/usr/bin/$t || -L $R/usr/bin/$t || -L $R/bin/$t ]] \
    || die "no /usr/bin/$t (the exports' init step runs the model download in the engine image)"
done
ok "sh and coreutils (sha256sum stat head tee cut mv ln)"
for lib in libcudart.so.12 libcublas.so.12 libcublasLt.so.12; do
  found=$(find "$R/usr/lib" "$R/usr/local" -name "$lib" 2>/dev/null | head -1 || true)
  [ -n "$found" ] || die "no $lib (the CUDA runtime and cuBLAS are part of the image)"
done
ok "CUDA runtime and cuBLAS: libcudart.so.12 libcublas.so.12 libcublasLt.so.12"
# nothing else: no compiler, no CUDA toolkit, no headers, no other CUDA library, no driver
bins=$(cd "$R" || exit 1; for d in usr/bin usr/sbin usr/local/bin bin sbin usr/lib/nvidia-cuda-toolkit/bin; do
    [ -d "$d" ] && find "$d" -maxdepth 1 \( -type f -o -type l \) \( -name gcc -o -name 'gcc-[0-9]*' \
      -o -name cc -o -name c++ -o -name 'g++*' -o -name 'clang*' -o -name nvcc -o -name ptxas \
      -o -name cicc -o -name fatbinary -o -name nvlink -o -name cmake -o -name make -o -name ld \
      -o -name ld.bfd -o -name ld.gold -o -name as \) -print; done | sort | head -20 || true)
libs=$(cd "$R" || exit 1; find . \( -path ./proc -o -path ./sys -o -path ./var/lib/dpkg \) -prune -o \
    \( -type f -o -type l \) \( -name 'libcuda.so*' -o -name 'libnvidia-*' -o -name 'libcufft*' \
    -o -name 'libcusparse*' -o -name 'libcusolver*' -o -name 'libcurand*' -o -name 'libnpp*' \
    -o -name 'libnvrtc*' -o -name 'libnvjpeg*' -o -name 'libnvvm*' -o -name '*.a' -o -name '*.h' \
    -o -name '*.hpp' -o -name '*.cuh' \) -print | sort | head -20 || true)
extra=$(printf '%s\n%s\n' "$bins" "$libs" | sed '/^$/d')
[ -z "$extra" ] || die "holds what an engine image must not (compiler, toolkit, headers, other CUDA libraries, a driver): $(echo "$extra" | paste -sd' ')"
ok "no compiler, CUDA toolkit, headers, static libraries, other CUDA libraries or driver"
# one architecture: ggml's CUDA code is machine code for exactly this family and nothing else
cudalibs=$(find "$R/usr/lib/llama-server" -name 'libggml-cuda.so*' -type f 2>/dev/null | head -1 || true)
[ -n "$cudalibs" ] || die "no libggml-cuda.so under /usr/lib/llama-server: not a CUDA build"
archs=$(python3 "$HERE/lib/fatbin.py" "$cudalibs" | sed -n 's/^archs: //p' || true)
[ "$archs" = "ELF:sm_${arch#sm}" ] || die "libggml-cuda carries '$archs', must be exactly ELF:sm_${arch#sm} (no PTX to JIT, no other arch)"
ok "libggml-cuda device code: $archs only"
cublaslt=$(find "$R/usr/lib" -name 'libcublasLt.so.12*' -type f | head -1 || true)
cublas_archs=$(python3 "$HERE/lib/fatbin.py" "$cublaslt" | sed -n 's/^archs: //p' || true)
[[ " $cublas_archs " == *" ELF:sm_${arch#sm} "* ]] || die "cuBLASLt has no machine code for $arch ($cublas_archs)"
ok "cuBLASLt has machine code for $arch"
mb=$(du -sm "$R" | cut -f1)
[ "$mb" -le "$MAX_MB" ] || die "weighs $mb MB unpacked, more than --max-mb $MAX_MB"
ok "size: $mb MB unpacked, $(( $(fact compressed) / 1048576 )) MB compressed (limit $MAX_MB MB)"
# ldd of llama-server and of every backend module it loads (the modules link cudart, cuBLAS and
# the driver's libcuda.so.1; llama-server itself links none of them)
# shellcheck disable=SC2016  # expanded by the shell inside the image
LDD_ALL='for f in /usr/bin/llama-server /usr/lib/llama-server/*.so*; do [ -L "$f" ] || { echo "== $f"; ldd "$f"; }; done'
if [ -z "$LDD" ]; then
  echo "skip ldd on the unpacked tree (--no-ldd)"
elif [ "$(id -u)" = 0 ]; then
  # shellcheck disable=SC2016  # the inner script is single-quoted on purpose
  unshare --mount --propagation private --net sh -c 'mkdir -p "$0/proc" && mount -t proc proc "$0/proc" &&
    exec chroot "$0" /bin/sh -c "$1"' "$R" "$LDD_ALL" >"$TMP/ldd.txt" 2>&1 || true
  missing=$(grep 'not found' "$TMP/ldd.txt" | awk '{print $1}' | sort -u | paste -sd' ')
  [ "$(grep -c '=>' "$TMP/ldd.txt")" -gt 5 ] || { cat "$TMP/ldd.txt" >&2; die "ldd in the unpacked tree gave no library list"; }
  [ -z "$missing" ] || [ "$missing" = libcuda.so.1 ] || die "unresolved in the image: $missing (only the host driver's libcuda.so.1 may be)"
  ok "ldd (unpacked tree, llama-server and each module in /usr/lib/llama-server): every library resolves${missing:+ except $missing (from the host driver)}"
else
  echo "skip ldd on the unpacked tree (needs root)"
fi

if [ -n "$RUN" ]; then
  command -v podman >/dev/null || die "--run: podman is not installed"
  PM=${ENGINE_PODMAN:-/var/tmp/tensorless-engine/podman}; mkdir -p "$PM"
  # the podman 4.3 of this machine: runc, bounded ulimits (root lacks CAP_SYS_RESOURCE), vfs storage
  printf '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n' >"$PM/containers.conf"
  printf '[storage]\ndriver = "vfs"\ngraphroot = "%s/storage"\nrunroot = "%s/run"\n' "$PM" "$PM" >"$PM/storage.conf"
  export CONTAINERS_CONF=$PM/containers.conf CONTAINERS_STORAGE_CONF=$PM/storage.conf
  local_ref=localhost/tensorless-engine-inspect:$$
  timeout 900 skopeo copy --quiet "oci:$TMP/img:x" "containers-storage:$local_ref" >"$TMP/pull.log" 2>&1 \
    || { cat "$TMP/pull.log" >&2; die "--run: copying the image into podman's storage ($PM) failed"; }
  timeout 120 podman run --rm --network none --entrypoint /bin/sh "$local_ref" -c "$LDD_ALL" >"$TMP/ldd-run.txt" 2>&1 || true
  missing=$(grep 'not found' "$TMP/ldd-run.txt" | awk '{print $1}' | sort -u | paste -sd' ')
  [ "$(grep -c '=>' "$TMP/ldd-run.txt")" -gt 5 ] || { cat "$TMP/ldd-run.txt" >&2; podman rmi -f "$local_ref" >/dev/null 2>&1 || true; die "--run: ldd in the container gave no library list"; }
  [ -z "$missing" ] || [ "$missing" = libcuda.so.1 ] || die "--run: unresolved in the container: $missing"
  ok "ldd (podman run, as $(podman run --rm --network none --entrypoint /usr/bin/id "$local_ref" -u)): every library resolves${missing:+ except $missing (from the host driver)}"
  set +e; timeout 120 podman run --rm --network none "$local_ref" --version >"$TMP/version.txt" 2>&1; rc=$?; set -e
  podman rmi -f "$local_ref" >/dev/null 2>&1 || true
  echo "---- podman run IMAGE --version (exit $rc):"; sed 's/^/     /' "$TMP/version.txt"
  grep -q '^version: ' "$TMP/version.txt" || die "--run: llama-server --version printed no 'version:' line (exit $rc)"
  ok "llama-server --version runs (exit $rc)"
fi
echo "inspect: $REF meets the contract"
