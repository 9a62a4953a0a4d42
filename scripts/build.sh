#!/usr/bin/env bash
# Configures and builds strata into ./build (Release with line tables)
# against the LibTorch inside the project's venv (scripts/env.sh), or the
# one named by CMAKE_PREFIX_PATH / -DTorch_DIR=... when given.
# Usage: scripts/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_PYTHON="$STRATA_PYTHON" "$@" >/dev/null
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build build --parallel "$jobs"
