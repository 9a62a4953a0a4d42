#!/usr/bin/env bash
# Data-parallel benchmark: strata's DDPStrategy (bench_ddp) beside PyTorch's
# DistributedDataParallel (bench/ddp_peer.py under the venv's Python,
# $STRATA_PYTHON), same model, data, initial weights, world size, threads,
# per-rank batch and steps, measured in this one run (all peers at once,
# FSDP2 and Lightning Fabric included: bench/run_peers.sh). Runs GPT
# small (batch 16 per rank) and the 512-2048-512 MLP (batch 64 per rank),
# optionally GPT medium, and prints a table with the ratio of each median
# step time to PyTorch's.
#
# Each side also runs a second time with glibc's malloc told to keep freed
# memory (MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, rows tagged
# "+malloc"): without it a C++ LibTorch process gives the large temporaries
# of every step back to the kernel and page-faults them in again next step
# (docs/benchmarks.md). --no-malloc-variants skips those rows.
#
# Builds nothing: expects ./build (override with BUILD_DIR=...), built with
#   cmake --build build --target bench_ddp strata_cli
# Usage: bench/run_ddp.sh [-n RANKS] [-t THREADS_PER_RANK] [-r REPEATS] [--medium] [--steps N]
#                         [--no-malloc-variants]
set -euo pipefail

cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
ranks=2
threads=1
repeats=1
steps=30
warmup=5
medium=0
variants=1
while [ $# -gt 0 ]; do
  case "$1" in
    -n) ranks="$2"; shift 2 ;;
    -t) threads="$2"; shift 2 ;;
    -r) repeats="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --medium) medium=1; shift ;;
    --no-malloc-variants) variants=0; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "[bench] unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done

# shellcheck source=bench/bench_env.sh
source bench/bench_env.sh
echo "ranks: $ranks"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $repeats run(s) per impl and model, $warmup warm-up + $steps timed steps"

configs=("--model gpt --size small --batch 16" "--model mlp --batch 64")
if [ "$medium" = 1 ]; then configs+=("--model gpt --size medium --batch 4"); fi

results="$(mktemp)"
trap 'rm -f "$results"' EXIT
common="--devices $ranks --threads $threads --steps $steps --warmup $warmup"
for config in "${configs[@]}"; do
  for ((r = 1; r <= repeats; r++)); do
    # Alternate which side goes first, so slow drift of the machine's load
    # does not always favour the same one.
    if ((r % 2)); then order="strata pytorch"; else order="pytorch strata"; fi
    for impl in $order; do
      for variant in plain malloc; do
        if [ "$variant" = malloc ] && [ "$variants" = 0 ]; then continue; fi
        env_vars=()
        label="$impl"
        if [ "$variant" = malloc ]; then
          env_vars=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824)
          label="$impl+malloc"
        fi
        echo "[bench] $label $config (run $r/$repeats) ..." >&2
        if [ "$impl" = strata ]; then
          # shellcheck disable=SC2086
          env "${env_vars[@]}" timeout 600 "$bench" $config $common --impl-label "$label" | grep '^{' >> "$results"
        else
          # shellcheck disable=SC2086
          env "${env_vars[@]}" timeout 600 "$python" bench/ddp_peer.py --peer pytorch-ddp $config $common --impl-label "$label" \
            | grep '^{' >> "$results"
        fi
      done
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" bench/ddp_peer.py --table "$results"
