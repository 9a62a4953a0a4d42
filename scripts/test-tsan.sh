#!/usr/bin/env bash
# The xla device's threaded tests under ThreadSanitizer: the library's
# xla_device, xla, core and models objects and the xla_device suite built
# into ./build-tsan with STRATA_SANITIZE=thread, then the tests that record
# from two threads (a test's own threads, and autograd's device thread in
# backward while the main thread records and syncs). LibTorch itself is not
# instrumented: its own synchronisation is invisible to TSan, so reports
# whose every frame is inside LibTorch are suppressed
# (scripts/tsan-suppressions.txt); a race in strata's code still fails.
# Not part of the README's test command (a third build of the device's
# sources); run it after changing src/xla_device/ or src/xla/lazy_graph.cpp or lazy_executor.cpp.
# Usage: scripts/test-tsan.sh [gtest filter]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f build-tsan/CMakeCache.txt ]; then
  cmake -S . -B build-tsan "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DSTRATA_SANITIZE=thread \
    -DSTRATA_TEST_SUITES="xla_device" -DSTRATA_BUILD_BENCH=OFF \
    -DSTRATA_PYTHON="$STRATA_PYTHON" >/dev/null
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build build-tsan --parallel "$jobs" --target strata_xla_device_tests
filter="${1:-XlaLazyTest.TwoThreads*:XlaLazyTest.ItemMidStep*:XlaLazyTest.Mlp*:XlaGptTest.*:XlaRandomTest.*}"
# One OpenMP thread: LibTorch's CPU kernels fork libgomp teams whose
# barriers TSan cannot see (uninstrumented futexes), which it reports as
# races inside LibTorch's own kernels; the threads under test are the
# autograd engine's and the tests' own.
export OMP_NUM_THREADS=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan-suppressions.txt:${TSAN_OPTIONS:-}"
./build-tsan/tests/strata_xla_device_tests --gtest_filter="$filter"
