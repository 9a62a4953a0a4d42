# Sourced by the other scripts: where the project's Python environment
# lives. It sits outside the clone (a cache folder), so every clone on the
# machine, CI's included, reuses it. Override with STRATA_VENV.
strata_cache="${STRATA_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/strata}"
STRATA_VENV="${STRATA_VENV:-$strata_cache/venv-py311-torch2.13.0}"
STRATA_PYTHON="$STRATA_VENV/bin/python"
export STRATA_VENV STRATA_PYTHON
# The CUDA build of torch (with its nvidia-* wheels, NCCL among them) that
# scripts/build-cuda.sh compiles strata against, in its own venv beside the
# first. Override with STRATA_CUDA_VENV.
STRATA_CUDA_VENV="${STRATA_CUDA_VENV:-$strata_cache/venv-py311-torch2.14.1-cuda}"
STRATA_CUDA_PYTHON="$STRATA_CUDA_VENV/bin/python"
export STRATA_CUDA_VENV STRATA_CUDA_PYTHON
# The MLflow tracking server and client (scripts/requirements-mlflow.txt)
# that the MLflow logger's tests start and read back with, in its own venv
# beside the first so that mlflow's dependencies never move the pinned
# torch/numpy there. Override with STRATA_MLFLOW_VENV.
STRATA_MLFLOW_VENV="${STRATA_MLFLOW_VENV:-$strata_cache/venv-py311-mlflow3.17.2}"
STRATA_MLFLOW_PYTHON="$STRATA_MLFLOW_VENV/bin/python"
export STRATA_MLFLOW_VENV STRATA_MLFLOW_PYTHON
# The compiler cache that every build of every clone on the machine shares
# (Note [Compiler cache] in CMakeLists.txt). Override with CCACHE_DIR.
CCACHE_DIR="${CCACHE_DIR:-$strata_cache/ccache}"
CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
export CCACHE_DIR CCACHE_MAXSIZE
