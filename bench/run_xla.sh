#!/usr/bin/env bash
# One xla device beside LibTorch eager (bench/bench_xla.cpp): the example
# GPT (preset small by default) trained with AdamW and clip_grad_norm_ on
# xla:0, through the CPU PJRT plugin of the project's venv (or
# STRATA_PJRT_PLUGIN), and on LibTorch's CPU, from the same weights and
# batches, the two sides taking turns step by step in one process. Prints
# the machine and its load, each run's table (median step time after the
# first two steps, the xla/eager ratio, compiles, where an xla step's time
# goes), and with -r N a line per run. docs/benchmarks.md, "One xla device
# (CPU plugin) beside LibTorch eager", has the figures.
#
# With -s it also runs the strategies at 2 devices (bench/bench_ddp.cpp):
# ddp and fsdp on 2 CPU workers, xla and xla_fsdp on 2 xla devices of the
# plugin (one process, ranks as threads), the GPT tiny, AdamW, the same
# batches; a table of median step times, the xla/CPU-worker ratios and
# each rank's training state.
#
# With -z it also runs the test zoo (bench/bench_xla_zoo.cpp): the MNIST
# net, the DCGAN, the LLaMA-style decoder, the ResNet, the ViT and the
# LSTM and GRU language models and FNet (tests/support/zoo/), batch 16, each on
# xla:0 beside LibTorch eager: median step times, the ratio, the programs
# a step runs, the compiles after step 2 and the CPU fallbacks.
#
# Builds nothing: expects ./build (override with BUILD_DIR=...), built with
#   cmake --build build --target bench_xla bench_ddp bench_xla_zoo
# Usage: bench/run_xla.sh [-r REPEATS] [-o DIR] [-s] [-z] [BENCH_XLA_ARGS...]
#   -r N     runs the benchmark N times (default 1)
#   -o DIR   keeps each run's JSON there (run-<i>.json)
#   -s       also the strategies at 2 devices (above)
#   -z       also the zoo (above)
#   the rest goes to bench_xla: --model-size tiny|small|medium, --steps N
#   (default 30), --batch, --threads, ... (bench_xla --help)
# Environment: XLA_FLAGS reaches the plugin (e.g. --xla_cpu_use_onednn=true).
set -euo pipefail

cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
repeats=1
out_dir=""
strategies=0
zoo=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -r) repeats="$2"; shift 2 ;;
    -o) out_dir="$2"; shift 2 ;;
    -s) strategies=1; shift ;;
    -z) zoo=1; shift ;;
    -h|--help) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

bench="$build_dir/bench/bench_xla"
if [ ! -x "$bench" ]; then
  echo "[bench] $bench not found; build it first: cmake --build $build_dir --target bench_xla" >&2
  exit 1
fi
# The venv holds the CPU plugin the xla device finds (strata::xla::find_plugin).
# shellcheck source=scripts/env.sh
source scripts/env.sh
results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); XLA_FLAGS: ${XLA_FLAGS:-(unset)}"
for ((r = 1; r <= repeats; r++)); do
  echo
  echo "[bench] run $r/$repeats: $bench ${args[*]:-}" >&2
  timeout 600 "$bench" "${args[@]}" --json "$results/run-$r.json"
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$repeats" -gt 1 ]; then
  echo
  python="$STRATA_PYTHON"
  [ -x "$python" ] || python=python3
  "$python" - "$results"/run-*.json <<'PY'
import json, sys
print("| run | eager ms | xla ms | xla / eager | load before | load after |")
print("| --- | --- | --- | --- | --- | --- |")
for i, path in enumerate(sorted(sys.argv[1:], key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0])), 1):
    r = json.load(open(path))
    if "ratio_xla_over_eager" not in r:
        continue  # one side alone (--sides)
    print(f"| {i} | {r['eager']['step_ms_median']:.1f} | {r['xla']['step_ms_median']:.1f} | "
          f"{r['ratio_xla_over_eager']:.2f} | {r['load_before']} | {r['load_after']} |")
PY
fi
if [ "$strategies" = 1 ]; then
  echo
  echo "strategies at 2 devices (GPT tiny, batch 8 per rank, 20 timed steps after 3); load: $(cut -d' ' -f1-3 /proc/loadavg)"
  for s in ddp xla fsdp xla_fsdp; do
    timeout 600 "$build_dir/bench/bench_ddp" --strategy "$s" --devices 2 --model gpt --size tiny --batch 8 \
      --steps 20 --warmup 3 > "$results/strategy-$s.json"
  done
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  python="$STRATA_PYTHON"
  [ -x "$python" ] || python=python3
  "$python" - "$results" <<'PY'
import json, sys
d = sys.argv[1]
r = {s: json.loads(open(f"{d}/strategy-{s}.json").read()) for s in ("ddp", "xla", "fsdp", "xla_fsdp")}
print("| strategy | where | step ms (median) | vs the CPU workers' | state MB per rank | loss after k |")
print("| --- | --- | --- | --- | --- | --- |")
for s, peer in (("ddp", None), ("xla", "ddp"), ("fsdp", None), ("xla_fsdp", "fsdp")):
    x = r[s]
    where = "2 xla devices, 1 process" if peer else "2 CPU workers"
    ratio = f"{x['step_ms_median'] / r[peer]['step_ms_median']:.2f}x" if peer else "1"
    state = ", ".join(f"{v:.2f}" for v in x["memory"]["state"])
    print(f"| {s} | {where} | {x['step_ms_median']:.1f} | {ratio} | {state} | {x['loss_after_k']:.5f} |")
PY
fi
if [ "$zoo" = 1 ]; then
  echo
  echo "the zoo on xla:0 beside LibTorch eager; load: $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout 900 "$build_dir/bench/bench_xla_zoo" --batch 16 --steps 20
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
fi
if [ -n "$out_dir" ]; then
  mkdir -p "$out_dir"
  cp "$results"/run-*.json "$out_dir"/
  echo "JSON: $out_dir/run-*.json"
fi
