#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs
# the main job: a small GPT trained on the texts under
# /usr/share/common-licenses by 2 CPU worker processes, the learning rate
# warmed up over 30 steps and then decayed along a cosine to a tenth (as
# GPT training does), printing progress and the validation loss on
# held-out text every 50 steps, saving
# checkpoints under out/demo, a CSV log (Lightning's layout) under
# out/demo/logs, and sampling some text at the end.
# Extra arguments go to `strata train` (see `build/strata train --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
rm -rf out/demo
exec ./build/strata train --devices 2 --strategy ddp --model-size small --max-steps 300 \
  --batch-size 32 --lr-schedule cosine --warmup-steps 30 --ckpt-dir out/demo --ckpt-every 100 \
  --metrics-file out/demo/metrics.jsonl \
  --val-every 50 --logger csv --log-dir out/demo/logs "$@"
