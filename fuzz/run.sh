#!/usr/bin/env bash
# Builds the fuzz targets (the checkpoint readers, SLURM's host lists;
# clang, libFuzzer + AddressSanitizer) in their own build folder and runs
# each on a copy of its seed corpus for a bounded time. Exits non-zero, printing the fuzzer's report and the path
# of the crashing input, when any target finds a crash, a leak of an
# unexpected exception, or a hang; otherwise prints the executions each
# target ran clean.
# Usage: fuzz/run.sh [SECONDS_PER_TARGET]   (default 25; env FUZZ_BUILD_DIR)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/env.sh"
seconds="${1:-${FUZZ_SECONDS:-25}}"
build="${FUZZ_BUILD_DIR:-$root/build/fuzz}"
cxx="${FUZZ_CXX:-$(command -v clang++-14 || command -v clang++ || true)}"
if [ -z "$cxx" ]; then
  echo "[fuzz] clang++ not found; scripts/install-deps.sh installs clang-14 and libclang-rt-14-dev" >&2
  exit 1
fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
# Through ccache when it is there, as the main build (Note [Compiler cache]
# in CMakeLists.txt).
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=cmake;-E;env;CCACHE_BASEDIR=$root;CCACHE_NOHASHDIR=1;CCACHE_SLOPPINESS=time_macros,include_file_mtime,include_file_ctime;ccache")
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root/fuzz" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_PYTHON="$STRATA_PYTHON" >/dev/null
fi
if ! cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 2)" >"$build/build.log" 2>&1; then
  echo "[fuzz] building the fuzz targets failed:" >&2
  grep -E "error|undefined" "$build/build.log" | head -20 >&2
  exit 1
fi
status=0
total=0
for target in safetensors metadata sharded nodelist; do
  work="$(mktemp -d)"
  cp -r "$root/fuzz/corpus/$target/." "$work/"
  log="$build/fuzz_$target.log"
  # Leak detection off: LibTorch keeps global allocations until exit.
  if ASAN_OPTIONS=detect_leaks=0 "$build/fuzz_$target" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$build/crash-$target-" \
      "$work" >"$log" 2>&1; then
    execs="$(awk '/stat::number_of_executed_units/ {print $2}' "$log")"
    total=$((total + execs))
    echo "[fuzz] fuzz_$target: ${execs} executions in ${seconds} s, no crash or hang"
  else
    status=1
    echo "[fuzz] fuzz_$target FAILED; its report ($log):"
    tail -40 "$log"
    echo "[fuzz] copy the crashing input into fuzz/regressions/$target/ so the test suite replays it"
  fi
  rm -rf "$work"
done
echo "[fuzz] total: ${total} executions ran clean"
exit $status
