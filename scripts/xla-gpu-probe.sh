#!/usr/bin/env bash
# Runs strata's PJRT probe on an NVIDIA GPU through JAX's CUDA PJRT plugin,
# without LibTorch and without Python at run time (docs/xla.md, "The GPU
# probe"), then trains the example GPT on that plugin beside LibTorch's
# CUDA eager (docs/benchmarks.md, "One xla device (CPU plugin) beside
# LibTorch eager"). Made for a machine with jax and jax-cuda13-pjrt
# installed (the H200 one has jax 0.11.2) and a CUDA torch; under 5 minutes:
#  1. finds the plugin (jax_plugins/xla_cuda*/xla_cuda_plugin.so) and the
#     NVIDIA libraries and tools JAX's wheels carry (nvidia/*/lib, bin);
#  2. builds strata-xla-probe from src/xla/ with one compiler (no CMake, no
#     LibTorch, no other library), while bench_xla builds in the background
#     with CMake against the Python's CUDA torch (step 4);
#  3. runs the probe with preallocate=false, writing the JSON report, then
#     again as one client across two processes (--num-nodes 2, node ids
#     0 and 1, exchanging their devices through files in OUT_DIR/kv);
#  4. trains GPT small and medium 30 steps on the plugin's device and on
#     LibTorch's CUDA eager, each side in a process of its own (bench_xla
#     --sides xla|eager: one process with both asserts in LibTorch's
#     autograd), from the same weights and batches, and prints one table:
#     step times, their ratio, the xla step's host and execute time, and
#     both sides' losses;
#  5. trains GPT small with the `xla` and `xla_fsdp` strategies at world 1
#     on the plugin's device (bench_ddp --strategy xla|xla_fsdp --devices
#     1), printing each one's result line.
# Usage: scripts/xla-gpu-probe.sh [OUT_DIR]   (default: $TMPDIR/strata-xla-gpu-probe)
# Environment: PYTHON (the Python with jax and torch; default python3),
#   STRATA_PJRT_PLUGIN (skip the search), CXX (default c++),
#   STRATA_XLA_PROBE_TRAIN=0 (skip step 4, as scripts/gpu-check.sh does:
#   its CUDA tests share the GPU meanwhile), BENCH_BUILD_DIR (bench_xla's
#   CMake build; default ./build-xla-gpu, kept for the next run),
#   STRATA_XLA_PROBE_RUN=0 (skip steps 2 and 3: scripts/gpu-check.sh ran
#   the probe already and trains from its own build), TRAIN_TIMEOUT
#   (seconds for each training run; default 150),
#   TRAIN_STEPS (default 30), TRAIN_SIZES (GPT presets; default "small
#   medium"), TRAIN_EAGER_DEVICE (default cuda; cpu checks
#   step 4 on a machine without a GPU, with the CPU plugin as
#   STRATA_PJRT_PLUGIN).
# Output in OUT_DIR: xla-gpu-probe.json, probe.log, env.txt,
# xla-gpu-probe-node{0,1}.json and probe-node{0,1}.log, and from step
# 4 xla-gpu-train-SIZE-{eager,xla}.json, train-SIZE-{eager,xla}.log,
# bench-build.log, and from step 5
# train-xla.log, train-xla_fsdp.log.
# Exit status: the probe's (0 when every case that ran matched its loop
# reference), else 1 when the training failed, or 2 when something needed
# is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir="${1:-${TMPDIR:-/tmp}/strata-xla-gpu-probe}"
python="${PYTHON:-python3}"
cxx="${CXX:-c++}"
mkdir -p "$out_dir"
log() { echo "[xla-gpu-probe] $*" >&2; }
die() { log "$*"; exit 2; }
start=$(date +%s)

# 1. Where jax's wheels put things: every site-packages the Python sees.
command -v "$python" >/dev/null || die "no Python '$python': set PYTHON to the one with jax"
mapfile -t sites < <("$python" -c 'import site, sysconfig
seen = []
for p in [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages(), site.getusersitepackages()]:
    if p not in seen: seen.append(p); print(p)')
plugin="${STRATA_PJRT_PLUGIN:-}"
if [ -z "$plugin" ]; then
  for site in "${sites[@]}"; do
    for candidate in "$site"/jax_plugins/xla_cuda13/xla_cuda_plugin.so "$site"/jax_plugins/xla_cuda*/xla_cuda_plugin.so; do
      if [ -f "$candidate" ]; then plugin="$candidate"; break 2; fi
    done
  done
fi
[ -n "$plugin" ] && [ -f "$plugin" ] || die "no xla_cuda_plugin.so under ${sites[*]}: pip install jax-cuda13-pjrt, or set STRATA_PJRT_PLUGIN"
log "plugin: $plugin"

# JAX preloads libcudart, cuBLAS, cuDNN, NCCL, ... from the nvidia-* wheels
# before it opens the plugin; a C++ process gets the same through the
# loader's search path. ptxas and nvlink (compilation) come from their bin/.
lib_dirs=() bin_dirs=()
for site in "${sites[@]}"; do
  [ -d "$site/nvidia" ] || continue
  while IFS= read -r d; do lib_dirs+=("$d"); done < <(find "$site/nvidia" -maxdepth 3 -type d -name lib | sort)
  while IFS= read -r d; do bin_dirs+=("$d"); done < <(find "$site/nvidia" -maxdepth 3 -type d -name bin | sort)
done
[ ${#lib_dirs[@]} -gt 0 ] || log "warning: no nvidia/*/lib directories found; relying on the system's CUDA libraries"
if [ ${#lib_dirs[@]} -gt 0 ]; then
  LD_LIBRARY_PATH="$(IFS=:; echo "${lib_dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
fi
if [ ${#bin_dirs[@]} -gt 0 ]; then
  PATH="$(IFS=:; echo "${bin_dirs[*]}"):$PATH"
  export PATH
fi
# XLA looks for libdevice under a CUDA root; point it at the wheel's.
libdevice="$(for s in "${sites[@]}"; do [ -d "$s/nvidia" ] && find "$s/nvidia" -maxdepth 5 -name 'libdevice*.bc' 2>/dev/null; done | head -n1 || true)"
if [ -n "$libdevice" ]; then
  cuda_root="$(dirname "$(dirname "$(dirname "$libdevice")")")"  # <root>/nvvm/libdevice/libdevice.10.bc
  export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_cuda_data_dir=$cuda_root"
  log "CUDA data dir: $cuda_root"
fi

{
  echo "date: $(date -u +%FT%TZ)"
  echo "plugin: $plugin"
  "$python" -c 'import importlib.metadata as m
for p in ("jax", "jaxlib", "jax-cuda13-pjrt", "jax-cuda13-plugin"):
    try: print(p + ":", m.version(p))
    except m.PackageNotFoundError: print(p + ": not installed")' || true
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi: not found"
  echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
  echo "XLA_FLAGS: ${XLA_FLAGS:-}"
} > "$out_dir/env.txt" 2>&1
cat "$out_dir/env.txt" >&2

# 4 (in the background). bench_xla against the Python's CUDA torch: CMake
# builds only that target (the core, models and xla_device objects), so it
# is ready when the probe is done. .gpu-deps/ (scripts/gpu-check.sh
# --stage-deps) supplies nlohmann-json, CLI11 and yaml-cpp where the machine
# lacks them.
train="${STRATA_XLA_PROBE_TRAIN:-1}"
eager_device="${TRAIN_EAGER_DEVICE:-cuda}"
bench_build="${BENCH_BUILD_DIR:-build-xla-gpu}"
bench_pid=
if [ "$train" != 0 ]; then
  if ! torch_prefix="$("$python" -c 'import sys, torch
assert sys.argv[1] != "cuda" or torch.version.cuda, "torch " + torch.__version__ + " is a CPU build"
print(torch.utils.cmake_prefix_path)' "$eager_device" 2>&1)"; then
    log "training skipped: no torch for $eager_device in $python (${torch_prefix##*$'\n'})"
    train=missing
  elif ! command -v cmake >/dev/null; then
    log "training skipped: no cmake"
    train=missing
  else
    prefix="$torch_prefix"
    [ -d .gpu-deps ] && prefix="$prefix;$(pwd)/.gpu-deps"
    generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    # torch's CMake config asks for nvcc, though strata compiles no CUDA code.
    if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
    # Each command has its own time limit, so the build ends by itself.
    (
      if [ ! -f "$bench_build/CMakeCache.txt" ]; then
        timeout 120 cmake -S . -B "$bench_build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
          -DCMAKE_PREFIX_PATH="$prefix" -DSTRATA_PYTHON="$(command -v "$python")" -DSTRATA_WITH_NCCL=OFF \
          -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCH=ON -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_STANDARD=17 ||
          { rm -f "$bench_build/CMakeCache.txt"; exit 1; }
      fi
      timeout 240 cmake --build "$bench_build" --target bench_xla bench_ddp --parallel "$(nproc)"
    ) > "$out_dir/bench-build.log" 2>&1 &
    bench_pid=$!
    log "building bench_xla in $bench_build (pid $bench_pid, log $out_dir/bench-build.log)"
  fi
fi

status=0
if [ "${STRATA_XLA_PROBE_RUN:-1}" != 0 ]; then
  # 2. Build: the PJRT layer needs only a C++20 compiler and libdl.
  command -v "$cxx" >/dev/null || die "no C++ compiler '$cxx': set CXX"
  build="$out_dir/build"
  mkdir -p "$build"
  pids=()
  for src in src/xla/*.cpp; do
    "$cxx" -std=c++20 -O2 -Iinclude -Ithird_party/pjrt -c "$src" -o "$build/$(basename "$src" .cpp).o" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || die "compiling src/xla failed"; done
  "$cxx" "$build"/*.o -ldl -o "$build/strata-xla-probe" || die "linking strata-xla-probe failed"
  log "built $build/strata-xla-probe in $(( $(date +%s) - start ))s"

  # 3. Run. preallocate=false: XLA would otherwise take most of the card.
  timeout 240 "$build/strata-xla-probe" --plugin "$plugin" --option preallocate=false \
    --out "$out_dir/xla-gpu-probe.json" > /dev/null 2> "$out_dir/probe.log" || status=$?
  tail -n 20 "$out_dir/probe.log" >&2 || true
  if [ -f "$out_dir/xla-gpu-probe.json" ]; then cat "$out_dir/xla-gpu-probe.json"; fi
  log "probe status $status after $(( $(date +%s) - start ))s; report in $out_dir/xla-gpu-probe.json, log in $out_dir/probe.log"

  # 3b. One client across two processes (Note [Multi-process clients]):
  # both copies find each other through files in one folder. On a machine
  # with one GPU both processes hold the same card, so the single-device
  # cases run on node 0 and the cross-process all-reduce shows what NCCL
  # says of two ranks on one device; the JSON of each says what ran.
  rm -rf "$out_dir/kv"
  mp_pids=()
  for node in 0 1; do
    timeout 120 "$build/strata-xla-probe" --plugin "$plugin" --option preallocate=false \
      --num-nodes 2 --node-id "$node" --kv-dir "$out_dir/kv" \
      --out "$out_dir/xla-gpu-probe-node$node.json" > /dev/null 2> "$out_dir/probe-node$node.log" &
    mp_pids+=($!)
  done
  for node in 0 1; do
    mp_status=0
    wait "${mp_pids[$node]}" || mp_status=$?
    log "two-process client, node $node: status $mp_status"
    tail -n 5 "$out_dir/probe-node$node.log" >&2 || true
    if [ -f "$out_dir/xla-gpu-probe-node$node.json" ]; then
      grep -E '"ok"|"devices"|"process_index"|"name"' "$out_dir/xla-gpu-probe-node$node.json" | cut -c1-300 >&2 || true
    fi
  done
fi

# 4. Train: GPT small and medium on xla:0 (this plugin; XLA_FLAGS above
# reach it) and on LibTorch's eager $eager_device, each side in a process of
# its own (bench_xla --sides): LibTorch's autograd engine asserts in a
# process whose backward meets both CUDA and the xla device (docs/xla.md,
# "The GPU probe"). Both sides start from the same weights and batches, so
# their losses agree; the table joins the two processes' JSON.
train_status=0
if [ -n "$bench_pid" ]; then
  if wait "$bench_pid"; then
    log "bench_xla built after $(( $(date +%s) - start ))s"
    for size in ${TRAIN_SIZES:-small medium}; do
      for side in eager xla; do
        STRATA_PJRT_PLUGIN="$plugin" timeout "${TRAIN_TIMEOUT:-150}" "$bench_build/bench/bench_xla" --model-size "$size" \
          --steps "${TRAIN_STEPS:-30}" --eager-device "$eager_device" --optimizer fused --sides "$side" \
          --json "$out_dir/xla-gpu-train-$size-$side.json" > "$out_dir/train-$size-$side.log" 2>&1 || {
          tail -n 20 "$out_dir/train-$size-$side.log" >&2
          log "GPT $size, $side side: failed (log $out_dir/train-$size-$side.log)"
          train_status=1
        }
      done
    done
    # The table: each size's step times, their ratio, the xla step's split,
    # and whether the two processes trained alike.
    "$python" - "$out_dir" ${TRAIN_SIZES:-small medium} <<'PY' >&2 || true
import json, sys
out, sizes = sys.argv[1], sys.argv[2:]
print("| model | eager ms | xla ms | xla / eager | xla host ms | xla execute ms | loss at step 0 (eager, xla) | last loss (eager, xla) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for size in sizes:
    try:
        e = json.load(open(f"{out}/xla-gpu-train-{size}-eager.json"))["eager"]
        x = json.load(open(f"{out}/xla-gpu-train-{size}-xla.json"))["xla"]
    except (OSError, ValueError, KeyError) as error:
        print(f"| gpt-{size} | missing: {error} | | | | | | |")
        continue
    t = x["per_timed_step_mean"]
    print(f"| gpt-{size} | {e['step_ms_median']:.2f} | {x['step_ms_median']:.2f} | "
          f"{x['step_ms_median'] / e['step_ms_median']:.2f} | {t['host_ms']:.2f} | {t['execute_ms']:.2f} | "
          f"{e['loss'][0]:.6f}, {x['loss'][0]:.6f} | {e['loss'][-1]:.6f}, {x['loss'][-1]:.6f} |")
PY
    # 5. The seeds' strategies on one device of the plugin.
    for strategy in xla xla_fsdp; do
      if STRATA_PJRT_PLUGIN="$plugin" timeout "${TRAIN_TIMEOUT:-120}" "$bench_build/bench/bench_ddp" --model gpt --size small \
        --strategy "$strategy" --devices 1 --steps 10 --warmup 3 > "$out_dir/train-$strategy.log" 2>&1; then
        log "$strategy at world 1: $(tail -n 1 "$out_dir/train-$strategy.log" | cut -c1-400)"
      else
        tail -n 10 "$out_dir/train-$strategy.log" >&2
        log "$strategy at world 1 failed (log $out_dir/train-$strategy.log)"
        train_status=1
      fi
    done
  else
    grep -E 'error|Error' "$out_dir/bench-build.log" | head -n 20 >&2 || true
    tail -n 10 "$out_dir/bench-build.log" >&2
    log "building bench_xla failed (log $out_dir/bench-build.log)"
    train_status=1
  fi
elif [ "$train" = missing ]; then
  train_status=2
fi
log "done after $(( $(date +%s) - start ))s"
[ "$status" = 0 ] || exit "$status"
exit "$train_status"
