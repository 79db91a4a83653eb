#!/usr/bin/env bash
# shardfeed with N local workers (MultiWorkerMirroredStrategy, in a private network
# namespace where the system permits one; see docs/engines.md, Security):
# `shardfeed launch` starts them, gives each its TF_CONFIG and SHARDFEED_RANK,
# prefixes their output with the rank, and stops them all if one fails.
#
# Edit before running:
#   - NUM_WORKERS: number of local processes (one per GPU; on a CPU-only
#     machine two are enough to test multi-worker code);
#   - SCRIPT: the training script;
#   - GRACE_S: seconds stopping workers get before SIGKILL.
# Run from the repository root, in the environment with shardfeed installed:
#   launch/local-multiworker.sh [script args...]

set -euo pipefail

NUM_WORKERS=${NUM_WORKERS:-2}
SCRIPT=${SCRIPT:-examples/train.py}
GRACE_S=${GRACE_S:-60}

exec shardfeed launch --num-workers "$NUM_WORKERS" --grace-s "$GRACE_S" "$SCRIPT" "$@"
