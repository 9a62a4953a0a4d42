# shellcheck shell=bash disable=SC2154
# Sourced by bench/run_ddp.sh and bench/run_fsdp.sh (from the repository
# root, with $threads and $build_dir set): checks that bench_ddp is built,
# exports the thread count to strata and PyTorch alike, and prints the
# machine, the BLAS and torch's version. Sets $bench and $python.
bench="$build_dir/bench/bench_ddp"
if [ ! -x "$bench" ]; then
  echo "[bench] $bench not found; build it first: cmake --build $build_dir --target bench_ddp strata_cli" >&2
  exit 1
fi
python=/usr/bin/python3
cores="$(nproc)"  # before OMP_NUM_THREADS is set: GNU nproc honours it

# Both sides get the same thread count, explicitly.
export OMP_NUM_THREADS="$threads"
export MKL_NUM_THREADS="$threads"

blas_alt=/etc/alternatives/libblas.so.3-x86_64-linux-gnu
blas="$(readlink -f "$blas_alt" 2>/dev/null || echo unknown)"
echo "machine: $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "BLAS (libblas.so.3, used by LibTorch and python3-torch alike): $blas"
echo "torch $("$python" -c 'import torch; print(torch.__version__)'); threads per rank: $threads (OMP_NUM_THREADS=$OMP_NUM_THREADS)"
