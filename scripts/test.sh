#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the
# whole test suite (unit tests, multi-process tests over loopback, the
# install test), then the Trainer, loggers and checkpoint suites again under
# AddressSanitizer (scripts/test-asan.sh; STRATA_SKIP_ASAN=1 skips it),
# then compiles the library and the `strata` tool against
# the CUDA build of torch with the NCCL backend (scripts/build-cuda.sh; no
# GPU needed, nothing of it runs). STRATA_SKIP_CUDA_BUILD=1 skips that
# last step. Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir build --output-on-failure --parallel "$jobs" --timeout 600
if [ "${STRATA_SKIP_ASAN:-0}" = "1" ]; then
  echo "[test] STRATA_SKIP_ASAN=1: the AddressSanitizer suites (scripts/test-asan.sh) were skipped"
else
  echo "[test] the Trainer, loggers and checkpoint suites under AddressSanitizer (scripts/test-asan.sh)"
  ./scripts/test-asan.sh
fi
if [ "${STRATA_SKIP_CUDA_BUILD:-0}" = "1" ]; then
  echo "[test] STRATA_SKIP_CUDA_BUILD=1: the CUDA build (scripts/build-cuda.sh) was skipped"
else
  echo "[test] compiling the CUDA build with NCCL (scripts/build-cuda.sh)"
  ./scripts/build-cuda.sh
fi
