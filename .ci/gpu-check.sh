#!/usr/bin/env bash
# The GPU check (issue 18): `shardfeed bench` on Keras' JAX backend, W1, W2 and the
# CIFAR-shaped W4 (shardfeed.fit vs Keras-on-JAX model.fit with its best
# steps_per_execution, the same on keras-nightly, and the floor), on a machine with
# JAX+CUDA and neither TensorFlow nor Keras nor network, inside 8 minutes.
# docs/performance.md says how to run it.
#
#   bash .ci/gpu-check.sh download   # here, with the network: the cp312 wheels Keras needs
#   bash .ci/gpu-check.sh            # there: install them offline, bench, report into $OUT
#
# There `python3` is itself a venv (JAX, CUDA plugin, NumPy), so the wheels go into
# folders on PYTHONPATH (`pip install --no-index --no-deps --target`), each only where
# that Python lacks it, never JAX, jaxlib or NumPy (.ci/gpu_wheels.py says why): Keras
# 3.15.1 and its dependencies into one, keras-nightly into another, which only the
# jax-nightly-tuned variant's worker process puts first on its path.
#
# Environment (all optional):
#   PIP                      the pip that downloads (default .venv/bin/pip, from .ci/setup)
#   SHARDFEED_GPU_WHEELS     wheel folder (default build/gpu-wheels: ignored by git, so
#                            the device tool carries it only when told: carry it)
#   SHARDFEED_GPU_PYTHON     the Python with JAX (default python3)
#   OUT                      where bench.md / bench.json go (default build/gpu-check)
#   SHARDFEED_GPU_WORKLOADS  which, in order (default "W1 W2 W4")
#   SHARDFEED_GPU_VARIANTS   which (default jax-tuned,jax-nightly-tuned,shardfeed,floor)
#   SHARDFEED_GPU_ROWS_SCALE rows scale (default 1; e.g. 0.001 for the CPU check)
#   SHARDFEED_GPU_EPOCHS     timed epochs per variant (default 3)
#   SHARDFEED_GPU_BUDGET_S   seconds for the whole check (default 450 = 7.5 min)
#   SHARDFEED_GPU_PROBE_BUDGET_S  per tuning-probe configuration (default 45; a CPU
#                            needs about 150 for W4's CNN)
#   SHARDFEED_GPU_CAPACITY   1 (default): after the workloads, with what is left of the
#                            budget, `bench --capacity` (the largest dataset that trains
#                            resident on the device); 0: not
#   SHARDFEED_GPU_CAPACITY_LIMIT_BYTES  stands in for the device's bytes_limit (a CPU
#                            reports none; e.g. 33554432 for the CPU check)
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
variants=${SHARDFEED_GPU_VARIANTS:-jax-tuned,jax-nightly-tuned,shardfeed,floor}
# Keras 3.15.1 and what it needs beyond what JAX brings (ml-dtypes comes with JAX;
# carried anyway, installed only where missing), and keras-nightly: CPython 3.12
# x86_64, pinned (bump together with docs/performance.md's sizes).
packages=(keras==3.15.1 keras-nightly==3.16.0.dev2026102704 namex==0.1.0 optree==0.20.0
  rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 absl-py==2.5.1
  h5py==3.14.0 ml-dtypes==0.6.0 packaging==26.4 typing-extensions==4.16.0)

if [ "${1:-}" = download ]; then
  cache=$HOME/.cache/shardfeed/gpu-wheels
  mkdir -p "$cache"
  pip=${PIP:-.venv/bin/pip}
  mapfile -t missing < <(python3 .ci/gpu_wheels.py missing "$cache" "${packages[@]}")
  if [ "${#missing[@]}" -gt 0 ] && [ -n "${missing[0]}" ]; then
    "$pip" download -q --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux_2_28_x86_64 --no-deps -d "$cache" "${missing[@]}"
  fi
  python3 .ci/gpu_wheels.py pick "$cache" "$wheels" "${packages[@]}"
  du -sh "$wheels"
  exit 0
fi

start=$SECONDS
mkdir -p "$out"
out=$(cd "$out" && pwd)
log=$out/gpu-check.log
: > "$log"
say() { echo "$*" | tee -a "$log"; }

# Keras where it is missing: carried wheels into folders of their own on PYTHONPATH
# (JAX, CUDA and NumPy stay the machine's; .ci/gpu_wheels.py decides which).
export KERAS_BACKEND=jax  # Keras' default backend is TensorFlow, absent there
sites=$(mktemp -d "${TMPDIR:-/tmp}/shardfeed-gpu-sites.XXXXXX")
trap 'rm -rf "$sites"' EXIT
site=$sites/keras nightly=$sites/keras-nightly
if [ -d "$wheels" ]; then
  "$python" .ci/gpu_wheels.py install "$wheels" "$site" "$nightly" 2>&1 | tee -a "$log"
else
  say "no wheel folder $wheels: nothing installed (carry it: docs/performance.md)"
fi
export PYTHONPATH=$PWD:$site${PYTHONPATH:+:$PYTHONPATH}
if [ -z "${SHARDFEED_KERAS_NIGHTLY_PATH:-}" ] && [ -d "$nightly/keras" ]; then
  export SHARDFEED_KERAS_NIGHTLY_PATH=$nightly
fi
# Exactly what runs: the bench's process, and the nightly worker's path.
versions='from shardfeed._commands.bench.backend_worker import versions_text, worker_versions
print(versions_text(worker_versions("jax")))'
"$python" .ci/gpu_wheels.py check "$sites" 2>&1 | tee -a "$log"
say "bench: $("$python" -c "$versions" 2>&1 | tail -n 1)"
if [ -n "${SHARDFEED_KERAS_NIGHTLY_PATH:-}" ]; then
  say "jax-nightly-tuned: $(PYTHONPATH=$SHARDFEED_KERAS_NIGHTLY_PATH:$PYTHONPATH \
    "$python" -c "$versions" 2>&1 | tail -n 1)"
else
  say "jax-nightly-tuned: no keras-nightly (SHARDFEED_KERAS_NIGHTLY_PATH unset)"
fi

# One bench process per workload, each bounded by what is left of the budget, so a
# slow W4 cannot take W1's and W2's reports with it.
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
  # --jax-python: the nightly's worker runs this Python, not $SHARDFEED_JAX_PYTHON.
  timeout "$left" "$python" -m shardfeed bench --workloads "$workload" \
    --variants "$variants" --jax-python "$python" --rows-scale "$rows_scale" \
    --epochs "$epochs" --probe-budget-s "$probe_budget_s" --out "$out/$workload" \
    >> "$log" 2>&1 || status=$?
  if [ "$status" -eq 0 ]; then
    cat "$out/$workload/bench.md" >> "$out/bench.md"
  else
    say "$workload: failed or timed out (exit $status); see gpu-check.log"
    echo "### $workload: failed or timed out (exit $status), see gpu-check.log" \
      >> "$out/bench.md"
  fi
  echo >> "$out/bench.md"
done
# The capacity probe last, with what is left: the workloads are the check's purpose.
if [ "${SHARDFEED_GPU_CAPACITY:-1}" = 1 ]; then
  left=$((budget_s - (SECONDS - start)))
  limit=${SHARDFEED_GPU_CAPACITY_LIMIT_BYTES:-}
  if [ "$left" -lt 60 ]; then
    say "capacity: not run, ${left} s of the ${budget_s} s budget left"
    echo "### Capacity: not run (the ${budget_s} s budget was spent)" >> "$out/bench.md"
  else
    say "capacity: up to ${left} s"
    status=0
    timeout "$left" "$python" -m shardfeed bench --capacity ${limit:+--capacity-limit-bytes "$limit"} \
      --out "$out/capacity" >> "$log" 2>&1 || status=$?
    if [ "$status" -eq 0 ]; then
      sed -n '/^### Capacity/,$p' "$out/capacity/bench.md" >> "$out/bench.md"
    else
      say "capacity: failed or timed out (exit $status); see gpu-check.log"
      echo "### Capacity: failed or timed out (exit $status), see gpu-check.log" \
        >> "$out/bench.md"
    fi
  fi
fi
say "gpu-check: $((SECONDS - start)) s; report in $out/bench.md"
cat "$out/bench.md"
