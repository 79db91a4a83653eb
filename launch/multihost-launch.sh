#!/usr/bin/env bash
# shardfeed on several hosts with `shardfeed launch` itself: run this script on
# every host, with the same HOSTS everywhere and each host its own HOST_INDEX.
# Each host's launcher starts its share of the workers with the whole
# cluster's TF_CONFIG (MultiWorkerMirroredStrategy; ranks go host by host),
# prefixes their output with the rank, stops its workers if one fails (a
# worker on another host that fails or loses contact is named by the others),
# and says in one line which ports the job exposes.
#
# Edit before running (or set in the environment):
#   - HOSTS: every host, comma-separated, in the same order on every host, by
#     the name or IPv4 address the other hosts reach it at; `host:N` gives a
#     host N workers (default: NUM_WORKERS split evenly);
#   - HOST_INDEX: this host's position in HOSTS, from 0 (required; host 0
#     runs rank 0, the chief);
#   - NUM_WORKERS: the workers of all hosts together (one per GPU);
#   - PORT_BASE: worker s of each host listens on PORT_BASE + s, on every
#     interface, unauthenticated: open these ports between the hosts only
#     (docs/engines.md, Security);
#   - SCRIPT: the training script, at the same path on every host;
#   - STARTUP_TIMEOUT_S: how long workers wait for the other hosts' workers
#     at start-up before failing, naming them;
#   - MTLS_DIR: Keras on JAX >= 0.11.2: the job's credentials (`shardfeed
#     credentials DIR`, the same directory on every host); the coordinator
#     then admits only workers holding them (required there, unless
#     INSECURE_NETWORK=1 accepts an unauthenticated job on a trusted network);
#     TensorFlow's workers refuse it (docs/engines.md, Security);
#   - SHARDFEED: the `shardfeed` command of the environment with shardfeed
#     installed (a command line: e.g. `/opt/venv/bin/shardfeed`).
# Needs no ssh: start it on each host yourself (a terminal each, pdsh, a
# container scheduler).
# Run from the repository root:  HOST_INDEX=0 launch/multihost-launch.sh [script args...]

set -euo pipefail

HOSTS=${HOSTS:-gpu-node-1,gpu-node-2}
HOST_INDEX=${HOST_INDEX:?set HOST_INDEX to the position of this host in HOSTS: 0, 1, ...}
NUM_WORKERS=${NUM_WORKERS:-8}
PORT_BASE=${PORT_BASE:-8888}
SCRIPT=${SCRIPT:-examples/train.py}
STARTUP_TIMEOUT_S=${STARTUP_TIMEOUT_S:-300}
GRACE_S=${GRACE_S:-60}
read -r -a shardfeed <<< "${SHARDFEED:-shardfeed}"
network=()
if [ -n "${MTLS_DIR:-}" ]; then
    network=(--mtls-dir "$MTLS_DIR")
elif [ "${INSECURE_NETWORK:-0}" = 1 ]; then
    network=(--insecure-network)
fi

exec "${shardfeed[@]}" launch --num-workers "$NUM_WORKERS" --hosts "$HOSTS" \
    --host-index "$HOST_INDEX" --port-base "$PORT_BASE" \
    --startup-timeout-s "$STARTUP_TIMEOUT_S" --grace-s "$GRACE_S" ${network[@]+"${network[@]}"} \
    "$SCRIPT" "$@"
