#!/bin/bash
# Build (and push) one GPU engine image: llama-server from a pinned llama.cpp commit, one CUDA
# architecture per image. Runs on a release machine with network and podman (or docker), never in
# CI; `--check` and `--digest-line` are the pure parts, safe anywhere (no network, no engine).
#   engine/build.sh --check ARCH                 validate engine/ARCH/Containerfile's pins, exit 1 if any is unfilled
#   engine/build.sh --digest-line NAME DIGEST    print the [engine] image line for a pushed digest
#   engine/build.sh --print-sha256 ARCH          download the pinned archive, print its sha256 (to review, then pin)
#   engine/build.sh ARCH [--release engine-vX.Y.Z] [--push REGISTRY/NAME]
# Env: ENGINE (podman or docker; default podman when installed).
# Exit: 0 done, 1 refused or failed (one line says why), 2 usage.
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)

die() { echo "build.sh: $*" >&2; exit 1; }
usage() { sed -n '5,8s/^#  //p' "$0" >&2; exit 2; }

# --- pure parts -----------------------------------------------------------------------------

containerfile() {  # ARCH -> path of its Containerfile (refuses an unknown arch)
  [[ $1 =~ ^sm[0-9]+$ ]] || die "arch '$1' is not of the form smNN (sm60, sm90)"
  local known=() f
  for f in "$HERE"/sm*/Containerfile; do [ -f "$f" ] && known+=("$(basename "$(dirname "$f")")"); done
  [ -f "$HERE/$1/Containerfile" ] || die "no engine/$1/Containerfile (known: ${known[*]:-none})"
  echo "$HERE/$1/Containerfile"
}

pin() {  # FILE NAME -> the default value of `ARG NAME=value` (empty when absent)
  sed -n "s/^ARG $2=\\(.*\\)\$/\\1/p" "$1" | head -1
}

check_pins() {  # ARCH: every pin well-formed and filled; prints each problem, returns 1 if any
  local arch=$1 file bad=0 url tree sha from n=0 arches
  file=$(containerfile "$arch") || return 1
  url=$(pin "$file" LLAMA_CPP_URL); tree=$(pin "$file" LLAMA_CPP_TREE); sha=$(pin "$file" LLAMA_CPP_SHA256)
  if [[ ! $url =~ ^https://(files\.pythonhosted\.org/packages/[0-9a-f/]+/[A-Za-z0-9_.-]+\.tar\.gz|github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/archive/[0-9a-f]{40}\.tar\.gz)$ ]]; then
    echo "build.sh: $arch: ARG LLAMA_CPP_URL='$url' is neither a PyPI sdist file nor a GitHub archive of a 40-hex commit" >&2; bad=1; fi
  if [[ ! $tree =~ ^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$ ]] || [[ $tree == *..* ]]; then
    echo "build.sh: $arch: ARG LLAMA_CPP_TREE='$tree' is not a clean path inside the archive" >&2; bad=1; fi
  if [[ $sha == *PLACEHOLDER* ]]; then
    echo "build.sh: $arch: ARG LLAMA_CPP_SHA256 is a placeholder; fill it as engine/README.md says (engine/build.sh --print-sha256 $arch, then verify)" >&2; bad=1
  elif [[ ! $sha =~ ^[0-9a-f]{64}$ ]]; then
    echo "build.sh: $arch: ARG LLAMA_CPP_SHA256='$sha' is not 64 lowercase hex characters" >&2; bad=1; fi
  while read -r from; do
    n=$((n + 1))
    if [[ $from == *PLACEHOLDER* ]]; then
      echo "build.sh: $arch: FROM $from: the base digest is a placeholder; resolve the tag and pin its digest" >&2; bad=1
    elif [[ ! $from =~ ^[a-z0-9./_-]+(:[A-Za-z0-9._-]+)?@sha256:[0-9a-f]{64}$ ]]; then
      echo "build.sh: $arch: FROM $from is not pinned by digest (NAME[:TAG]@sha256:64-hex)" >&2; bad=1
    fi
  done < <(awk 'toupper($1) == "FROM" { for (i = 2; i <= NF; i++) if ($i !~ /^--/) { print $i; break } }' "$file")
  [ "$n" -gt 0 ] || { echo "build.sh: $arch: no FROM line" >&2; bad=1; }
  arches=$(sed -n 's/.*-DCMAKE_CUDA_ARCHITECTURES=\([^ \\]*\).*/\1/p' "$file" | sort -u | tr '\n' ' ')
  if [ "$arches" != "${arch#sm} " ]; then
    echo "build.sh: $arch: CMAKE_CUDA_ARCHITECTURES is '${arches% }', must be exactly ${arch#sm} (one arch per image)" >&2; bad=1; fi
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


# --- effects (release machine only) ---------------------------------------------------------

pick_engine() {
  local e=${ENGINE:-}
  if [ -z "$e" ]; then
    if command -v podman >/dev/null; then e=podman; elif command -v docker >/dev/null; then e=docker
    else die "neither podman nor docker is installed"; fi
  fi
  case $e in podman|docker) ;; *) die "ENGINE=$e: podman or docker only";; esac
  command -v "$e" >/dev/null || die "ENGINE=$e is not installed"
  echo "$e"
}

check_base() {  # ENGINE REF: pull by digest, then check the image is the CUDA version its tag says
  local engine=$1 ref=$2 want got
  want=$(sed -n 's/.*cuda:\([0-9][0-9.]*\)-.*/\1/p' <<<"$ref")
  "$engine" pull "$ref" >/dev/null || die "cannot pull $ref"
  got=$("$engine" image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$ref" \
        | sed -n 's/^CUDA_VERSION=//p')
  [ -z "$want" ] || [ "$got" = "$want" ] \
    || die "$ref has CUDA_VERSION='$got', its tag says $want: the pinned digest is not that tag's image"
  echo "build.sh: base $ref (CUDA_VERSION=$got)"
}

fetch_archive() {  # URL DEST: download the archive (nothing is trusted until sha256sum -c)
  command -v curl >/dev/null || die "curl is not installed"
  curl -fsSL --retry 3 -o "$2" "$1" || die "cannot download $1"
}

build() {
  local arch=$1 release=$2 push=$3 file engine url tree sha local_tag digest tag
  check_pins "$arch" || die "$arch: refused, fix the pins above first"
  [ -z "$push" ] || [ "$release" != unreleased ] || die "--push needs --release engine-vX.Y.Z"
  [ "$release" = unreleased ] || image_tag "$release" "$arch" >/dev/null
  file=$(containerfile "$arch"); engine=$(pick_engine)
  url=$(pin "$file" LLAMA_CPP_URL); tree=$(pin "$file" LLAMA_CPP_TREE); sha=$(pin "$file" LLAMA_CPP_SHA256)
  CTX=$(mktemp -d); trap 'rm -rf "$CTX"' EXIT
  local ctx=$CTX
  echo "build.sh: downloading $url"
  fetch_archive "$url" "$ctx/llama.cpp.tar.gz"
  (cd "$ctx" && echo "$sha  llama.cpp.tar.gz" | sha256sum -c --quiet -) \
    || die "llama.cpp archive sha256 is $(sha256sum "$ctx/llama.cpp.tar.gz" | cut -d' ' -f1), pinned $sha: refused"
  echo "build.sh: archive sha256 ok ($sha)"
  cp "$file" "$ctx/Containerfile"
  while read -r ref; do check_base "$engine" "$ref"; done \
    < <(awk 'toupper($1) == "FROM" { for (i = 2; i <= NF; i++) if ($i !~ /^--/) { print $i; break } }' "$file")
  local_tag="localhost/tensorless-engine:${release#engine-v}-$arch"
  "$engine" build -f "$ctx/Containerfile" -t "$local_tag" \
    --build-arg "LLAMA_CPP_URL=$url" --build-arg "LLAMA_CPP_TREE=$tree" \
    --build-arg "LLAMA_CPP_SHA256=$sha" --build-arg "ENGINE_RELEASE=$release" "$ctx"
  echo "build.sh: built $local_tag"
  [ -n "$push" ] || { echo "build.sh: not pushed (no --push); nothing to record"; return 0; }
  tag=$(image_tag "$release" "$arch")
  if [ "$engine" = podman ]; then
    podman push --digestfile "$ctx/digest" "$local_tag" "docker://$push:$tag"
    digest=$(cat "$ctx/digest")
  else
    docker tag "$local_tag" "$push:$tag"; docker push "$push:$tag"
    digest=$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$push:$tag" \
             | sed -n "s|^$push@||p" | head -1)
  fi
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
    f=$(containerfile "$2"); tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
    fetch_archive "$(pin "$f" LLAMA_CPP_URL)" "$tmp"
    echo "ARG LLAMA_CPP_SHA256=$(sha256sum "$tmp" | cut -d' ' -f1)"
    echo "build.sh: review before pinning (engine/README.md, 'Filling the source pin')" >&2 ;;
  -h|--help) usage ;;
  -*) usage ;;
  *)
    arch=$1; shift; release=unreleased; push=
    while [ $# -gt 0 ]; do
      case $1 in
        --release) [ $# -ge 2 ] || usage; release=$2; shift 2 ;;
        --push) [ $# -ge 2 ] || usage; push=$2; shift 2 ;;
        *) usage ;;
      esac
    done
    [ -z "$push" ] || digest_line "$push" "sha256:$(printf '0%.0s' {1..64})" >/dev/null
    build "$arch" "$release" "$push" ;;
esac
