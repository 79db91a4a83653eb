"""Keras scripts as users write them, run on two workers under `shardfeed launch -n 2
python script.py`: shared by `tests/_tf/test_keras_multiworker.py` and
`tests/_training/test_keras_contract.py` (no TensorFlow import here; the workers
import it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Every rank builds the same seeded binary classifier and its dataset; `METRICS`
# is the model's metrics. What follows trains, saves and writes results under `out`.
_PRELUDE = r"""
import json, sys
from pathlib import Path
import keras, numpy as np, shardfeed

out = Path(sys.argv[1])
world = shardfeed.init()
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 4)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
with world.scope():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=METRICS)
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
"""


def classifier_script(metrics: str, body: str) -> str:
    """The worker script: the shared classifier compiled with `metrics` (Python source),
    then `body`."""
    return _PRELUDE.replace("METRICS", metrics) + body.lstrip("\n")


def run_two_workers(script: str, tmp_path: Path, timeout_s: int) -> str:
    """Runs `script` on two workers, typed the way horovodrun users type it (a leading
    `python`), with `tmp_path` as its argument; asserts the launch succeeded and returns
    its output."""
    path = tmp_path / "worker.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "SHARDFEED_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "shardfeed._commands.cli", "launch", "-n", "2"]
    cmd += ["--timeout-s", str(timeout_s - 30), "python", str(path), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return output
