"""Shared helpers of the JAX-backend tests (run with `KERAS_BACKEND=jax`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import keras
import numpy as np

from shardfeed._jax import world as _world


@contextlib.contextmanager
def replicas(n: int) -> Iterator[_world.World]:
    """The first `n` local devices as the world (what `shardfeed.init` sets),
    restored afterwards."""
    saved = list(_world._initialized)
    world = _world.World(0, 1, 0, tuple(jax.devices()[:n]))
    _world.remember_initialized(world)
    try:
        yield world
    finally:
        _world._initialized[:] = saved


def regression_data(rows: int, features: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = (x @ rng.normal(size=(features, 1)) + 0.1 * rng.normal(size=(rows, 1))).astype("float32")
    return x, y


def mlp(features: int = 8, seed: int = 1, **compile_kwargs: Any) -> keras.Model:
    """A small compiled MLP with the same initial weights for the same seed."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    compile_kwargs.setdefault("optimizer", keras.optimizers.Adam(1e-2))
    compile_kwargs.setdefault("loss", "mse")
    compile_kwargs.setdefault("metrics", ["mae"])
    model.compile(**compile_kwargs)
    return model


def max_weight_diff(a: keras.Model, b: keras.Model) -> float:
    pairs = zip(a.get_weights(), b.get_weights(), strict=True)
    return max(float(np.abs(u - v).max()) for u, v in pairs)


def assert_history_close(ours: dict[str, list[float]], keras_: dict[str, list[float]]) -> None:
    assert sorted(ours) == sorted(keras_)
    for name in keras_:
        np.testing.assert_allclose(ours[name], keras_[name], rtol=1e-5, err_msg=name)
