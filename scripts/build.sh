#!/usr/bin/env bash
# Configures and builds strata into ./build (Release with line tables).
# Usage: scripts/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build build --parallel "$jobs"
