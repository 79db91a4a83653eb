#!/usr/bin/env bash
# The GPU check (issue 18): `shardfeed bench` on Keras' JAX backend, W1, W2 and the
# CIFAR-shaped W4 (shardfeed.fit vs Keras-on-JAX model.fit with its best
# steps_per_execution vs the floor), on a machine with JAX+CUDA and no TensorFlow,
# inside 8 minutes. docs/performance.md says how to run it.
#
#   bash .ci/gpu-check.sh download   # here, with the network: the cp312 wheels Keras needs
#   bash .ci/gpu-check.sh            # there: install them offline, bench, report into $OUT
#
# Environment (all optional):
#   PIP                      the pip that downloads (default .venv/bin/pip, from .ci/setup)
#   SHARDFEED_GPU_WHEELS     wheel folder (default build/gpu-wheels: ignored by git, so
#                            the device tool carries it only when told: carry it)
#   SHARDFEED_GPU_PYTHON     the Python with JAX (default python3)
#   OUT                      where bench.md / bench.json go (default build/gpu-check)
#   SHARDFEED_GPU_WORKLOADS  which, in order (default "W1 W2 W4")
#   SHARDFEED_GPU_ROWS_SCALE rows scale (default 1; e.g. 0.005 for the CPU check)
#   SHARDFEED_GPU_EPOCHS     timed epochs per variant (default 3)
#   SHARDFEED_GPU_BUDGET_S   seconds for the whole check (default 450 = 7.5 min)
#   SHARDFEED_GPU_PROBE_BUDGET_S  per tuning-probe configuration (default 45; a CPU
#                            needs about 150 for W4's CNN)
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${SHARDFEED_GPU_WHEELS:-build/gpu-wheels}
python=${SHARDFEED_GPU_PYTHON:-python3}
out=${OUT:-build/gpu-check}
workloads=${SHARDFEED_GPU_WORKLOADS:-W1 W2 W4}
rows_scale=${SHARDFEED_GPU_ROWS_SCALE:-1}
epochs=${SHARDFEED_GPU_EPOCHS:-3}
budget_s=${SHARDFEED_GPU_BUDGET_S:-450}
probe_budget_s=${SHARDFEED_GPU_PROBE_BUDGET_S:-45}
# Keras 3.15.1 and what it needs beyond what JAX brings (numpy, ml_dtypes come with
# JAX; carried anyway in case the device's are older), for CPython 3.12 x86_64.
packages=(keras==3.15.1 namex optree rich markdown-it-py mdurl pygments absl-py h5py
  ml-dtypes packaging typing-extensions)

if [ "${1:-}" = download ]; then
  cache=$HOME/.cache/shardfeed/gpu-wheels
  mkdir -p "$cache" "$wheels"
  "${PIP:-.venv/bin/pip}" download -q --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --no-deps -d "$cache" "${packages[@]}"
  cp "$cache"/*.whl "$wheels"/
  du -sh "$wheels"
  exit 0
fi

start=$SECONDS
mkdir -p "$out"
out=$(cd "$out" && pwd)
log=$out/gpu-check.log
: > "$log"
say() { echo "$*" | tee -a "$log"; }

# Keras where it is missing: a venv over the system's packages (JAX, CUDA, NumPy stay
# the device's), wheels from the carried folder only.
export KERAS_BACKEND=jax  # Keras' default backend is TensorFlow, absent there
if ! "$python" -c "import keras" >> "$log" 2>&1; then
  env_dir=$(mktemp -d)/venv
  install=(-m pip install -q --disable-pip-version-check --no-index --find-links "$wheels")
  if "$python" -m venv --system-site-packages "$env_dir" >> "$log" 2>&1; then
    "$env_dir/bin/python" "${install[@]}" keras==3.15.1 2>&1 | tee -a "$log"
    python=$env_dir/bin/python
  else  # no venv module there: the user's site-packages instead
    "$python" "${install[@]}" --user keras==3.15.1 2>&1 | tee -a "$log"
  fi
fi
say "python: $python ($("$python" -c 'import sys; print(sys.version.split()[0])'))"
"$python" -c 'import jax, keras; print("jax", jax.__version__, jax.devices(), "keras",
keras.__version__)' 2>&1 | tee -a "$log"

# One bench process per workload, each bounded by what is left of the budget, so a
# slow W4 cannot take W1's and W2's reports with it.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
: > "$out/bench.md"
for workload in $workloads; do
  left=$((budget_s - (SECONDS - start)))
  if [ "$left" -lt 30 ]; then
    say "$workload: not run, ${left} s of the ${budget_s} s budget left"
    echo "### $workload: not run (the ${budget_s} s budget was spent)" >> "$out/bench.md"
    continue
  fi
  say "$workload: up to ${left} s"
  status=0
  timeout "$left" "$python" -m shardfeed bench --workloads "$workload" \
    --variants jax-tuned,shardfeed,floor --rows-scale "$rows_scale" --epochs "$epochs" \
    --probe-budget-s "$probe_budget_s" --out "$out/$workload" >> "$log" 2>&1 || status=$?
  if [ "$status" -eq 0 ]; then
    cat "$out/$workload/bench.md" >> "$out/bench.md"
  else
    say "$workload: failed or timed out (exit $status); see gpu-check.log"
    echo "### $workload: failed or timed out (exit $status), see gpu-check.log" \
      >> "$out/bench.md"
  fi
  echo >> "$out/bench.md"
done
say "gpu-check: $((SECONDS - start)) s; report in $out/bench.md"
cat "$out/bench.md"
