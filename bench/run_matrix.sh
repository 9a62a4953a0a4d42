#!/usr/bin/env bash
# The bench matrix in one run and one table: GPT small, GPT medium and the
# 512-2048-512 MLP; DDP and FSDP; 32-true and bf16-mixed; strata beside
# PyTorch (DistributedDataParallel / FSDP2 fully_shard) and Lightning
# Fabric (strategy="ddp" / ModelParallelStrategy, i.e. FSDP2 through
# Fabric: Fabric's strategy="fsdp" refuses the CPU, see run_peers.sh).
# Every row trains the same model from the same initial weights on the same
# batches (bench_ddp.cpp and ddp_peer.py, Note [Same data and initial
# weights as the peer]), 2 ranks of 1 thread each by default. Prints the
# machine's load before and after, the fp32 matmul rate (the MFU's
# denominator, measured before the rows and after them) and the bf16 one,
# then one table: per model, strategy and precision, each impl's median
# step, its ratio to the PyTorch and the Fabric row, throughput, MFU, loss
# after K and training peak memory over the start (bench/tables.py matrix).
#
# Sizes (per-rank batch, warm-up + timed steps):
#   full:    gpt-small 16, 5+30; gpt-medium 4, 2+10; mlp 64, 5+30
#   --short: gpt-small 4, 1+3;   gpt-medium 1, 1+2;  mlp 64, 2+8; bf16-mixed
#            only on --bf16-models (default "gpt-small mlp": a bf16 matmul
#            can be 50x slower than fp32 on CPUs without native bf16)
# Filters: --models "gpt-small gpt-medium mlp", --strategies "ddp fsdp",
# --precisions "32-true bf16-mixed", --impls "strata pytorch fabric" (the
# default), and the same at their best: strata-best (strata::optim's fused
# AdamW, SDPA), pytorch-best and fabric-best (AdamW(fused=True), SDPA),
# and pytorch-compile (pytorch-best under torch.compile, inductor: its
# compiles fall in the warm-up steps); the table's "x fastest peer" is
# against the fastest peer row.
# -o DIR keeps the JSON lines. Expects ./build (BUILD_DIR=...) with
# bench_ddp: cmake --build build --target bench_ddp
# Usage: bench/run_matrix.sh [--short] [-r REPEATS] [-n RANKS] [-t THREADS] [--models ..] [--strategies ..]
#                            [--precisions ..] [--impls ..] [--bf16-models ..] [--markdown] [-o KEEP_DIR]
set -euo pipefail

cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
ranks=2
threads=1
repeats=1
short=0
models="gpt-small gpt-medium mlp"
strategies="ddp fsdp"
precisions="32-true bf16-mixed"
impls="strata pytorch fabric"
bf16_models=""
markdown=()
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --short) short=1; shift ;;
    -r) repeats="$2"; shift 2 ;;
    -n) ranks="$2"; shift 2 ;;
    -t) threads="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --strategies) strategies="$2"; shift 2 ;;
    --precisions) precisions="$2"; shift 2 ;;
    --impls) impls="$2"; shift 2 ;;
    --bf16-models) bf16_models="$2"; shift 2 ;;
    --markdown) markdown=(--markdown); shift ;;
    -o) keep="$2"; shift 2 ;;
    -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "[bench] unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
for v in "$ranks" "$threads" "$repeats"; do
  if ! [[ "$v" =~ ^[1-9][0-9]{0,2}$ ]]; then
    echo "[bench] -n, -t and -r take a whole number from 1 to 999, got '$v'" >&2
    exit 2
  fi
done
if [ -z "$bf16_models" ]; then
  if ((short)); then bf16_models="gpt-small mlp"; else bf16_models="$models"; fi
fi

# The per-model flags: "batch warmup steps".
sizes() {
  case "$1:$short" in
    gpt-small:0) echo "16 5 30" ;;  gpt-small:1) echo "4 1 3" ;;
    gpt-medium:0) echo "4 2 10" ;;  gpt-medium:1) echo "1 1 2" ;;
    mlp:0) echo "64 5 30" ;;        mlp:1) echo "64 2 8" ;;
    *) echo "[bench] unknown model '$1' (gpt-small, gpt-medium, mlp)" >&2; exit 2 ;;
  esac
}
model_flags() {
  case "$1" in
    gpt-small) echo "--model gpt --size small" ;;
    gpt-medium) echo "--model gpt --size medium" ;;
    mlp) echo "--model mlp" ;;
  esac
}
for m in $models; do sizes "$m" > /dev/null; done

# shellcheck source=bench/bench_env.sh
source bench/bench_env.sh
echo "matrix: models [$models], strategies [$strategies], precisions [$precisions] (bf16-mixed on [$bf16_models]), impls [$impls]; $ranks ranks x $threads thread(s); $repeats run(s) per row$( ((short)) && echo '; short mode')"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
started=$SECONDS
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=bench/matmul.sh
source bench/matmul.sh

echo "[bench] matmul rate, fp32 and bf16 (before) ..." >&2
matmul_round "$tmp/matmul-1.jsonl" fp32
matmul_round "$tmp/matmul-1.jsonl" bf16

run_row() {  # impl strategy precision model
  local impl="$1" strategy="$2" precision="$3" model="$4" label cmd rc
  read -r batch warmup steps <<< "$(sizes "$model")"
  case "$impl:$strategy" in
    strata:*) label="strata"; cmd=("$bench" --strategy "$strategy") ;;
    pytorch:ddp) label="pytorch ddp"; cmd=("$python" bench/ddp_peer.py --peer pytorch-ddp) ;;
    pytorch:fsdp) label="pytorch fsdp2"; cmd=("$python" bench/ddp_peer.py --peer pytorch-fsdp2) ;;
    fabric:ddp) label="fabric ddp"; cmd=("$python" bench/ddp_peer.py --peer fabric-ddp) ;;
    fabric:fsdp) label="fabric model-parallel"; cmd=("$python" bench/ddp_peer.py --peer fabric-model-parallel) ;;
    # At their best: fused AdamW and scaled_dot_product_attention on both sides.
    strata-best:*) label="strata fused+sdpa"; cmd=("$bench" --strategy "$strategy" --optimizer adamw-fused) ;;
    pytorch-best:ddp) label="pytorch ddp fused+sdpa"; cmd=("$python" bench/ddp_peer.py --peer pytorch-ddp --fused) ;;
    pytorch-best:fsdp) label="pytorch fsdp2 fused+sdpa"; cmd=("$python" bench/ddp_peer.py --peer pytorch-fsdp2 --fused) ;;
    fabric-best:ddp) label="fabric ddp fused+sdpa"; cmd=("$python" bench/ddp_peer.py --peer fabric-ddp --fused) ;;
    fabric-best:fsdp) label="fabric model-parallel fused+sdpa"
      cmd=("$python" bench/ddp_peer.py --peer fabric-model-parallel --fused) ;;
    # PyTorch at its very best on a CPU: the -best row under torch.compile (inductor).
    pytorch-compile:ddp) label="pytorch ddp fused+sdpa+compile"
      cmd=("$python" bench/ddp_peer.py --peer pytorch-ddp --fused --compile) ;;
    pytorch-compile:fsdp) label="pytorch fsdp2 fused+sdpa+compile"
      cmd=("$python" bench/ddp_peer.py --peer pytorch-fsdp2 --fused --compile) ;;
    *) echo "[bench] unknown impl '$impl' (strata, pytorch, fabric, each with -best, and pytorch-compile)" >&2; exit 2 ;;
  esac
  # SDPA is a GPT's; the MLP has no attention.
  if [[ "$impl" == *-best || "$impl" == pytorch-compile ]] && [ "$model" != mlp ]; then cmd+=(--attention sdpa); fi
  echo "[bench] $model $strategy $precision: $label ..." >&2
  rc=0
  # shellcheck disable=SC2046
  timeout 900 "${cmd[@]}" $(model_flags "$model") --batch "$batch" --warmup "$warmup" --steps "$steps" \
    --devices "$ranks" --threads "$threads" --precision "$precision" --impl-label "$label" \
    > "$tmp/out" 2> "$tmp/err" || rc=$?
  if [ "$rc" != 0 ]; then
    echo "[bench] $label failed (exit status $rc); the last lines of its stderr:" >&2
    tail -5 "$tmp/err" >&2
    printf '{"impl": "%s", "model": "%s", "strategy": "%s", "precision": "%s", "world": %s, "error": "exit status %s"}\n' \
      "$label" "$model" "$strategy" "$precision" "$ranks" "$rc" >> "$tmp/results.jsonl"
    return 0
  fi
  grep '^{' "$tmp/out" >> "$tmp/results.jsonl" || true
}

for ((r = 1; r <= repeats; r++)); do
  for model in $models; do
    for strategy in $strategies; do
      for precision in $precisions; do
        if [ "$precision" = bf16-mixed ] && [[ " $bf16_models " != *" $model "* ]]; then continue; fi
        # Alternate the order of the impls between repeats (slow drift of
        # the load must not always favour the same one).
        order=($impls)
        if ((r % 2 == 0)); then order=($(printf '%s\n' "${order[@]}" | tac)); fi
        for impl in "${order[@]}"; do run_row "$impl" "$strategy" "$precision" "$model"; done
      done
    done
  done
done

echo "[bench] matmul rate, fp32 (after) ..." >&2
matmul_round "$tmp/matmul-2.jsonl" fp32
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); took $((SECONDS - started)) s"
if [ -n "$keep" ]; then
  mkdir -p "$keep"
  cp "$tmp"/results.jsonl "$tmp"/matmul-*.jsonl "$keep"/
fi
echo
"$python" bench/tables.py matrix "$tmp/results.jsonl" --matmul "$tmp/matmul-1.jsonl" "$tmp/matmul-2.jsonl" \
  "${markdown[@]}"
