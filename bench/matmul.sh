# shellcheck shell=bash disable=SC2154
# Sourced by bench/run_peers.sh and bench/run_matrix.sh after
# bench/bench_env.sh (needs $build_dir, $python, $torch_lib, $ranks,
# $threads): compiles bench/matmul_rate.cc against the venv's LibTorch (the
# one strata links) when needed, and defines
#   matmul_round FILE [DTYPE]
# which appends to FILE one JSON line per rank from $ranks concurrent
# processes of the C++ measurement and, for fp32, of the Python one (the
# MFU's denominator: Note [Model FLOPs] in bench/tables.py).
matmul_bin="$build_dir/bench/matmul_rate"
if [ ! -x "$matmul_bin" ] || [ bench/matmul_rate.cc -nt "$matmul_bin" ]; then
  echo "[bench] compiling $matmul_bin ..." >&2
  mkdir -p "$(dirname "$matmul_bin")"
  if ! c++ -O2 -std=c++20 -w -I"$torch_lib/../include" bench/matmul_rate.cc -o "$matmul_bin" \
      -L"$torch_lib" -Wl,-rpath,"$torch_lib" -ltorch_cpu -lc10 >&2; then
    echo "[bench] could not compile bench/matmul_rate.cc; the MFU uses the Python measurement" >&2
    rm -f "$matmul_bin"
  fi
fi

matmul_round() {
  local out="$1" dtype="${2:-fp32}" at pids=() extra=()
  # bf16 matmuls can be 50x slower than fp32 on CPUs without native bf16:
  # a smaller product keeps the round short.
  if [ "$dtype" = bf16 ]; then extra=(--n 256 --reps 5); fi
  if [ -x "$matmul_bin" ]; then
    at=$(($(date +%s) + 2))
    for ((i = 0; i < ranks; i++)); do
      "$matmul_bin" --threads "$threads" --dtype "$dtype" "${extra[@]}" --start-at "$at" >> "$out" & pids+=($!)
    done
    wait "${pids[@]}"
  fi
  [ "$dtype" = fp32 ] || return 0
  pids=()
  at=$(($(date +%s) + 5))
  for ((i = 0; i < ranks; i++)); do "$python" bench/matmul_rate.py --threads "$threads" --start-at "$at" >> "$out" & pids+=($!); done
  wait "${pids[@]}"
}
