#!/usr/bin/env bash
# The GPU check: one command for a machine with one NVIDIA GPU and a CUDA
# PyTorch (made for the H200 machine: python3 with torch 2.11+cu130,
# lightning 2.6, cmake, ninja, nvcc 13, nvidia-nccl-cu13; nothing can be
# downloaded there). Within GPU_CHECK_BUDGET seconds (default 540: one
# device call of at most 600 s) it
#  1. builds strata against that Python's torch (its LibTorch, found with
#     torch.utils.cmake_prefix_path), with the NCCL backend where the tree
#     has it (src/comm/nccl/nccl.cpp), into ./build-gpu: the library, the
#     CUDA tests, the comm tests, bench_gpu and the strata tool, not the
#     whole suite (with --xla-probe also bench_xla and bench_ddp);
#  2. runs the CUDA tests (tests/cuda: DDP and FSDP on one GPU against
#     single-device training, two ranks sharing the GPU, placement, RNG,
#     the device loader) and the NCCL tests of the comm suite;
#  2b. trains the tiny GPT on the host's CPU at 1 and 2 workers (strata
#     train, seed 11, 40 steps, --lr 2e-3 and 3e-3) and prints the worst
#     relative loss difference: the world-size check on another CPU;
#  2c. with --xla-probe, trains on JAX's CUDA plugin from the same build
#     (scripts/xla-gpu-probe.sh steps 4 and 5: bench_xla and CUDA
#     eager in two processes, GPT small and medium, then the xla and
#     xla_fsdp strategies at world 1);
#  3. benchmarks GPT medium and large on the GPU: strata single-device, DDP
#     and FSDP at world size 1 (bench/bench_gpu.cpp) beside PyTorch (plain,
#     DDP, FSDP2) and Lightning Fabric (DDP, FSDP) on the same GPU
#     (bench/gpu_peer.py), and prints ONE table (bench/gpu_table.py).
# docs/cuda.md says how to run it and what it printed.
#
# Usage:
#   scripts/gpu-check.sh [--xla-probe] [--out DIR]   on the GPU machine
#   scripts/gpu-check.sh --dry-run                   here, without a GPU
#   scripts/gpu-check.sh --stage-deps                here, before a device run
#  --xla-probe   also runs scripts/xla-gpu-probe.sh, in the background while
#                strata builds (the GPU is idle then), so both checks fit
#                in one device call; its report lands beside the table.
#  --dry-run     every part that runs without a GPU: builds the CUDA tests
#                and bench_gpu into ./build (BUILD_DIR) against the
#                project's CPU LibTorch, runs the tests (those that need a
#                GPU skip), and the benchmark and table on the CPU with the
#                tiny GPT, both sides, through the same code paths.
#  --bench-only  builds (a no-op after an earlier call on the same machine)
#                and runs step 3 alone: a second device call for the table.
#  --stage-deps  copies the headers, CMake files and libraries of
#                nlohmann-json, CLI11, GoogleTest and yaml-cpp from this
#                machine into .gpu-deps/ (ignored by git), for a GPU
#                machine that lacks them and cannot download: name
#                .gpu-deps in the device run's carry list.
# Each step gets what is left of the budget, and a step that no longer fits
# is skipped and named, so the call returns its files in time.
# Output: the table on stdout; with --out DIR or $OUT set, DIR gets
# gpu-check-table.md, gpu-check.log, gpu-results.jsonl and gpu-check.tar.gz
# (every log: the build's, the tests', the XLA probe's and training's, the
# world-size check's).
# Environment: PYTHON (default python3; --dry-run: the project's venv),
#   BUILD_DIR, JOBS (default: all cores), GPU_CHECK_BUDGET (seconds),
#   GPU_CHECK_SIZES (default medium,large).
# Exit status: 0 when every step passed, 1 when one failed (the table is
# still printed with what ran), 2 for bad usage.
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
start=$(date +%s)
mode=gpu xla_probe=0 bench_only=0 out_dir="${OUT:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) mode=dry; shift ;;
    --stage-deps) mode=stage; shift ;;
    --xla-probe) xla_probe=1; shift ;;
    --bench-only) bench_only=1; shift ;;
    --out) out_dir="${2:?--out needs a folder}"; shift 2 ;;
    -h|--help) sed -n '2,46p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "[gpu-check] unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
[ "$bench_only" = 1 ] && xla_probe=0
log() { echo "[gpu-check $(( $(date +%s) - start ))s] $*" >&2; }
# A dry run builds on two cores and may take an hour; a device call has 600 s.
default_budget=540
[ "$mode" = dry ] && default_budget=7200
deadline=$(( start + ${GPU_CHECK_BUDGET:-$default_budget} ))
# limit N: N seconds, or what is left of the budget less a margin for the
# files, whichever is smaller; 0 when less than 20 s would be left.
limit() { local left=$(( deadline - $(date +%s) - 15 )); [ "$left" -lt 20 ] && { echo 0; return; }; echo $(( $1 < left ? $1 : left )); }
# within N COMMAND...: runs COMMAND under that limit; a step with no time left
# is not started (status 124, as timeout's).
within() { local t; t="$(limit "$1")"; shift; [ "$t" = 0 ] && { log "skipped for want of time: $1"; return 124; }; timeout "$t" "$@"; }
# stack_of N COMMAND...: runs COMMAND again under gdb (or cuda-gdb, which the
# CUDA image has instead) and prints every thread's stack where it crashed,
# so that a crash seen once is reported with where it happened.
stack_of() {
  local limit_s="$1" debugger; shift
  debugger="$(command -v gdb || command -v cuda-gdb)" || { log "no gdb or cuda-gdb for a stack"; return 0; }
  log "rerunning under $(basename "$debugger") for the stack: $*"
  within "$limit_s" "$debugger" -q -batch -ex 'set pagination off' -ex 'set print thread-events off' \
    -ex 'set confirm off' -ex run -ex 'bt 40' -ex 'info threads' -ex 'thread apply all bt 12' --args "$@" 2>&1 |
    grep -v -E '^\[(New|Thread) |^warning: .*(libthread_db|no loadable sections)' | tail -n 220 | tee -a "$tmp/stacks.txt" |
    sed -n '/received signal/,/^Thread [0-9]* .*:$/p' | head -n 60 >&2
}

# ---- --stage-deps ---------------------------------------------------------------
if [ "$mode" = stage ]; then
  deps="$repo/.gpu-deps"
  rm -rf "$deps"
  mkdir -p "$deps/include" "$deps/share/cmake" "$deps/lib/x86_64-linux-gnu/cmake" "$deps/lib"
  copy() { [ -e "$1" ] || { echo "[gpu-check] missing $1 (apt-get install $3)" >&2; exit 1; }; cp -a "$1" "$2"; }
  copy /usr/include/nlohmann "$deps/include/" nlohmann-json3-dev
  copy /usr/share/cmake/nlohmann_json "$deps/share/cmake/" nlohmann-json3-dev
  copy /usr/include/CLI "$deps/include/" libcli11-dev
  copy /usr/share/cmake/CLI11 "$deps/share/cmake/" libcli11-dev
  copy /usr/include/gtest "$deps/include/" libgtest-dev
  copy /usr/include/gmock "$deps/include/" libgmock-dev
  copy /usr/lib/x86_64-linux-gnu/cmake/GTest "$deps/lib/x86_64-linux-gnu/cmake/" libgtest-dev
  for lib in gtest gtest_main gmock gmock_main; do
    copy "/usr/lib/x86_64-linux-gnu/lib$lib.a" "$deps/lib/x86_64-linux-gnu/" libgtest-dev
  done
  # yaml-cpp: its CMake package finds the library beside it (four levels up).
  copy /usr/include/yaml-cpp "$deps/include/" libyaml-cpp-dev
  copy /usr/lib/x86_64-linux-gnu/cmake/yaml-cpp "$deps/lib/x86_64-linux-gnu/cmake/" libyaml-cpp-dev
  for f in /usr/lib/x86_64-linux-gnu/libyaml-cpp.so*; do copy "$f" "$deps/lib/x86_64-linux-gnu/" libyaml-cpp-dev; done
  grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || grep -qx '/.gpu-deps/' .gitignore ||
    echo "[gpu-check] note: .gpu-deps/ is not ignored by git here" >&2
  echo "[gpu-check] staged $(du -sh "$deps" | cut -f1) in .gpu-deps/; carry it: run(..., carry=[\".gpu-deps\"])" >&2
  exit 0
fi

status=0
fail() { log "FAILED: $*"; status=1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
results="$tmp/gpu-results.jsonl"
: > "$results"
logfile="$tmp/gpu-check.log"
exec > >(tee -a "$logfile") 2> >(tee -a "$logfile" >&2)

if [ "$mode" = dry ]; then
  source scripts/env.sh
  python="${PYTHON:-$STRATA_PYTHON}"
  build="${BUILD_DIR:-build}"
  jobs="${JOBS:-2}"
  device=cpu sizes=tiny bench_args=(--batch 4 --steps 2 --warmup 1)
else
  python="${PYTHON:-python3}"
  build="${BUILD_DIR:-build-gpu}"
  jobs="${JOBS:-$(nproc)}"
  device=cuda sizes="${GPU_CHECK_SIZES:-medium,large}" bench_args=(--batch 32 --steps 10 --warmup 3)
fi
command -v "$python" >/dev/null || { log "no Python '$python' (set PYTHON)"; exit 2; }
log "mode $mode; python $python; build dir $build; $jobs jobs"
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' >&2
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2

# ---- the XLA probe, in the background while strata builds -----------------------
xla_pid=
if [ "$xla_probe" = 1 ]; then
  if [ "$mode" = dry ]; then
    log "--xla-probe: skipped in a dry run (it needs the GPU and JAX's CUDA plugin)"
  else
    # Without its training step: the CUDA tests below share the GPU meanwhile
    # (run scripts/xla-gpu-probe.sh alone for the GPT on the CUDA plugin).
    STRATA_XLA_PROBE_TRAIN=0 PYTHON="$python" scripts/xla-gpu-probe.sh "$tmp/xla" > "$tmp/xla-stdout.txt" 2> "$tmp/xla-stderr.txt" &
    xla_pid=$!
    log "XLA probe started (pid $xla_pid)"
  fi
fi

# ---- 1. build ----------------------------------------------------------------------
targets=(strata_cuda_tests strata_comm_tests bench_gpu strata)
[ "$xla_probe" = 1 ] && targets+=(bench_xla bench_ddp)
if [ "$mode" = dry ]; then
  # The comm suite is the CPU suite's own; here its NCCL tests would only skip.
  targets=(strata_cuda_tests bench_gpu strata)
  [ -f "$build/CMakeCache.txt" ] || { log "no $build: run scripts/build.sh first (or set BUILD_DIR)"; exit 2; }
else
  torch_prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')" || { log "cannot import torch"; exit 2; }
  prefix="$torch_prefix"
  [ -d .gpu-deps ] && prefix="$prefix;$repo/.gpu-deps"
  nccl=OFF
  if [ -f src/comm/nccl/nccl.cpp ]; then nccl=ON; else log "no src/comm/nccl/nccl.cpp in this tree: building without NCCL"; fi
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  if [ ! -f "$build/CMakeCache.txt" ]; then
    log "configuring against $torch_prefix (NCCL $nccl)"
    within 180 cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" -DSTRATA_PYTHON="$(command -v "$python")" -DSTRATA_WITH_NCCL="$nccl" \
      -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_STANDARD=17 -DSTRATA_BUILD_BENCH=ON -DSTRATA_BUILD_TESTS=ON \
      > "$tmp/configure.log" 2>&1 || { tail -n 40 "$tmp/configure.log" >&2; fail "configure"; }
  fi
fi
if [ -f "$build/CMakeCache.txt" ]; then
  log "building ${targets[*]}"
  build_limit=$([ "$mode" = dry ] && echo 3600 || echo 360)
  within "$build_limit" cmake --build "$build" --target "${targets[@]}" --parallel "$jobs" > "$tmp/build.log" 2>&1 ||
    { grep -E 'error|Error' "$tmp/build.log" | head -n 30 >&2; tail -n 20 "$tmp/build.log" >&2; fail "build"; }
  log "built"
fi
find_binary() { find "$build" -maxdepth 3 -type f -name "$1" -perm -u+x 2>/dev/null | head -n1; }

# ---- 2. tests ----------------------------------------------------------------------
if [ "$bench_only" = 0 ]; then
cuda_tests="$(find_binary strata_cuda_tests)"
if [ -n "$cuda_tests" ]; then
  log "CUDA tests"
  within 240 "$cuda_tests" --gtest_color=no > "$tmp/cuda-tests.txt" 2>&1
  tests_status=$?
  cat "$tmp/cuda-tests.txt" >> "$logfile"
  grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Failure$|^\[==========\]' "$tmp/cuda-tests.txt" >&2
  [ "$tests_status" = 0 ] || fail "CUDA tests (status $tests_status; the whole output is in gpu-check.log)"
  if [ "$tests_status" -gt 128 ] && [ "$tests_status" != 124 ]; then
    crashed="$(grep -E '^\[ RUN +\]' "$tmp/cuda-tests.txt" | tail -n 1 | sed 's/^\[ RUN *\] //')"
    [ -n "$crashed" ] && stack_of 90 "$cuda_tests" --gtest_color=no --gtest_filter="$crashed"
    # and the tests after the one that crashed
    rest="$(within 30 "$cuda_tests" --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}' | sed -n "/^${crashed//./\\.}\$/,\$p" | tail -n +2 | paste -sd:)"
    if [ -n "$rest" ]; then
      log "the CUDA tests after $crashed"
      within 120 "$cuda_tests" --gtest_color=no --gtest_filter="$rest" > "$tmp/cuda-tests-rest.txt" 2>&1 || fail "CUDA tests after $crashed"
      grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Failure$|^\[==========\]' "$tmp/cuda-tests-rest.txt" >&2
    fi
  fi
else
  fail "no strata_cuda_tests binary"
fi
comm_tests="$(find_binary strata_comm_tests)"
if [ -n "$comm_tests" ]; then
  log "NCCL tests of the comm suite"
  within 90 "$comm_tests" --gtest_color=no --gtest_filter='*Nccl*:*NCCL*:*nccl*' > "$tmp/nccl-tests.txt" 2>&1
  nccl_status=$?
  grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Failure$|^\[==========\]' "$tmp/nccl-tests.txt" >&2
  [ "$nccl_status" = 0 ] || fail "NCCL tests (status $nccl_status)"
fi

# ---- 2b. the world-size check on this host's CPU -----------------------------------
strata_tool="$(find_binary strata)"
if [ -n "$strata_tool" ] && [ "$mode" != dry ]; then
  log "world-size check on the host's CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
  for lr in 2e-3 3e-3; do
    for n in 1 2; do
      within 60 "$strata_tool" train --model-size tiny --seed 11 --max-steps 40 --devices "$n" --lr "$lr" --sample-tokens 0 \
        --ckpt-dir "$tmp/ws-$lr-$n/ckpt" --metrics-file "$tmp/ws-$lr-$n.jsonl" > "$tmp/ws-$lr-$n.log" 2>&1 ||
        { ws_status=$?; fail "strata train --devices $n --lr $lr (status $ws_status)"; tail -n 5 "$tmp/ws-$lr-$n.log" >&2
          [ "$ws_status" -gt 128 ] && [ "$lr" = 2e-3 ] && stack_of 90 "$strata_tool" train --model-size tiny --seed 11 \
            --max-steps 4 --devices "$n" --sample-tokens 0 --ckpt-dir "$tmp/ws-debug-$n"; }
    done
    "$python" - "$tmp/ws-$lr-1.jsonl" "$tmp/ws-$lr-2.jsonl" "$lr" <<'PY' >&2 || true
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r and "step" in r: out[r["step"]] = r["loss"]
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
steps = sorted(set(a) & set(b))
worst = max(((abs(a[s] - b[s]) / abs(a[s]), s) for s in steps), default=(float("nan"), -1))
print(f"[gpu-check] lr {sys.argv[3]}: {len(steps)} steps compared, worst relative loss difference 1 vs 2 workers "
      f"{worst[0]:.3g} at step {worst[1]}; final {a[steps[-1]]:.6f} vs {b[steps[-1]]:.6f}" if steps else "no common steps")
PY
  done
fi
if [ -n "$xla_pid" ]; then
  log "waiting for the XLA probe before timing anything"
  wait "$xla_pid"; xla_status=$?
  [ "$xla_status" = 0 ] || fail "XLA probe (status $xla_status)"
  tail -n 15 "$tmp/xla-stderr.txt" >&2
  # 2c. Training on the plugin from this build (its bench_xla and bench_ddp).
  train_budget="$(limit 240)"
  if [ "$train_budget" = 0 ]; then
    log "skipped for want of time: training on the XLA plugin"
  else
    log "training on the XLA plugin (up to ${train_budget}s)"
    STRATA_XLA_PROBE_RUN=0 BENCH_BUILD_DIR="$build" TRAIN_STEPS="${TRAIN_STEPS:-20}" TRAIN_TIMEOUT=$(( train_budget / 3 )) PYTHON="$python" \
      timeout "$train_budget" scripts/xla-gpu-probe.sh "$tmp/xla-train" > "$tmp/xla-train-stdout.txt" 2> "$tmp/xla-train-stderr.txt" ||
      fail "training on the XLA plugin (status $?)"
    tail -n 25 "$tmp/xla-train-stderr.txt" >&2
  fi
fi

fi  # bench_only

# ---- 3. benchmark ------------------------------------------------------------------
bench="$(find_binary bench_gpu)"
if [ -n "$bench" ]; then
  log "strata: single_device, ddp, fsdp on $device ($sizes)"
  within 150 "$bench" --accelerator "$device" --sizes "$sizes" "${bench_args[@]}" >> "$results" || fail "bench_gpu"
else
  fail "no bench_gpu binary"
fi
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
log "PyTorch: plain, DDP, FSDP2"
within 150 "$python" bench/gpu_peer.py --device "$device" --sizes "$sizes" "${bench_args[@]}" \
  --peers pytorch-single,pytorch-ddp,pytorch-fsdp2 >> "$results" || fail "PyTorch peers"
log "Lightning Fabric: DDP, FSDP"
within 150 "$python" bench/gpu_peer.py --device "$device" --sizes "$sizes" "${bench_args[@]}" \
  --peers fabric-ddp,fabric-fsdp >> "$results" || fail "Fabric peers"

echo
"$python" bench/gpu_table.py "$results" --out "$tmp/gpu-check-table.md" || fail "table"
log "done in $(( $(date +%s) - start ))s, status $status"

if [ -n "$out_dir" ]; then
  mkdir -p "$out_dir"
  cp "$results" "$tmp/gpu-check-table.md" "$out_dir/" 2>/dev/null
  [ -f "$tmp/xla/xla-gpu-probe.json" ] && cp "$tmp/xla/xla-gpu-probe.json" "$out_dir/"
  [ -f "$tmp/xla/probe.log" ] && cp "$tmp/xla/probe.log" "$out_dir/xla-probe.log"
  [ -f "$tmp/xla/env.txt" ] && cp "$tmp/xla/env.txt" "$out_dir/xla-env.txt"
  # Every log in one file (a device call returns at most 8 files).
  (cd "$tmp" && find . -maxdepth 3 -type f \( -name '*.log' -o -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) \
    -not -path './build*' -size -8M -print0 | tar --null -czf "$out_dir/gpu-check.tar.gz" -T -) 2>/dev/null || true
  sleep 0.2
  cp "$logfile" "$out_dir/gpu-check.log"
fi
exit "$status"
