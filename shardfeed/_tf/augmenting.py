"""A compiled training call's augmentation: the epoch and first step as tensors (a Python int
would retrace per call), each replica's global id, and `augment` applied to a gathered batch."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from shardfeed._tf import epoch as _epoch
from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._tf.engines.engine import Engine


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
