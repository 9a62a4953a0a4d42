# shellcheck shell=bash
# Sourced by the bench/run_*.sh scripts: sets $python, the interpreter of
# every Python peer, to the project's venv (torch 2.13.0 CPU, whose
# libtorch_cpu strata links against; lightning for the Fabric peers).
# Override with STRATA_PYTHON=/path/to/python.
user_python="${STRATA_PYTHON:-}"
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"  # the venv's Python
python="${user_python:-$STRATA_PYTHON}"
if [ ! -x "$python" ]; then
  echo "[bench] Python not found at $python (set STRATA_PYTHON, or make the venv with scripts/install-deps.sh)" >&2
  exit 1
fi
if ! "$python" -c 'import torch' >/dev/null 2>&1; then
  echo "[bench] $python cannot import torch; run scripts/install-deps.sh (torch==2.13.0 from scripts/requirements.txt)" >&2
  exit 1
fi
