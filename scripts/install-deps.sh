#!/usr/bin/env bash
# Installs the Debian packages strata needs to build, test and benchmark.
# Idempotent and quiet: packages already present are not touched, and
# apt-get runs only when something is missing. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev            # LibTorch 1.13: tensors, autograd, nn, optim, c10d
  libgloo-dev             # CPU collectives over TCP
  libopenblas0-openmp     # fast BLAS for LibTorch (the default reference BLAS is ~30x slower)
  nlohmann-json3-dev      # checkpoint metadata
  libcli11-dev            # command-line parsing
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-torch   # the PyTorch peer for benchmarks and the safetensors reader test
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
  else
    echo "[install-deps] missing packages: ${missing[*]}; run this script as root or install sudo" >&2
    exit 1
  fi
fi

echo "[install-deps] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "[install-deps] done"
