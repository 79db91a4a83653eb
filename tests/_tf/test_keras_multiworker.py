"""What Keras users do under `shardfeed launch -n 2 python script.py`: save, load, callbacks.

One launch of two MultiWorkerMirroredStrategy workers, typed the way
horovodrun users type it (a leading `python`), covers: `shardfeed.save_model`
called on every rank leaves one valid file (every rank calling `model.save`
on one path corrupts it); the file loads inside `world.scope()` for
evaluation and more training on every rank; `shardfeed.on_chief` callbacks
run on rank 0 only; `LearningRateScheduler(verbose=1)` acts on both ranks
and prints on rank 0 only. The run has a timeout and the launcher reaps its
workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multi_process, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300

WORKER = r"""
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
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy"])
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
marks = keras.callbacks.LambdaCallback(
    on_epoch_end=lambda e, logs: (out / f"chief_only_ran_on_{world.rank}").touch()
)
rates = keras.callbacks.LearningRateScheduler(lambda e, lr: 0.1 / (e + 1), verbose=1)
shardfeed.fit(model, ds, epochs=2, callbacks=[rates, shardfeed.on_chief(marks)], verbose=0)
lr = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
shardfeed.save_model(model, out / "model.keras")
with world.scope():
    loaded = keras.models.load_model(out / "model.keras")
evaluated = shardfeed.evaluate(loaded, ds, return_dict=True)
shardfeed.fit(loaded, ds, epochs=1, verbose=0)
trained = shardfeed.evaluate(model, ds, return_dict=True)
result = {"lr": lr, "evaluated": evaluated, "trained": trained}
(out / f"result{world.rank}.json").write_text(json.dumps(result))
"""


def test_two_workers_save_once_load_in_scope_and_keep_callbacks_on_the_chief(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "SHARDFEED_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "shardfeed._commands.cli", "launch", "-n", "2"]
    cmd += ["--timeout-s", str(TIMEOUT_S - 30), "python", str(script), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    # One file, complete, and no partial left behind.
    assert sorted(p.name for p in tmp_path.glob("*model*")) == ["model.keras"]
    assert zipfile.ZipFile(tmp_path / "model.keras").testzip() is None
    results = [json.loads((tmp_path / f"result{r}.json").read_text()) for r in (0, 1)]
    assert results[0] == results[1]  # same weights, same global numbers on both ranks
    assert results[0]["lr"] == pytest.approx(0.05)  # the scheduler acted on both ranks
    assert results[0]["evaluated"] == pytest.approx(results[0]["trained"], rel=1e-6)
    assert [p.name for p in tmp_path.glob("chief_only_ran_on_*")] == ["chief_only_ran_on_0"]
    said = [line for line in output.splitlines() if "LearningRateScheduler setting" in line]
    assert len(said) == 2 and all(line.startswith("[rank 0] ") for line in said), said
