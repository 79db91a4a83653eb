#!/usr/bin/env bash
# shardfeed with Horovod on several hosts: horovodrun starts one process per
# GPU over ssh; each process reads its rank from HOROVOD_RANK / HOROVOD_SIZE
# (horovodrun sets them), so no TF_CONFIG is needed.
#
# Edit before running:
#   - HOSTS: "host:GPUs" per host, comma-separated;
#   - NUM_WORKERS: the sum of the GPU counts;
#   - PYTHON: the interpreter with shardfeed and Horovod installed
#     (`pip install shardfeed[horovod]`), at the same path on every host;
#   - SCRIPT: the training script, at the same path on every host; it must
#     use shardfeed's Horovod engine;
#   - add `--gloo` or `--mpi` to choose Horovod's controller (by default it
#     uses MPI when Horovod was built with it).
# Needs passwordless ssh from this host to the others.
# Run from the repository root:  launch/horovodrun-multihost.sh [script args...]

set -euo pipefail

HOSTS=${HOSTS:-gpu-node-1:4,gpu-node-2:4}
NUM_WORKERS=${NUM_WORKERS:-8}
PYTHON=${PYTHON:-$(command -v python3)}
SCRIPT=${SCRIPT:-examples/train.py}

# horovodrun prefixes every output line with the rank itself.
exec horovodrun -np "$NUM_WORKERS" -H "$HOSTS" "$PYTHON" "$SCRIPT" "$@"
