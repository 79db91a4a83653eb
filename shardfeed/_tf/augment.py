"""TensorFlow's half of augmentation: `tf.random.stateless_*` draws for the blocks,
registered when imported, and each step's seed (`step_seed`).

`step_seed` folds `(seed, epoch, step, replica)`: replicas draw differently, a
rerun or a resumed run repeats, and the draws do not depend on `steps_per_execution`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from shardfeed._data import augment_blocks as _blocks

# Keeps augmentation draws apart from the epoch permutations, which are
# seeded by (seed, epoch) too.
_DOMAIN = 0x61756720  # "aug "


def step_seed(seed: int, epoch: tf.Tensor, step: tf.Tensor, replica: tf.Tensor) -> tf.Tensor:
    """The seed of one training step on one replica.

    Args:
        seed: The dataset's seed.
        epoch: Epoch number (a tensor: a Python int would be baked into the trace).
        step: Step within the epoch (a tensor).
        replica: Global replica id (a tensor).

    Returns:
        A `[2]` int64 seed for `tf.random.stateless_*` ops.
    """
    key = tf.constant([seed, _DOMAIN], tf.int64)
    for data in (epoch, step, replica):
        key = fold_in(key, data)
    return key


def fold_in(seed: tf.Tensor, data: Any) -> tf.Tensor:
    """A new `[2]` seed from `seed` and an integer (a tensor or an int)."""
    return tf.random.experimental.stateless_fold_in(seed, tf.cast(data, tf.int64))


class _TensorFlowRandom:
    """`augment_blocks.Random` on `tf.random.stateless_*`."""

    def bernoulli(self, seed: Any, shape: Sequence[Any], p: float) -> tf.Tensor:
        return tf.random.stateless_uniform(shape, seed) < p

    def uniform(self, seed: Any, shape: Sequence[Any], low: float, high: float) -> tf.Tensor:
        return tf.random.stateless_uniform(shape, seed, minval=low, maxval=high)

    def integers(self, seed: Any, shape: Sequence[Any], low: int, high: int) -> tf.Tensor:
        return tf.random.stateless_uniform(shape, seed, minval=low, maxval=high, dtype=tf.int32)

    def normal(self, seed: Any, shape: Sequence[Any], stddev: float, dtype: str) -> tf.Tensor:
        return tf.random.stateless_normal(shape, seed, stddev=stddev, dtype=dtype)

    def split(self, seed: Any, num: int) -> tf.Tensor:
        return tf.random.experimental.stateless_split(seed, num)


_blocks.register_random("tensorflow", _TensorFlowRandom())
