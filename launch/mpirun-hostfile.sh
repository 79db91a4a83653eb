#!/usr/bin/env bash
# shardfeed over MPI on several hosts: mpirun starts one rank per GPU slot in a
# hostfile; each rank builds its TF_CONFIG by exchanging host:port with the
# others over MPI (mpi4py), so nobody writes a TF_CONFIG by hand.
#
# Edit before running:
#   - HOSTFILE: copy launch/hostfile.example to launch/hostfile and list your
#     hosts with their GPU counts;
#   - NUM_WORKERS: total ranks, the sum of the slots;
#   - PYTHON: the interpreter with shardfeed and mpi4py installed
#     (`pip install shardfeed[mpi]`), at the same path on every host;
#   - SCRIPT: the training script, at the same path on every host;
#   - NETWORK_INTERFACE: each rank tells the others its host name
#     (`hostname`), which every host must resolve to a reachable address; if
#     they do not (shardfeed.init() then fails on every rank naming the host),
#     set this to the cluster network's interface (e.g. eth0) and each rank
#     announces that interface's IPv4 address instead (on Keras' JAX backend
#     Gloo's collectives listen there too).
#   - MTLS_DIR: Keras on JAX >= 0.11.2: the job's credentials (`shardfeed
#     credentials DIR`, the same path on every host), required there unless
#     INSECURE_NETWORK=1 (docs/engines.md, Security).
# Needs passwordless ssh from this host to the others.
# Run from the repository root:  launch/mpirun-hostfile.sh [script args...]

set -euo pipefail

HOSTFILE=${HOSTFILE:-launch/hostfile}
NUM_WORKERS=${NUM_WORKERS:-8}
PYTHON=${PYTHON:-$(command -v python3)}
SCRIPT=${SCRIPT:-examples/train.py}
NETWORK_INTERFACE=${NETWORK_INTERFACE:-}
if [ -n "$NETWORK_INTERFACE" ]; then
    export SHARDFEED_NETWORK_INTERFACE=$NETWORK_INTERFACE
fi
if [ -n "${MTLS_DIR:-}" ]; then
    export SHARDFEED_MTLS_DIR=$MTLS_DIR
elif [ "${INSECURE_NETWORK:-0}" = 1 ]; then
    export SHARDFEED_INSECURE_NETWORK=1
fi

if mpirun --version 2>&1 | grep -q -e "Open MPI" -e "OpenRTE"; then
    # Open MPI: prefix lines with the rank, send this environment to the
    # remote ranks, and let each rank use its GPU's cores rather than one.
    flags=(--hostfile "$HOSTFILE" --tag-output --bind-to none --map-by slot
        -x PATH -x LD_LIBRARY_PATH -x PYTHONPATH)
    if [ "$(id -u)" = 0 ]; then
        flags+=(--allow-run-as-root)
    fi
    for variable in SHARDFEED_NETWORK_INTERFACE SHARDFEED_MTLS_DIR SHARDFEED_INSECURE_NETWORK; do
        if [ -n "${!variable:-}" ]; then
            flags+=(-x "$variable")
        fi
    done
else
    # MPICH or Intel MPI (Hydra): hostfile lines read `host:slots`.
    flags=(-f "$HOSTFILE" -prepend-rank -genvall)
fi

exec mpirun -np "$NUM_WORKERS" "${flags[@]}" "$PYTHON" "$SCRIPT" "$@"
