#!/usr/bin/env bash
# Runs the core op conformance test in full (tests/xla_device/conformance_test.cpp,
# docs/xla.md "Core ATen coverage"): three seeds instead of one, and the
# samples of every core op that is not lowered too, printing the ops their
# calls fell back on. Then checks the committed op list and coverage table.
# Usage: scripts/xla-conformance.sh [BUILD_DIR]   (default: build)
# The build must have the xla_device suite (-DSTRATA_TEST_SUITES including
# xla_device, or all suites).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
tests="$build/tests/strata_xla_device_tests"
if [[ ! -x "$tests" ]]; then
  echo "xla-conformance: no $tests: build the target strata_xla_device_tests first" >&2
  exit 1
fi
source "$here/env.sh"
"$STRATA_PYTHON" "$here/core_aten_ops.py" --check
STRATA_XLA_CONFORMANCE=full "$tests" --gtest_filter='CoreOpConformanceTest.*:CoreOpsTest.*:CoreOpsDispatcherTest.*'
