#!/usr/bin/env bash
# strata's xla step beside torch_xla's and Lightning Fabric's on the same CPU
# PJRT shapes: for each GPT size, REPEATS rounds, each round running in turn
#   bench_xla (strata's xla:0 beside LibTorch eager in one process, fused
#              AdamW: bench/bench_xla.cpp),
#   torch_xla 2.9 (bench/xla_peer.py --peer torch-xla),
#   Fabric's SingleDeviceXLAStrategy on torch_xla (--peer fabric-xla),
# both peers with torch.optim.AdamW(foreach=True), their faster AdamW on
# XLA (the default per-parameter loop records several times the ops),
# so the rows alternate and a noisy machine slows each alike. Prints the
# machine, the load and one table: each row's runs, its median, its ratio
# to torch_xla's median, and the first and last losses (which agree when
# the weights and batches are the same).
#
# torch_xla 2.9 needs torch 2.9.0, whose PyPI wheel is the CUDA build with
# several GB of nvidia-* wheels, so it lives in its own venv, made here on
# first use from bench/requirements-torch-xla.txt (never by
# scripts/install-deps.sh): $STRATA_TORCH_XLA_VENV, by default beside the
# project's venv (scripts/env.sh). It takes a few minutes and about 7 GB.
#
# With STRATA_MALLOC=mimalloc, bench_xla runs on a preloaded libmimalloc
# (Note [The process's malloc] in src/runtime/heap.cpp) and so do both
# peers, with the same preload and mimalloc options, so every row has the
# same malloc.
#
# Builds nothing: expects ./build (BUILD_DIR=...) with bench_xla built:
#   cmake --build build --target bench_xla
# Usage: bench/run_torch_xla.sh [-r REPEATS] [-s "tiny small"] [-n STEPS] [-o DIR]
#   -r N      rounds (default 3)
#   -s SIZES  GPT presets (default "tiny small")
#   -n N      steps per run (default 30; the median skips the first two)
#   -o DIR    keeps every run's JSON line there
set -euo pipefail

cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
repeats=3
sizes="tiny small"
steps=30
out_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    -r) repeats="$2"; shift 2 ;;
    -s) sizes="$2"; shift 2 ;;
    -n) steps="$2"; shift 2 ;;
    -o) out_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "[bench] unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$repeats$steps" in
  *[!0-9]*|"") echo "[bench] -r and -n take whole numbers (got '$repeats', '$steps')" >&2; exit 2 ;;
esac
bench="$build_dir/bench/bench_xla"
if [ ! -x "$bench" ]; then
  echo "[bench] $bench not found; build it first: cmake --build $build_dir --target bench_xla" >&2
  exit 1
fi

# shellcheck source=scripts/env.sh
source scripts/env.sh
# Made and stamped as scripts/install-deps.sh makes the project's venv: a
# venv whose stamp is missing (a half-made one) or stale is installed into
# again, and made anew only when it has no Python.
venv="${STRATA_TORCH_XLA_VENV:-$strata_cache/venv-py311-torch_xla2.9.0}"
peer_python="$venv/bin/python"
requirements="bench/requirements-torch-xla.txt"
stamp="$venv/.strata-requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [ ! -x "$peer_python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[bench] making torch_xla's venv in $venv (torch 2.9.0 with its CUDA wheels: a few minutes, about 7 GB)" >&2
  rm -f "$stamp"
  if [ ! -x "$peer_python" ]; then
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
  fi
  "$peer_python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  "$peer_python" -c 'import torch_xla, lightning; assert torch_xla.__version__.startswith("2.9.0"), torch_xla.__version__'
  echo "$want" > "$stamp"
fi

# The peers' malloc: what bench_xla's STRATA_MALLOC gives it.
peer_env=()
case "${STRATA_MALLOC:-system}" in
  system) ;;
  mimalloc)
    preload="${STRATA_MIMALLOC:-libmimalloc.so.2}${LD_PRELOAD:+:$LD_PRELOAD}"
    peer_env=("LD_PRELOAD=$preload" "MIMALLOC_RESERVE_OS_MEMORY=${MIMALLOC_RESERVE_OS_MEMORY:-4GiB}"
              "MIMALLOC_DECOMMIT_DELAY=${MIMALLOC_DECOMMIT_DELAY:-2000}" "MIMALLOC_PURGE_DELAY=${MIMALLOC_PURGE_DELAY:-2000}") ;;
  *) echo "[bench] STRATA_MALLOC=$STRATA_MALLOC: use system or mimalloc" >&2; exit 2 ;;
esac

results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "malloc: ${STRATA_MALLOC:-system} on every row"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for size in $sizes; do
  for ((r = 1; r <= repeats; r++)); do
    echo "[bench] $size, round $r/$repeats" >&2
    timeout 900 "$bench" --model-size "$size" --steps "$steps" --optimizer fused \
      --json "$results/strata-$size-$r.json" > /dev/null
    for peer in torch-xla fabric-xla; do
      env ${peer_env[@]+"${peer_env[@]}"} timeout 900 "$peer_python" bench/xla_peer.py --peer "$peer" --model-size "$size" --steps "$steps" --foreach \
        2> "$results/$peer-$size-$r.err" | tail -n 1 > "$results/$peer-$size-$r.json" ||
        { echo "[bench] $peer failed:" >&2; tail -n 20 "$results/$peer-$size-$r.err" >&2; }
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "$out_dir" ] && { mkdir -p "$out_dir"; cp "$results"/*.json "$out_dir"/; }

"$STRATA_PYTHON" - "$results" "$sizes" "$repeats" <<'PY'
import json, statistics, sys
from pathlib import Path

folder, sizes, repeats = Path(sys.argv[1]), sys.argv[2].split(), int(sys.argv[3])

def load(name):
    try:
        return json.loads((folder / name).read_text())
    except (OSError, ValueError):
        return None

print("| model | impl | runs (ms) | median ms | x torch_xla | loss at step 0 | loss at the last step | compiles after step 1 | fallbacks |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for size in sizes:
    rows = {}
    for r in range(1, repeats + 1):
        s = load(f"strata-{size}-{r}.json")
        if s:
            for side, label in (("xla", "strata xla:0 (fused AdamW)"), ("eager", "LibTorch eager (fused AdamW)")):
                x = s[side]
                rows.setdefault(label, []).append(
                    (x["step_ms_median"], x["loss"][0], x["loss"][-1],
                     s["xla"]["compiles_after_warmup"] if side == "xla" else "",
                     s["xla"]["fallback_calls"] if side == "xla" else ""))
        for peer in ("torch-xla", "fabric-xla"):
            p = load(f"{peer}-{size}-{r}.json")
            if p:
                rows.setdefault(p["impl"] + " " + p["torch_xla"], []).append(
                    (p["step_ms_median"], p["losses"][0], p["losses"][-1], p["compiles_after_step_1"],
                     len(p["fallbacks"])))
    medians = {k: statistics.median(v[0] for v in runs) for k, runs in rows.items()}
    base = next((m for k, m in medians.items() if k.startswith("torch_xla ")), None)
    for k, runs in rows.items():
        ratio = f"{medians[k] / base:.2f}" if base else "n/a"
        print(f"| gpt-{size} | {k} | {', '.join(f'{v[0]:.1f}' for v in runs)} | {medians[k]:.1f} | {ratio} | "
              f"{runs[0][1]:.6f} | {runs[0][2]:.6f} | {runs[0][3]} | {runs[0][4]} |")
PY
