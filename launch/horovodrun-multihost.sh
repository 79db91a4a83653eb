#!/usr/bin/env bash
# shardfeed with Horovod on several hosts: horovodrun starts one process per
# GPU over ssh; each process gets its rank from Horovod (HOROVOD_RANK with
# --gloo, mpirun's variables with MPI), so no TF_CONFIG is needed.
#
# Edit before running:
#   - HOSTS: "host:GPUs" per host, comma-separated;
#   - NUM_WORKERS: the sum of the GPU counts;
#   - PYTHON: the interpreter with shardfeed and Horovod installed
#     (`pip install shardfeed[horovod]`), at the same path on every host;
#   - SCRIPT: the training script, at the same path on every host; it must
#     use shardfeed's Horovod engine: under horovodrun's MPI controller the
#     ranks carry only mpirun's variables (no HOROVOD_RANK), so "auto" would
#     pick MultiWorkerMirrored; call `shardfeed.init("horovod")` (for
#     examples/train.py pass `--engine horovod`); with `--gloo` "auto" works;
#   - CONTROLLER: Horovod's controller, `--gloo` or `--mpi` (empty: horovodrun
#     picks MPI when Horovod was built with it, else Gloo); with `--gloo`
#     no MPI is needed on the hosts;
#   - NETWORK_INTERFACE: the interface the hosts reach each other on (e.g.
#     eth0); empty: horovodrun probes every host for interfaces they share;
#   - BINDING_ARGS: mpirun's process binding (MPI controller only); the
#     default spells it as both Open MPI 4 and 5 accept.
# Needs passwordless ssh from this host to the others.
# Run from the repository root:  launch/horovodrun-multihost.sh [script args...]

set -euo pipefail

HOSTS=${HOSTS:-gpu-node-1:4,gpu-node-2:4}
NUM_WORKERS=${NUM_WORKERS:-8}
PYTHON=${PYTHON:-$(command -v python3)}
SCRIPT=${SCRIPT:-examples/train.py}
# horovodrun's own default (`-bind-to none -map-by slot`) uses single-dash
# options that Open MPI 5 no longer parses: it takes `none` for the program
# ("prterun was unable to find the specified executable file ... Executable:
# none", exit 66). The double-dash spelling works with Open MPI 4 and 5;
# horovodrun ignores it for MPICH, Intel MPI and --gloo.
BINDING_ARGS=${BINDING_ARGS:---bind-to none --map-by slot}
CONTROLLER=${CONTROLLER:-}
NETWORK_INTERFACE=${NETWORK_INTERFACE:-}

flags=(-np "$NUM_WORKERS" -H "$HOSTS" --binding-args="$BINDING_ARGS")
if [ -n "$CONTROLLER" ]; then
    flags+=("$CONTROLLER")
fi
if [ -n "$NETWORK_INTERFACE" ]; then
    flags+=(--network-interface "$NETWORK_INTERFACE")
fi

# horovodrun prefixes every output line with the rank itself.
exec horovodrun "${flags[@]}" "$PYTHON" "$SCRIPT" "$@"
