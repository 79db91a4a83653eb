"""Helpers shared by the resume tests of both backends (`tests/_training/test_resume.py`
on TensorFlow, `tests/_jax/test_backup_jax.py` on JAX; the custom loops' iterator
states in `tests/_tf/test_iterator.py` and `tests/_jax/test_iterator_jax.py`):
Keras, pytest and the standard library only."""

from __future__ import annotations

import json

import keras
import pytest


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


def assert_bad_states_refused(iterator, good, *, steps, num_rows):
    """`iterator.set_state` refuses, naming the fix, a state without every key, a step
    past the epoch (its epochs have `steps` steps), a float epoch and another
    dataset's row count (it has `num_rows`); a refused state moves nothing. `good`
    is the iterator's state."""
    with pytest.raises(ValueError) as err:
        iterator.set_state({"epoch": 0})
    assert str(err.value) == (
        "The state must be a dict with exactly the keys ['epoch', 'step', 'seed', "
        "'num_rows', 'global_batch_size']. Received: state keys=['epoch']. Pass what "
        "`ResidentIterator.get_state()` returned."
    )
    with pytest.raises(ValueError) as err:
        iterator.set_state({**good, "step": steps})
    assert str(err.value) == (
        f"`state['step']` must be an integer in [0, {steps - 1}]. Received: "
        f"state['step']={steps}. Pass a saved state of this dataset (its epochs have "
        f"{steps} steps)."
    )
    with pytest.raises(ValueError) as err:
        iterator.set_state({**good, "epoch": 1.0})
    assert str(err.value) == (
        "`state['epoch']` must be an integer in [0, 4611686018427387904]. Received: "
        "state['epoch']=1.0. Pass a saved state."
    )
    with pytest.raises(ValueError) as err:
        iterator.set_state({**good, "num_rows": num_rows + 1})
    assert str(err.value) == (
        "The state is a position in another dataset: its seed, rows and global batch must "
        f"be this dataset's. Received: state['num_rows']={num_rows + 1}, this dataset's "
        f"num_rows={num_rows}. Restore into an iterator of the dataset the state was saved "
        "from (same rows, seed and global batch)."
    )
    assert iterator.get_state() == good  # a refused state moves nothing
