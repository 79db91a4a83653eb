"""Where a training step's augmentation seed comes from.

Separation of concerns: the dataset holds the user's `augment` function and
`shardfeed._tf.epoch.augmented` applies it with its step's seed (as a
`ResidentEpoch` does); this module gives the compiled
training calls what they need to draw one -- the epoch and the call's first
step as a tensor (a Python int would be baked into the trace and retrace, or
with XLA recompile, per call) and each replica's global id -- and applies
the function to a gathered batch.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from shardfeed._tf import epoch as _epoch
from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._tf.engine import Engine


def position(epoch: int, start: int) -> tf.Tensor:
    """`[epoch, first step of the call]` as one int64 tensor argument."""
    return tf.constant([epoch, start], tf.int64)


def replica_ids(engine: Engine) -> Any:
    """Each local replica's global id, placed on its replica."""
    return engine.distribute(
        [tf.constant(r, tf.int64) for r in engine.world.global_replica_ids]
    )


def augmented(
    dataset: ShardedResidentDataset, x: Any, where: tf.Tensor, step: Any, replica: Any
) -> Any:
    """`dataset.augment(x, seed)` for step `where[1] + step` of epoch
    `where[0]` on `replica`; `x` unchanged without `augment`."""
    return _epoch.augmented(dataset, x, where[0], where[1] + tf.cast(step, tf.int64), replica)
