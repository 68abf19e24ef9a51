#!/bin/bash
# Compile llama-server for one CUDA architecture. Runs INSIDE the builder root filesystem
# (engine/lib/rootfs.sh build), started by engine/build.sh with no network (unshare --net), so
# nothing can be fetched: every byte compiled was checked against a pin before it got here.
#   /src/compile.sh CUDA_ARCH SHA256 TREE      e.g. /src/compile.sh 60 832d... llama_cpp_python-0.3.36/vendor/llama.cpp
# Reads /src/llama.cpp.tar.gz; writes /out/bin/llama-server and /out/lib/*.so*.
# Env: JOBS (default 2), SOURCE_DATE_EPOCH (set by build.sh; gcc uses it for __DATE__/__TIME__).
set -euo pipefail
[ $# -eq 3 ] || { echo "compile.sh: usage: compile.sh CUDA_ARCH SHA256 TREE" >&2; exit 2; }
ARCH=$1 SHA=$2 TREE=$3
[[ $ARCH =~ ^[0-9]+$ ]] || { echo "compile.sh: CUDA_ARCH '$ARCH' is not a number" >&2; exit 2; }
# checked again here: a stale or swapped archive fails instead of being compiled
echo "$SHA  /src/llama.cpp.tar.gz" | sha256sum -c --quiet - \
  || { echo "compile.sh: /src/llama.cpp.tar.gz is not sha256 $SHA" >&2; exit 1; }
rm -rf /src/llama.cpp /out; mkdir -p /src/llama.cpp /out/bin /out/lib
tar -xzf /src/llama.cpp.tar.gz -C /src/llama.cpp \
  --strip-components="$(tr -cd / <<<"$TREE/" | wc -c)" "$TREE"
cd /src/llama.cpp
# The flags of the image contract (engine/README.md): one architecture, no download at
# configure or build time, the build machine's CPU never leaks in, only llama-server.
# g++-13: CUDA 12.4 accepts GCC <= 13 (trixie's default is 14). No build RPATH: the runtime
# image finds the libraries through /etc/ld.so.conf.d/llama-server.conf.
# --allow-shlib-undefined: libcuda.so.1 comes from the host driver at run time.
# GGML_BACKEND_DL: the CPU and CUDA backends are modules that llama-server loads at start from
# /usr/lib/llama-server (GGML_BACKEND_DIR), so llama-server itself does not need libcuda.so.1 to
# start: `llama-server --version` runs on a machine without a GPU driver (on a GPU host the CUDA
# module loads, with the driver's libcuda.so.1 that CDI or the container toolkit mounts).
# ARCH-real: machine code (SASS) for exactly that architecture and no PTX, so no driver can
# JIT-compile these kernels for a card the image was not measured on (a plain "60" would embed
# compute_60 PTX as well).
cmake -S . -B build \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER=gcc-13 \
  -DCMAKE_CXX_COMPILER=g++-13 \
  -DCMAKE_CUDA_COMPILER=/usr/bin/nvcc \
  -DCMAKE_CUDA_HOST_COMPILER=g++-13 \
  -DGGML_CUDA=ON \
  -DGGML_BACKEND_DL=ON \
  -DGGML_BACKEND_DIR=/usr/lib/llama-server \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH-real" \
  -DGGML_NATIVE=OFF \
  -DGGML_CUDA_NCCL=OFF \
  -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BORINGSSL=OFF \
  -DLLAMA_BUILD_BORINGSSL=OFF \
  -DLLAMA_BUILD_LIBRESSL=OFF \
  -DLLAMA_BUILD_WEBUI=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_COMMIT="sha256-${SHA:0:12}" \
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
  -DCMAKE_SKIP_BUILD_RPATH=ON \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined
cmake --build build --target llama-server -j"${JOBS:-2}"
cp build/bin/llama-server /out/bin/
find build/bin -maxdepth 1 -name '*.so*' -exec cp -P {} /out/lib/ \;
# strip --strip-unneeded: nvcc names its temporary files tmpxft_<pid>_..., and those names land in
# libggml-cuda's symbol table (file symbols, _GLOBAL__sub_I_tmpxft_...), so two builds differed
# there and nowhere else (seen by engine/repro.sh). The symbol table is never loaded; the dynamic
# symbols stay.
find /out -type f \( -name llama-server -o -name '*.so*' \) -exec strip --strip-unneeded {} +
ls -l /out/bin /out/lib
