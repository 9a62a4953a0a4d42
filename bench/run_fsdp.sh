#!/usr/bin/env bash
# Fully-sharded benchmark: strata's FSDPStrategy (bench_ddp --strategy fsdp,
# each GPT Block a unit) beside strata's DDPStrategy and, for speed,
# PyTorch's DistributedDataParallel (bench/ddp_peer.py, under the venv's
# Python, $STRATA_PYTHON), in this one run (PyTorch's FSDP2 and Lightning
# Fabric beside them: bench/run_peers.sh):
#
# 1. memory, at 2 and 4 ranks: GPT large (12 layers, width 768, 85 M
#    parameters) with a 64-token context and batch 2 per rank, so that
#    parameters, gradients and AdamW's moments dominate; DDP, FSDP built
#    plainly then setup_module, FSDP built inside module_sharded_context,
#    all with the default heap (the tensor pool, Note [The tensor pool] in
#    src/runtime/heap.cpp); then DDP and FSDP with glibc's kept heap
#    (STRATA_HEAP=keep, the default before the pool) and FSDP with glibc
#    returning freed memory at once (STRATA_HEAP=lean), 6 timed steps each.
#    Reports the training state per rank, the peak RSS during training and
#    during set-up (Note [Memory figures] in bench/bench_ddp.cpp);
# 2. speed, at 2 ranks: GPT small, batch 16 per rank (bench/run_ddp.sh's
#    model): strata DDP, strata FSDP, strata FSDP with activation
#    checkpointing (each Block recomputed), PyTorch DDP; same data and
#    initial weights, so the losses after K steps agree.
#
# Builds nothing: expects ./build (override with BUILD_DIR=...), built with
#   cmake --build build --target bench_ddp strata_cli
# Usage: bench/run_fsdp.sh [-r REPEATS] [-t THREADS_PER_RANK] [--steps N] [--worlds "2 4"]
#                          [--memory-size PRESET]
set -euo pipefail

cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
repeats=2
threads=1
steps=30
warmup=5
worlds="2 4"
memory_size=large
while [ $# -gt 0 ]; do
  case "$1" in
    -r) repeats="$2"; shift 2 ;;
    -t) threads="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --worlds) worlds="$2"; shift 2 ;;
    --memory-size) memory_size="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "[bench] unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done

# shellcheck source=bench/bench_env.sh
source bench/bench_env.sh
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# 1. Memory: a few steps are enough (the peak comes with the first step's
# AdamW state); one run per kind.
memory_config="--model gpt --size $memory_size --seq-len 64 --batch 2 --warmup 1 --steps 6 --threads $threads"
for world in $worlds; do
  for kind in "--strategy ddp" "--strategy fsdp" "--strategy fsdp --sharded-init"; do
    echo "[bench] memory: $kind, $world ranks ..." >&2
    # shellcheck disable=SC2086
    timeout 600 "$bench" $memory_config $kind --devices "$world" | grep '^{' >> "$tmp/memory.jsonl"
  done
  # The other heaps (Note [Allocator settings] in src/runtime/heap.cpp):
  # glibc's kept heap, and glibc returning freed memory at once, the floor
  # the reuse of freed memory stands between, and what that costs in step
  # time.
  for heap in "keep ddp" "keep fsdp" "lean fsdp"; do
    read -r mode strategy <<< "$heap"
    echo "[bench] memory: --strategy $strategy with STRATA_HEAP=$mode, $world ranks ..." >&2
    # shellcheck disable=SC2086
    STRATA_HEAP=$mode timeout 600 "$bench" $memory_config --strategy "$strategy" --devices "$world" \
      --impl-label "STRATA_HEAP=$mode" | grep '^{' >> "$tmp/memory.jsonl"
  done
done

# 2. Speed at 2 ranks, alternating the order between repeats so slow drift
# of the machine's load does not always favour the same side.
speed_config="--model gpt --size small --batch 16 --devices 2 --threads $threads --steps $steps --warmup $warmup"
kinds=("strata ddp" "strata fsdp" "strata fsdp+ac" "pytorch ddp")
for ((r = 1; r <= repeats; r++)); do
  order=("${kinds[@]}")
  if ((r % 2 == 0)); then order=("pytorch ddp" "strata fsdp+ac" "strata fsdp" "strata ddp"); fi
  for kind in "${order[@]}"; do
    echo "[bench] speed: $kind (run $r/$repeats) ..." >&2
    case "$kind" in
      "strata ddp") args=(--strategy ddp) ;;
      "strata fsdp") args=(--strategy fsdp) ;;
      "strata fsdp+ac") args=(--strategy fsdp --activation-checkpointing) ;;
    esac
    if [ "$kind" = "pytorch ddp" ]; then
      # shellcheck disable=SC2086
      timeout 600 "$python" bench/ddp_peer.py --peer pytorch-ddp $speed_config --impl-label "$kind" | grep '^{' >> "$tmp/speed.jsonl"
    else
      # shellcheck disable=SC2086
      timeout 600 "$bench" $speed_config "${args[@]}" --impl-label "$kind" | grep '^{' >> "$tmp/speed.jsonl"
    fi
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "Memory per rank (GPT $memory_size, context 64, batch 2 per rank; MB; x ddp: over DDP at the same world size)"
"$python" bench/tables.py memory "$tmp/memory.jsonl"
echo
echo "Speed (GPT small, batch 16 per rank, 2 ranks, $warmup warm-up + $steps timed steps, $repeats run(s) each)"
"$python" bench/tables.py speed "$tmp/speed.jsonl" --against "strata ddp" "pytorch ddp" --train-peak
