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
import zipfile

import pytest
from _helpers_keras_workers import classifier_script, run_two_workers

pytestmark = [pytest.mark.multi_process, pytest.mark.slow]

TIMEOUT_S = 300

WORKER = classifier_script(
    '["accuracy"]',
    r"""
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
""",
)


def test_two_workers_save_once_load_in_scope_and_keep_callbacks_on_the_chief(tmp_path):
    output = run_two_workers(WORKER, tmp_path, TIMEOUT_S)
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
