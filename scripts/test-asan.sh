#!/usr/bin/env bash
# The Trainer, loggers and checkpoint suites under AddressSanitizer (Note
# [Sanitizer builds] in CMakeLists.txt): the library, the `strata` tool and
# those suites built into ./build-asan with STRATA_SANITIZE=address, then run by
# CTest. A use-after-free, double free or buffer overflow in what they
# exercise (resume, callbacks' state, hostile checkpoints) fails a test.
# The link-order probe (Note [libstdc++ before LibTorch]) runs there too:
# libasan first, libstdc++ next. Called by scripts/test.sh; STRATA_SKIP_ASAN=1 there skips it.
# Usage: scripts/test-asan.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f build-asan/CMakeCache.txt ]; then
  # -O1: ASan's reports keep their frames; line tables only, as the main build.
  cmake -S . -B build-asan "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DSTRATA_SANITIZE=address \
    -DSTRATA_TEST_SUITES="trainer;loggers;checkpoint" -DSTRATA_BUILD_BENCH=OFF \
    -DSTRATA_PYTHON="$STRATA_PYTHON" >/dev/null
else
  # A build folder configured before the loggers suite existed gets it.
  cmake -S . -B build-asan -DSTRATA_TEST_SUITES="trainer;loggers;checkpoint" >/dev/null
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build build-asan --parallel "$jobs" --target strata_cli strata_trainer_tests strata_loggers_tests strata_checkpoint_tests strata_link_order_probe
# LibTorch keeps allocations for the life of the process (registries,
# thread pools): leak reports would be its, not ours.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1:${ASAN_OPTIONS:-}"
# MLFlowServerTest starts a Python mlflow server per test (tens of seconds):
# the main suite runs it; here the logger's client code is checked by the
# MLflow tests without a server (down, silent, full queue).
ctest --test-dir build-asan --output-on-failure --parallel "$jobs" --timeout 900 -E 'MLFlowServerTest' "$@"
