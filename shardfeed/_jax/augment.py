"""JAX's half of augmentation: `jax.random`'s draws for the blocks, registered when imported,
and each step's key (`augment_key`).

One key per global batch from `(seed, epoch, step)`: each example draws from
its row of one draw over the global batch, so the draws depend neither on the
number of devices nor on `steps_per_execution`, and a resumed run repeats them.
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
