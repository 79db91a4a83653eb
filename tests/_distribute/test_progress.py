"""What a worker writes for `shardfeed launch`'s progress watch, in one process.

The launcher's side is tested with fakes (tests/_launch/test_launch.py) and with real
2-worker launches (tests/_launch/test_launch_tf.py); here `fit` and `predict` run in
this process with the launcher's variables set, and the progress file is read
from inside the callbacks.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

import shardfeed
from shardfeed import FitOptions, ShardedResidentDataset
from shardfeed._distribute import progress


@pytest.fixture
def position(tmp_path, monkeypatch):
    """Reads this process's progress file, as `shardfeed launch` would."""
    monkeypatch.setenv("SHARDFEED_READY_DIR", str(tmp_path))
    monkeypatch.setenv("SHARDFEED_RANK", "0")
    saved = list(progress._progress), list(progress._where), list(progress._stopped_at)
    progress._progress[:] = [None, 0]  # as a fresh worker process
    yield lambda: progress.read_position(str(tmp_path / "progress0"))
    if progress._progress[0] not in (None, -1):
        os.close(progress._progress[0])  # type: ignore[arg-type]
    progress._progress[:], progress._where[:], progress._stopped_at[:] = saved


def _model_and_data():
    x = np.arange(64 * 4, dtype=np.float32).reshape(64, 4) / 100.0
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    y = x.sum(1, keepdims=True)
    return model, ShardedResidentDataset(x, y, per_replica_batch_size=8, seed=0)


def test_fit_marks_where_it_stands_and_when_a_callback_stops_it(position):
    model, ds = _model_and_data()
    seen = {}

    class Look(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.setdefault("batch_end", position())
            if batch == 3:
                self.model.stop_training = True

        def on_epoch_end(self, epoch, logs=None):
            seen["epoch_end"] = position()

    shardfeed.fit(
        model, ds, epochs=3, verbose=0, callbacks=[Look()],
        options=FitOptions(steps_per_execution=2, sync_check=False),
    )  # fmt: skip
    # Call 1 is fit's agreement on its arguments, then one per compiled call.
    assert seen["batch_end"] == progress.Position(2, "B", "on_train_batch_end")
    assert seen["epoch_end"] == progress.Position(3, "B", "on_epoch_end", stopped_at=3)
    assert position() == progress.Position(3, "-", "", stopped_at=3)  # back in its own code
    shardfeed.fit(model, ds, epochs=1, verbose=0, options=FitOptions(steps_per_execution=4))
    assert position() == progress.Position(6, "-", "")  # a new fit clears the stop


def test_predict_counts_each_compiled_call(position):
    model, ds = _model_and_data()
    shardfeed.predict(model, ds, options=FitOptions(steps_per_execution=4))
    # The agreement on its arguments, then 8 steps in 2 calls (were not counted).
    assert position() == progress.Position(3, "-", "")
