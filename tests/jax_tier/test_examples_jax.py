"""`examples/train.py`, unchanged, on Keras' JAX backend without TensorFlow: on one
device, on two devices of one process, and as two `jax.distributed` workers under
`shardfeed launch -n 2` (the TensorFlow tier runs the same script in
tests/test_examples.py and tests/test_multiworker.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from _helpers_jax import REPO, SUBPROCESS_TIMEOUT_S, jax_env

ARGS = ["--rows", "2000", "--epochs", "2", "--per-replica-batch-size", "32"]


def _train(tmp_path, name, prefix, devices, extra=()):
    """Runs examples/train.py (under `prefix`, e.g. a launcher) with `devices` CPU
    devices per process; returns its output and each rank's saved results."""
    out = tmp_path / name
    env = jax_env({"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"})
    env = {k: v for k, v in env.items() if not k.startswith(("TF_CONFIG", "SHARDFEED_"))}
    cmd = [*prefix, str(REPO / "examples" / "train.py"), *ARGS, *extra, "--out", str(out)]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=2 * SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = sorted(tmp_path.glob(f"{name}.rank*.npz"))
    return proc.stdout + proc.stderr, [dict(np.load(p)) for p in ranks]


@pytest.mark.multi_process
def test_train_py_runs_unchanged_on_one_device_two_devices_and_two_workers(tmp_path):
    python = [sys.executable]
    out1, (one,) = _train(tmp_path, "one", python, devices=1)
    assert "engine=jax workers=1 replicas=1" in out1
    out2, (two,) = _train(tmp_path, "two", python, devices=2)
    assert "engine=jax workers=1 replicas=2" in out2
    launch = [sys.executable, "-m", "shardfeed._commands.cli", "launch", "-n", "2",
              "--timeout-s", "200", "python"]
    out3, workers = _train(tmp_path, "workers", launch, devices=1)
    assert "engine=jax workers=2 replicas=2" in out3
    assert len(workers) == 2 and all(int(w["num_replicas"]) == 2 for w in workers)
    # Two workers of one device each train as one process with two devices:
    # the same global batches, the same steps.
    for rank in workers:
        np.testing.assert_allclose(rank["weights"], two["weights"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rank["loss"], two["loss"], rtol=1e-5)
        np.testing.assert_allclose(rank["predictions"], two["predictions"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(workers[0]["weights"], workers[1]["weights"])
    # One replica trains with half the global batch: it learns, on its own path.
    assert one["loss"][-1] < one["loss"][0] and np.isfinite(one["weights"]).all()
    assert one["predictions"].shape == two["predictions"].shape == (2000, 1)
