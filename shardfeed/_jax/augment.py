"""JAX's half of augmentation: `jax.random`'s draws for the blocks, registered when imported,
each step's key (`augment_key`), and the call that refuses an augment changing Keras state
(`augmented`).

One key per global batch from `(seed, epoch, step)`: each example draws from
its row of one draw over the global batch, so the draws depend neither on the
number of devices nor on `steps_per_execution`, and a resumed run repeats them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import keras

from shardfeed._common import errors as _errors
from shardfeed._data import augment_blocks as _blocks


def augmented(augment: Callable[[Any, Any], Any], x: Any, key: Any) -> Any:
    """`augment(x, key)`, refused when it changes Keras state.

    A Keras preprocessing layer (`RandomFlip`, ...) called as the augment
    draws from its own `SeedGenerator` and advances it: inside the compiled
    loop that leaked a tracer (JAX's `UnexpectedTracerError`, after the
    trace), where the same code trains on TensorFlow. The update is caught
    in a `StatelessScope` and refused, naming the stateless form.

    Raises:
        ValueError: When `augment` assigned a Keras variable.
    """
    with keras.StatelessScope() as scope:
        out = augment(x, key)
    if scope.state_mapping:
        raise ValueError(
            _errors.message(
                "On JAX an `augment` must draw only from the key it is given: the "
                "compiled loop cannot advance a Keras layer's own seed generator (a "
                "preprocessing layer called as `layer(x, training=True)` does).",
                f"augment={augment!r} updated {len(scope.state_mapping)} Keras variable(s)",
                "Draw from the key: `t = layer.get_random_transformation(x, training=True, "
                "seed=jax.random.key_data(key)); x = layer.transform_images(x, t, "
                "training=True)`, or use `shardfeed.augment`'s blocks, or put the layer "
                "inside the model.",
            )
        )
    return out


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
