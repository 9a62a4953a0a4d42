#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the
# whole test suite (unit tests, multi-process tests over loopback, the
# install test). Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir build --output-on-failure --parallel "$jobs" --timeout 600
