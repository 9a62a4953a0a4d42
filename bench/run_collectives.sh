#!/usr/bin/env bash
# Collectives benchmark: strata's shared-memory backend (what "auto" picks
# on one host) and its Gloo backend beside PyTorch's Gloo process group
# (torch 2.13 in the venv: $STRATA_PYTHON, bench/python.sh), 2 local ranks,
# 1 thread per rank, all_reduce / all_gather / reduce_scatter from 1 KB to
# 64 MB, measured in this one run, with the machine's load before and
# after. Prints one table of bus bandwidths (NCCL-tests convention), the
# ratios strata / torch, and microseconds per call up to 64 KB. Builds
# nothing: expects ./build (override with BUILD_DIR=...).
# Usage: bench/run_collectives.sh [-n RANKS]
set -euo pipefail

cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
ranks=2
if [ "${1:-}" = "-n" ]; then ranks="$2"; fi

bench="$build_dir/bench/bench_collectives"
if [ ! -x "$bench" ]; then
  echo "[bench] $bench not found; build it first: cmake --build $build_dir --target bench_collectives" >&2
  exit 1
fi

# shellcheck source=bench/python.sh
source bench/python.sh

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1

echo "machine: $(OMP_NUM_THREADS= nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); ranks: $ranks, 1 thread each"
echo "load before: $(uptime | sed 's/.*load average/load average/')"
echo "[bench] strata (shm) ..." >&2
"$bench" -n "$ranks" --backend shm > "$tmp/strata-shm.csv"
echo "[bench] strata (gloo) ..." >&2
"$bench" -n "$ranks" --backend gloo > "$tmp/strata-gloo.csv"
echo "[bench] torch $("$python" -c 'import torch; print(torch.__version__)') (gloo) ..." >&2
"$python" bench/collectives_peer.py -n "$ranks" > "$tmp/torch.csv"
echo "load after:  $(uptime | sed 's/.*load average/load average/')"
"$python" bench/collectives_peer.py -n "$ranks" --table "$tmp/strata-shm.csv" "$tmp/strata-gloo.csv" "$tmp/torch.csv"
