#!/usr/bin/env bash
# Installs what strata needs to build, test and benchmark. Idempotent and
# quiet when nothing is missing.
#  - Debian packages: compiler, CMake, Ninja, ccache, nlohmann-json, CLI11,
#    yaml-cpp, cairo with the DejaVu fonts, GoogleTest, Google Benchmark, clang-14 with its libFuzzer runtime, mimalloc (the workers' tensor pool)
#    (apt-get runs only when one is missing;
#    needs root or sudo).
#  - A Python venv (scripts/env.sh says where: a cache folder outside the
#    clone) with scripts/requirements.txt: torch==2.13.0, whose LibTorch
#    (and the Gloo inside it) strata builds against, and the peers and
#    reference readers of the benchmarks and tests. It is rebuilt when the
#    requirements change.
#  - A second venv (STRATA_MLFLOW_VENV) with scripts/requirements-mlflow.txt:
#    the MLflow tracking server the MLflow logger's tests talk to. Its own
#    venv because mlflow's many dependencies must not move the pinned
#    torch/numpy of the first. About 1.5 minutes and 850 MB the first time.
# Neither Debian's LibTorch nor its libgloo is installed: one LibTorch, and
# one Gloo, per process.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

packages=(
  build-essential cmake ninja-build pkg-config
  ccache                  # compiler cache shared by the clones and builds on the machine
  nlohmann-json3-dev      # checkpoint metadata
  libcli11-dev            # command-line parsing
  libyaml-cpp-dev         # hparams.yaml
  libcairo2-dev           # PNG output of strata plot (drawn by cairo)
  fonts-dejavu-core       # its text: DejaVu Sans Mono, found through fontconfig
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-14 libclang-rt-14-dev   # checkpoint fuzz targets (libFuzzer + ASan, fuzz/run.sh)
  iproute2                # ip netns: the two-hosts test
  openmpi-bin             # mpirun: the test that starts strata train under Open MPI (tests/cli/engines_test.cpp)
  libcurl4-openssl-dev    # the MLflow logger's REST client (optional at build time)
  libmimalloc2.0          # the workers' tensor pool (Note [The tensor pool], loaded at run time)
)
python_bin="$(command -v python3 || true)"
if [ -z "$python_bin" ]; then
  packages+=(python3 python3-venv)
elif ! "$python_bin" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  packages+=(python3-venv)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo_cmd=(sudo)
    else
      echo "[install-deps] missing packages: ${missing[*]}; run this script as root or install sudo" >&2
      exit 1
    fi
  fi
  echo "[install-deps] installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The venv: made once, refreshed when requirements.txt changes (its hash is
# kept inside the venv). A half-made venv (interrupted install) has no
# stamp and is made again.
stamp="$STRATA_VENV/.strata-requirements.sha256"
want="$(sha256sum scripts/requirements.txt | cut -d' ' -f1)"
if [ ! -x "$STRATA_PYTHON" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[install-deps] Python environment in $STRATA_VENV (torch 2.13.0 CPU and the test/benchmark peers; a few minutes the first time)"
  rm -f "$stamp"
  if [ ! -x "$STRATA_PYTHON" ]; then
    rm -rf "$STRATA_VENV"
    mkdir -p "$(dirname "$STRATA_VENV")"
    python3 -m venv "$STRATA_VENV"
  fi
  "$STRATA_PYTHON" -m pip install --quiet --disable-pip-version-check -r scripts/requirements.txt
  "$STRATA_PYTHON" -c 'import torch, safetensors, lightning, tensorboard; assert torch.__version__.startswith("2.13.0"), torch.__version__'
  echo "$want" > "$stamp"
  echo "[install-deps] done"
fi

# The MLflow venv, made and stamped the same way from
# scripts/requirements-mlflow.txt.
mlflow_stamp="$STRATA_MLFLOW_VENV/.strata-requirements.sha256"
mlflow_want="$(sha256sum scripts/requirements-mlflow.txt | cut -d' ' -f1)"
if [ ! -x "$STRATA_MLFLOW_PYTHON" ] || [ "$(cat "$mlflow_stamp" 2>/dev/null)" != "$mlflow_want" ]; then
  echo "[install-deps] MLflow environment in $STRATA_MLFLOW_VENV (the tracking server of the MLflow logger's tests; a few minutes the first time)"
  rm -f "$mlflow_stamp"
  if [ ! -x "$STRATA_MLFLOW_PYTHON" ]; then
    rm -rf "$STRATA_MLFLOW_VENV"
    mkdir -p "$(dirname "$STRATA_MLFLOW_VENV")"
    python3 -m venv "$STRATA_MLFLOW_VENV"
  fi
  "$STRATA_MLFLOW_PYTHON" -m pip install --quiet --disable-pip-version-check -r scripts/requirements-mlflow.txt
  "$STRATA_MLFLOW_PYTHON" -c 'import mlflow; assert mlflow.__version__ == "3.17.2", mlflow.__version__'
  echo "$mlflow_want" > "$mlflow_stamp"
  echo "[install-deps] done"
fi
