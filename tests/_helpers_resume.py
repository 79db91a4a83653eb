"""Helpers shared by the resume tests of both backends (`tests/_training/test_resume.py`
on TensorFlow, `tests/_jax/test_backup_jax.py` on JAX): Keras and the
standard library only."""

from __future__ import annotations

import json

import keras


class Preempt(keras.callbacks.Callback):
    """Raises after the call ending at `batch` of `epoch` (after any backup)."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.epoch, self.batch, self.current = epoch, batch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.current, batch) == (self.epoch, self.batch):
            raise KeyboardInterrupt("preempted")


def edit_state(**changes):
    """An edit of the state file's `state` object: nested names joined by
    `__` (`cursor__step`), the value `DELETE` to delete the field."""

    def edit(backup):
        path = backup / "shardfeed_state.json"
        saved = json.loads(path.read_text())
        for name, value in changes.items():
            *parents, leaf = ["state", *name.split("__")]
            obj = saved
            for p in parents:
                obj = obj[p]
            if value is DELETE:
                del obj[leaf]
            else:
                obj[leaf] = value
        path.write_text(json.dumps(saved))

    return edit


DELETE = object()
