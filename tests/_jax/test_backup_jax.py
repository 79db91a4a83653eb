"""`keras.callbacks.BackupAndRestore` under `fit` on JAX: a resume equals an uninterrupted run.

A run is "preempted" by an exception from a callback after a backup was
written; a fresh model and dataset with the same backup directory then resume
it, inside the epoch (`save_freq` an int) or at its start (`"epoch"`). The
backup, its files and the state's checks are the TensorFlow backend's
(`_training/backup.py`, `resume.py`); the metric variables (the loss tracker
among them) are part of the state, so the resumed epoch's logs cover the
whole epoch.
"""

from __future__ import annotations

import json
import os
import shutil

import keras
import numpy as np
import pytest
from _helpers_fit import mlp, regression_data, replicas
from _helpers_resume import Preempt, edit_state

from shardfeed import FitOptions, ShardedResidentDataset, fit

ROWS = 600  # global batch 50: 12 steps per epoch, 2 per call


def _fit(devices, callbacks, epochs=3, shuffle=True, **kwargs):
    x, y = regression_data(ROWS)
    with replicas(devices):
        # Sharded rows in the global order: the exchange runs every epoch
        # (rows in order: once).
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=50 // devices, seed=1,
                                    shuffle=shuffle)
        model = mlp()
        history = fit(model, ds, epochs=epochs, callbacks=callbacks, verbose=0,
                      options=FitOptions(steps_per_execution=2), **kwargs)
    return model, history


def _assert_same(ours, theirs, history, expected, rtol):
    for a, b in zip(ours.get_weights(), theirs.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-7)
    for a, b in zip(ours.optimizer.variables, theirs.optimizer.variables, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=1e-7)
    assert sorted(history) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(history[name], expected[name], rtol=rtol, err_msg=name)


@pytest.mark.parametrize(
    ("before", "after", "shuffle"),
    [
        (1, 1, True),
        (2, 2, True),
        (2, 1, True),  # another number of replicas: the global batch and order are kept
        (2, 1, False),  # rows in order follow one replica's batches on any number
    ],
)
def test_backup_every_n_steps_resumes_at_the_exact_step(tmp_path, before, after, shuffle):
    """Backups every 4 steps; preempted after step 10 of epoch 1, resumed
    from step 8: weights, optimizer state and epoch 1's logs equal an
    uninterrupted run's."""
    straight, straight_history = _fit(after, [], shuffle=shuffle)
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        _fit(before, [keras.callbacks.BackupAndRestore(backup, save_freq=4), Preempt(1, 9)],
             shuffle=shuffle)
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(b))
    resumed, history = _fit(
        after, [keras.callbacks.BackupAndRestore(backup, save_freq=4), record], shuffle=shuffle
    )
    # Resumed inside epoch 1 at step 8: calls end at steps 9 and 11, then epoch 2.
    assert seen[:3] == [9, 11, 1]
    expected = {k: v[1:] for k, v in straight_history.history.items()}
    # The same devices: the same programs on the same values. Others: N x b vs 1 x N*b.
    _assert_same(resumed, straight, history.history, expected, 1e-6 if before == after else 1e-5)
    assert not (tmp_path / "backup").exists()  # deleted at the end, as Keras does


def test_an_epoch_backup_resumes_at_the_next_epoch(tmp_path):
    straight, straight_history = _fit(2, [])
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        _fit(2, [keras.callbacks.BackupAndRestore(backup), Preempt(1, 5)])
    seen = []
    record = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: seen.append(e))
    resumed, history = _fit(2, [keras.callbacks.BackupAndRestore(backup), record])
    assert seen == [1, 2]  # epoch 1 reruns from its start, as Keras' own callback
    expected = {k: v[1:] for k, v in straight_history.history.items()}
    _assert_same(resumed, straight, history.history, expected, 1e-6)


def test_the_users_callback_object_holds_keras_state(tmp_path):
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), save_freq=4,
                                              delete_checkpoint=False)
    model, _ = _fit(1, [backup], epochs=1)
    assert backup.model is model
    assert backup._current_epoch == 1
    assert (tmp_path / "backup" / "shardfeed_state.json").exists()


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    backup = tmp_path_factory.mktemp("interrupted") / "backup"
    with pytest.raises(KeyboardInterrupt):
        _fit(1, [keras.callbacks.BackupAndRestore(str(backup), save_freq=4), Preempt(1, 9)])
    return backup


def _weights_outside(backup):
    path = backup / "shardfeed_state.json"
    saved = json.loads(path.read_text())
    saved["weights"] = "../outside/ckpt-0.weights.h5"
    path.write_text(json.dumps(saved))


def _weights_truncated(backup):
    weights = backup / json.loads((backup / "shardfeed_state.json").read_text())["weights"]
    weights.write_bytes(weights.read_bytes()[:1000])  # was h5py's raw OSError


def _truncated(backup):
    path = backup / "shardfeed_state.json"
    path.write_bytes(path.read_bytes()[:40])


def _fifo(backup):
    # Its read waited for a writer forever.
    path = backup / "shardfeed_state.json"
    path.unlink()
    os.mkfifo(path)


# The TensorFlow backend's cases (tests/_training/test_resume.py), a few of each kind.
STATE_ERRORS = {
    "step 10**12": (
        edit_state(cursor__step=10**12),
        "A shardfeed resume state's `cursor.step` must be in [0, 12]: fit epoch 1 is "
        "steps [0, 12) of pass 1 over the data (12 steps per pass, steps_per_epoch=None). "
        "Received: BACKUP/shardfeed_state.json: state.cursor.epoch=1, "
        "state.cursor.step=1000000000000.",
    ),
    "another data_epoch": (
        edit_state(cursor__data_epoch=5),
        "A shardfeed resume state's `cursor.data_epoch` and `cursor.data_step` must be "
        "where the fit's cursor lies in the data, pass 1 step 8",
    ),
    "metric of another shape": (
        edit_state(metrics=[0.0, 0.0, [1.0], 1.0]),
        "A shardfeed resume state's `metrics[2]` must hold the value of metric variable",
    ),
    "another order": (
        edit_state(order="numpy-pcg64-1+tensorflow-stream-chunks"),
        "Resuming inside an epoch needs that epoch's order again; the checkpoint was "
        "written under another epoch order",
    ),
    "truncated": (_truncated, "A shardfeed backup's shardfeed_state.json must be JSON."),
    "weights truncated": (
        _weights_truncated,
        "A shardfeed backup's weights file must be the whole file `fit` wrote, for this model. "
        "Received: BACKUP/ckpt-",
    ),
    "state file a FIFO": (
        _fifo,
        "A shardfeed backup's shardfeed_state.json must be a regular file (not a link, FIFO "
        "or device). Received: BACKUP/shardfeed_state.json: is a FIFO (named pipe), not a "
        "regular file.",
    ),
    "weights ../": (
        _weights_outside,
        "A shardfeed backup's shardfeed_state.json must name one of the weights files",
    ),
}


@pytest.mark.parametrize("case", sorted(STATE_ERRORS))
@pytest.mark.timeout(120)  # the FIFO's read hung
def test_an_edited_backup_is_refused_before_any_step(interrupted, tmp_path, case):
    backup = tmp_path / "backup"
    shutil.copytree(interrupted, backup)
    edit, message = STATE_ERRORS[case]
    edit(backup)
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(b))
    with pytest.raises(ValueError) as raised:
        _fit(1, [keras.callbacks.BackupAndRestore(str(backup)), record])
    assert not seen
    assert str(raised.value).replace(str(backup), "BACKUP").startswith(message)
