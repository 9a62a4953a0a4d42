#!/usr/bin/env bash
# Compiles strata's library and `strata` tool against the CUDA build of
# torch 2.14.1 with the NCCL backend (-DSTRATA_WITH_NCCL=ON), into
# ./build-cuda. Nothing runs on a GPU: this keeps the CUDA code compiling
# on machines without one (scripts/test.sh runs it after the CPU suite).
#  - The venv (scripts/env.sh: STRATA_CUDA_VENV, a cache folder outside the
#    clone) is made the first time: torch==2.14.1 with its nvidia-* wheels
#    (CUDA runtime, cuBLAS, cuDNN, NCCL ...), about 5.5 GB.
#  - nvcc (the CUDA toolkit) must be on PATH or in /usr/local/cuda: torch's
#    CMake config asks for it. NCCL's header and library come from the
#    venv's nvidia-nccl wheel.
# Usage: scripts/build-cuda.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

# ---- the venv -----------------------------------------------------------------
# Made once; a half-made venv (interrupted install) has no stamp and is made
# again. A lock keeps two clones from filling the same venv at once.
torch_version=2.14.1
stamp="$STRATA_CUDA_VENV/.strata-cuda-torch"
mkdir -p "$(dirname "$STRATA_CUDA_VENV")"
exec 9>"$STRATA_CUDA_VENV.lock"
flock 9
if [ ! -x "$STRATA_CUDA_PYTHON" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$torch_version" ]; then
  echo "[build-cuda] Python environment in $STRATA_CUDA_VENV (torch $torch_version with CUDA and NCCL, about 5.5 GB; a few minutes the first time)"
  rm -rf "$STRATA_CUDA_VENV"
  python3 -m venv "$STRATA_CUDA_VENV"
  # Pinned: a plain `torch` could be another release. pip's notes about
  # index folders it skips are noise here.
  "$STRATA_CUDA_PYTHON" -m pip install --quiet --disable-pip-version-check "torch==$torch_version" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  "$STRATA_CUDA_PYTHON" -W ignore - "$torch_version" <<'PY'
import sys, torch, nvidia.nccl
assert torch.__version__.split("+")[0] == sys.argv[1], torch.__version__
assert torch.version.cuda, "torch " + torch.__version__ + " is not a CUDA build"
PY
  echo "$torch_version" > "$stamp"
fi
flock -u 9

# ---- configure and build --------------------------------------------------------
# The CUDA toolkit (nvcc and the CUDA runtime headers) must be there:
# torch's CMake config asks for it even though strata compiles no CUDA code.
if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  else
    echo "[build-cuda] nvcc not found (neither on PATH nor in /usr/local/cuda/bin): install the CUDA toolkit, or skip this build with STRATA_SKIP_CUDA_BUILD=1" >&2
    exit 1
  fi
fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f build-cuda/CMakeCache.txt ]; then
  # torch's CMake config is talkative; its output is kept in
  # build-cuda/configure.log and shown when the configure fails.
  mkdir -p build-cuda
  # A compile check, not a build to run: no optimisation and no debug
  # information, which halves the compile time (give -DCMAKE_BUILD_TYPE=
  # Release to build one to use).
  cmake -S . -B build-cuda "${generator[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
    -DSTRATA_PYTHON="$STRATA_CUDA_PYTHON" -DSTRATA_WITH_NCCL=ON \
    -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCH=OFF "$@" >build-cuda/configure.log 2>&1 || {
    cat build-cuda/configure.log >&2
    rm -f build-cuda/CMakeCache.txt
    echo "[build-cuda] configuring build-cuda failed (above)" >&2
    exit 1
  }
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build build-cuda --target strata strata_cli --parallel "$jobs"
