#!/usr/bin/env bash
# Makes .venv-gpu-rehearsal, the CPU stand-in for the lent GPU machine's `python3`
# (a venv of CPython 3.12 with JAX 0.11.2, jaxlib and NumPy 2.5.2 only:
# requirements-gpu-rehearsal.txt), and fetches the wheels .ci/gpu-check.sh carries into
# build/gpu-wheels (`gpu-check.sh download`, cached in ~/.cache/shardfeed/gpu-wheels).
# tests/_jax/test_gpu_check.py runs the check with both, offline. Idempotent: a
# second run installs and downloads nothing. Without that Python (SHARDFEED_PYTHON312,
# default pyenv's 3.12.1) it does nothing and says so; the test then skips, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${SHARDFEED_PYTHON312:-/root/.pyenv/versions/3.12.1/bin/python3.12}
venv=.venv-gpu-rehearsal
if [ ! -x "$python" ]; then
  echo "gpu_rehearsal_env: no $python; the GPU-check rehearsal test will skip"
  exit 0
fi
# The requirements a venv was made with, kept in it: unchanged means nothing to do.
stamp=$venv/requirements-gpu-rehearsal.txt
if ! cmp -s requirements-gpu-rehearsal.txt "$stamp"; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  # --no-deps: exactly the pinned closure (nothing else may come in with it).
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    -r requirements-gpu-rehearsal.txt
  "$venv/bin/python" -m pip check --disable-pip-version-check
  cp requirements-gpu-rehearsal.txt "$stamp"
fi
PIP=$venv/bin/pip bash .ci/gpu-check.sh download
