"""JAX's half of augmentation: the blocks' draws and the key of each step.

The blocks themselves are backend-neutral (`_data/augment_blocks.py`); this
module gives them `jax.random`'s draws on a key, registered for the JAX
backend when it is imported, and gives the JAX loop (`epoch.BatchFn`) the key
of each step.

Keys. `augment_key` folds `(dataset seed, epoch, step)` into one key for the
step's global batch (`[global_batch_size, ...]`, sharded along rows): each
example draws its own transform from its row of one draw over the global
batch, so replicas draw differently without folding the replica in, and the
draws do not depend on the number of devices or on `steps_per_execution`
(JAX's partitionable threefry draws the same numbers however the batch is
sharded). A rerun repeats; a run resumed at an epoch or step draws what an
uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from shardfeed._data import augment_blocks as _blocks


def augment_key(seed: int, epoch: Any, step: Any) -> jax.Array:
    """The key `augment(x, key)` gets for `step` of `epoch`: from `(seed,
    epoch, step)` (one key per global batch; the seed's 64 bits folded in)."""
    key = jax.random.fold_in(jax.random.key(seed % 2**32), seed // 2**32)
    return jax.random.fold_in(jax.random.fold_in(key, epoch), step)


class _JaxRandom:
    """`augment_blocks.Random` on `jax.random` (a typed key or a raw `uint32[2]` one)."""

    def bernoulli(self, seed: Any, shape: Sequence[Any], p: float) -> jax.Array:
        return jax.random.bernoulli(seed, p, tuple(shape))

    def uniform(self, seed: Any, shape: Sequence[Any], low: float, high: float) -> jax.Array:
        return jax.random.uniform(seed, tuple(shape), jnp.float32, low, high)

    def integers(self, seed: Any, shape: Sequence[Any], low: int, high: int) -> jax.Array:
        return jax.random.randint(seed, tuple(shape), low, high, jnp.int32)

    def normal(self, seed: Any, shape: Sequence[Any], stddev: float, dtype: str) -> jax.Array:
        return jax.random.normal(seed, tuple(shape), dtype) * jnp.asarray(stddev, dtype)

    def split(self, seed: Any, num: int) -> jax.Array:
        return jax.random.split(seed, num)


_blocks.register_random("jax", _JaxRandom())
