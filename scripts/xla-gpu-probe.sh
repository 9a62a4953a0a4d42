#!/usr/bin/env bash
# Runs strata's PJRT probe on an NVIDIA GPU through JAX's CUDA PJRT plugin,
# without LibTorch and without Python at run time (docs/xla.md, "The GPU
# probe"). Made for a machine with jax and jax-cuda13-pjrt installed (the
# H200 one has jax 0.11.2); under 5 minutes:
#  1. finds the plugin (jax_plugins/xla_cuda*/xla_cuda_plugin.so) and the
#     NVIDIA libraries and tools JAX's wheels carry (nvidia/*/lib, bin);
#  2. builds strata-xla-probe from src/xla/ with one compiler (no CMake, no
#     LibTorch, no other library);
#  3. runs it with preallocate=false, writing the JSON report.
# Usage: scripts/xla-gpu-probe.sh [OUT_DIR]   (default: $TMPDIR/strata-xla-gpu-probe)
# Environment: PYTHON (the Python with jax; default python3),
#   STRATA_PJRT_PLUGIN (skip the search), CXX (default c++).
# Exit status: the probe's (0 when every case that ran matched its loop
# reference), or 2 when something needed is missing.
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

# 2. Build: the PJRT layer needs only a C++20 compiler and libdl.
command -v "$cxx" >/dev/null || die "no C++ compiler '$cxx': set CXX"
build="$out_dir/build"
mkdir -p "$build"
pids=()
for src in src/xla/*.cpp; do
  "$cxx" -std=c++20 -O2 -Iinclude -c "$src" -o "$build/$(basename "$src" .cpp).o" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || die "compiling src/xla failed"; done
"$cxx" "$build"/*.o -ldl -o "$build/strata-xla-probe" || die "linking strata-xla-probe failed"
log "built $build/strata-xla-probe in $(( $(date +%s) - start ))s"

# 3. Run. preallocate=false: XLA would otherwise take most of the card.
status=0
timeout 240 "$build/strata-xla-probe" --plugin "$plugin" --option preallocate=false \
  --out "$out_dir/xla-gpu-probe.json" > /dev/null 2> "$out_dir/probe.log" || status=$?
tail -n 20 "$out_dir/probe.log" >&2 || true
if [ -f "$out_dir/xla-gpu-probe.json" ]; then cat "$out_dir/xla-gpu-probe.json"; fi
log "status $status after $(( $(date +%s) - start ))s; report in $out_dir/xla-gpu-probe.json, log in $out_dir/probe.log"
exit "$status"
