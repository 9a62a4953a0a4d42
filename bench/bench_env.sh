# shellcheck shell=bash disable=SC2154
# Sourced by bench/run_ddp.sh, bench/run_fsdp.sh and bench/run_peers.sh
# (from the repository root, with $threads and $build_dir set): checks that
# bench_ddp is built, finds the venv's Python (bench/python.sh), exports the
# thread count to strata and PyTorch alike, and prints the machine, the
# LibTorch both sides use and its BLAS. Sets $bench, $python and $torch_lib.
bench="$build_dir/bench/bench_ddp"
if [ ! -x "$bench" ]; then
  echo "[bench] $bench not found; build it first: cmake --build $build_dir --target bench_ddp strata_cli" >&2
  exit 1
fi
# shellcheck source=bench/python.sh
source bench/python.sh
cores="$(nproc)"  # before OMP_NUM_THREADS is set: GNU nproc honours it

# Both sides get the same thread count, explicitly.
export OMP_NUM_THREADS="$threads"
export MKL_NUM_THREADS="$threads"

torch_lib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
linked="$(ldd "$bench" | awk '/libtorch_cpu/ {print $3}')"
echo "machine: $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "python: $python; torch $("$python" -c 'import torch; print(torch.__version__)'); threads per rank: $threads (OMP_NUM_THREADS=$OMP_NUM_THREADS)"
echo "libtorch_cpu of bench_ddp: ${linked:-unknown}"
echo "libtorch_cpu of python:    $torch_lib/libtorch_cpu.so"
blas="$("$python" - <<'PY'
import re, torch
show = torch.__config__.show()
m = re.search(r"BLAS_INFO=(\w+)", show)
lib = [l.strip(" -") for l in show.splitlines() if "Math Kernel Library" in l or "OpenBLAS" in l]
print((m.group(1) if m else "unknown") + (f" ({lib[0]})" if lib else ""))
PY
)"
echo "BLAS (inside that libtorch_cpu, used by both sides): $blas"
