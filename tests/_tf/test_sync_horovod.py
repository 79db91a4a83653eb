"""The replica sync check under Horovod catches an optimizer step without aggregation.

`horovod.tensorflow.keras.DistributedOptimizer` under Keras 3 runs but does not
average gradients: ranks diverge while the loss looks fine. Here the engine's
allreduce is skipped on purpose (each rank applies its own gradients); the
end-of-epoch check must stop `fit` naming the variable and the rank. The same
script with the allreduce passes the check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers_horovod import NO_HOROVOD

pytestmark = [pytest.mark.multi_process, pytest.mark.horovod, pytest.mark.slow, NO_HOROVOD]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300

WORKER = r"""
import sys
import keras, numpy as np
import shardfeed

world = shardfeed.init()
if sys.argv[1] == "broken":
    from shardfeed._tf.engines.horovod import HorovodEngine
    HorovodEngine.reduce_gradients = lambda self, grads, *_: grads  # no allreduce
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="out")], name="net")
model.compile(optimizer="sgd", loss="mse")
ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
shardfeed.fit(model, ds, epochs=2, verbose=0)
print("TRAINED", world.rank)
"""


def _run(tmp_path, mode):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    cmd = [
        # The CLI module itself: a venv's console script may predate this checkout.
        sys.executable, "-m", "shardfeed._commands.cli", "launch", "--num-workers", "2",
        "--engine", "horovod", "--timeout-s", str(TIMEOUT_S - 30), str(script), mode,
    ]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def test_an_optimizer_step_without_allreduce_is_caught(tmp_path):
    proc = _run(tmp_path, "broken")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert (
        "Every replica must hold the same weights: data-parallel training applies the same "
        "aggregated gradients on every replica. Received: variable net/out/kernel differs on "
        "replicas [1] from replica 0 (2 of 2 trainable variables differ) after epoch 0, step 8."
    ) in output
    assert "TRAINED" not in output


def test_ranks_with_allreduce_pass_the_check(tmp_path):
    proc = _run(tmp_path, "ok")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "TRAINED 0" in output and "TRAINED 1" in output
