#!/usr/bin/env bash
# strata beside today's peers, in one run: the same GPT (small: 4 layers,
# width 128, context 128), the same data, the same initial weights, the
# same batches (16 sequences per rank), the same world size (2 ranks) and
# threads per rank (1), AdamW, 5 warm-up + 30 timed steps; rows:
#   strata ddp              bench_ddp --strategy ddp (DDPStrategy via Fabric)
#   strata fsdp             bench_ddp --strategy fsdp (each Block a unit)
#   pytorch ddp             DistributedDataParallel, Gloo   (bench/ddp_peer.py)
#   pytorch fsdp2           fully_shard per Block + root, Gloo, CPU
#   fabric ddp              Lightning Fabric, strategy="ddp"
#   fabric fsdp             Lightning Fabric, strategy="fsdp" (FSDP1): refuses
#                           CPU; its error is quoted under the table
#   fabric model-parallel   Fabric's ModelParallelStrategy (FSDP2 via Fabric)
# Before each repeat and after the last it measures the machine's fp32 matmul
# rate (1024^3, one process per rank on THREADS threads, started together)
# with LibTorch from C++ (bench/matmul_rate.cc, compiled here in ~10 s
# against the venv's LibTorch) and from Python (bench/matmul_rate.py).
# Prints one table: median step time, its ratio to PyTorch DDP's, tokens/s,
# peak RSS per rank, training peak over the start, loss after K (equal on
# every row: same weights, data and batches), model GFLOP/s and MFU
# (Note [Model FLOPs] in bench/tables.py). -o DIR keeps the JSON lines
# (results.jsonl, matmul-ROUND.jsonl) for bench/tables.py; --only runs a
# subset of the rows ("strata ddp,pytorch ddp"). Python: $STRATA_PYTHON
# (default: the venv of scripts/install-deps.sh). Builds nothing of CMake's:
# expects ./build (BUILD_DIR=...) with bench_ddp, built with
#   cmake --build build --target bench_ddp strata_cli
# Usage: bench/run_peers.sh [-r REPEATS] [--steps N] [--warmup N] [-n RANKS] [-t THREADS]
#                           [--only "IMPL,IMPL"] [--markdown] [-o KEEP_DIR]
set -euo pipefail

cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
ranks=2
threads=1
repeats=2
steps=30
warmup=5
only=""
markdown=()
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    -r) repeats="$2"; shift 2 ;;
    -n) ranks="$2"; shift 2 ;;
    -t) threads="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --markdown) markdown=(--markdown); shift ;;
    -o) keep="$2"; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "[bench] unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done

# shellcheck source=bench/bench_env.sh
source bench/bench_env.sh
echo "ranks: $ranks; $repeats run(s) per row, $warmup warm-up + $steps timed steps; GPT small, batch 16 per rank"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
started=$SECONDS

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The matmul rate (the MFU's denominator): matmul_round FILE.
# shellcheck source=bench/matmul.sh
source bench/matmul.sh

config="--model gpt --size small --batch 16 --devices $ranks --threads $threads --steps $steps --warmup $warmup"
rows=("strata ddp" "strata fsdp" "pytorch ddp" "pytorch fsdp2" "fabric ddp" "fabric fsdp" "fabric model-parallel")
if [ -n "$only" ]; then IFS=, read -r -a rows <<< "$only"; fi
for ((r = 1; r <= repeats; r++)); do
  # A matmul round before each repeat and one after the last: the load of
  # this shared machine changes within a run, and the MFU's denominator is
  # their mean.
  echo "[bench] matmul rate (round $r) ..." >&2
  matmul_round "$tmp/matmul-$r.jsonl"
  # Alternate the order between repeats, so slow drift of the machine's load
  # does not always favour the same rows.
  order=("${rows[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#rows[@]} - 1; i >= 0; i--)); do order+=("${rows[i]}"); done
  fi
  for row in "${order[@]}"; do
    # A refusal says the same every time: ask once.
    if [ "$row" = "fabric fsdp" ] && ((r > 1)); then continue; fi
    echo "[bench] $row (run $r/$repeats) ..." >&2
    case "$row" in
      "strata ddp") cmd=("$bench" --strategy ddp) ;;
      "strata fsdp") cmd=("$bench" --strategy fsdp) ;;
      *) cmd=("$python" bench/ddp_peer.py --peer "${row// /-}") ;;
    esac
    rc=0
    # shellcheck disable=SC2086
    timeout 600 "${cmd[@]}" $config --impl-label "$row" > "$tmp/out" 2> "$tmp/err" || rc=$?
    if [ "$rc" != 0 ]; then
      echo "[bench] $row failed (exit status $rc); the last lines of its stderr:" >&2
      tail -5 "$tmp/err" >&2
      printf '{"impl": "%s", "model": "gpt-small", "world": %s, "error": "exit status %s (run %s)"}\n' \
        "$row" "$ranks" "$rc" "$r" >> "$tmp/results.jsonl"
      continue
    fi
    grep '^{' "$tmp/out" >> "$tmp/results.jsonl" || true
  done
done

echo "[bench] matmul rate (round $((repeats + 1))) ..." >&2
matmul_round "$tmp/matmul-$((repeats + 1)).jsonl"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); took $((SECONDS - started)) s"
if [ -n "$keep" ]; then
  mkdir -p "$keep"
  cp "$tmp"/results.jsonl "$tmp"/matmul-*.jsonl "$keep"/
fi
rounds=()
for ((r = 1; r <= repeats + 1; r++)); do rounds+=("$tmp/matmul-$r.jsonl"); done
echo
"$python" bench/tables.py speed "$tmp/results.jsonl" --against "pytorch ddp" --train-peak \
  --matmul "${rounds[@]}" "${markdown[@]}"
