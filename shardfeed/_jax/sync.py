"""`sync_model` on JAX: `_common/model_sync.py` with the JAX `World`."""

from __future__ import annotations

import keras

from shardfeed._common.model_sync import model_variables, sync_variables
from shardfeed._jax.world import current_world


def sync_model(model: keras.Model) -> int:
    """Gives every process rank 0's weights, for a training loop of your own.

    The same arguments, result and errors as the TensorFlow backend's
    `shardfeed.sync_model` (see its documentation). Call it on every process
    after building the model and its optimizer, before your loop reads
    `model.trainable_variables`, `non_trainable_variables` and
    `optimizer.variables` into its state. Models built after
    `shardfeed.init()` already start alike unless Keras was seeded per
    process (`init` agrees Keras' seed, `_jax/seeding.py`); a model built
    before `init()`, or seeded per rank, needs it.
    """
    return sync_variables(current_world(), model_variables(model))
