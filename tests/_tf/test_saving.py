"""Saving and loading: `shardfeed.save_model`, `World.barrier`, loading into a strategy.

The two-worker case (one valid file when every rank saves) is in
test_keras_multiworker.py; here one process, with and without a
MirroredStrategy over logical CPUs.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from _helpers import mirrored_strategy
from _helpers_saving import (
    check_refuses_other_suffixes_before_writing,
    check_sigterm_during_a_save_leaves_no_partial_file,
    check_writes_one_complete_file,
)

import shardfeed
from shardfeed import ShardedResidentDataset
from shardfeed._tf.world import current_world


def _data(rows=200):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) > 0).astype("float32")


def _model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


def test_save_model_writes_one_complete_file_and_leaves_no_partial(tmp_path):
    x, y = _data()
    model = _model()
    shardfeed.fit(model, ShardedResidentDataset(x, y, per_replica_batch_size=20, seed=0), verbose=0)
    check_writes_one_complete_file(shardfeed, model, x, tmp_path)


def test_sigterm_during_a_save_leaves_no_partial_file(tmp_path):
    check_sigterm_during_a_save_leaves_no_partial_file(tmp_path)


def test_save_model_refuses_other_suffixes_before_writing(tmp_path):
    check_refuses_other_suffixes_before_writing(shardfeed, _model(), tmp_path)


def test_barrier_is_a_no_op_with_one_worker():
    world = current_world()
    assert world.is_chief and world.world_size == 1
    assert world.barrier() is None


@pytest.mark.multi_device
def test_a_model_loaded_outside_the_scope_says_how_to_load_it_inside(tmp_path):
    x, y = _data()
    model = _model()
    shardfeed.fit(model, ShardedResidentDataset(x, y, per_replica_batch_size=20, seed=0), verbose=0)
    path = tmp_path / "m.keras"
    shardfeed.save_model(model, path)
    strategy = mirrored_strategy(2)
    with strategy.scope():
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=10, seed=0)
    outside = keras.models.load_model(path)
    with pytest.raises(ValueError) as err:
        shardfeed.evaluate(outside, ds)
    assert "`with world.scope(): model = keras.models.load_model(path)`." in str(err.value)
    # What the message says works, for evaluation and for more training.
    with ds.world.scope():
        inside = keras.models.load_model(path)
    expected = model.evaluate(x, y, verbose=0)
    np.testing.assert_allclose(shardfeed.evaluate(inside, ds), expected, rtol=1e-5)
    shardfeed.fit(inside, ds, epochs=1, verbose=0)
