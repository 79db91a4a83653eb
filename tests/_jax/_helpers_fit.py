"""Helpers shared by the JAX tier's `fit`/`evaluate`/`predict` tests (they import
JAX and Keras, so they live apart from `_helpers_jax.py`)."""

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


def train_and_predict(
    shardfeed: Any, save_to: str | None = None, load_options: Any = None
) -> dict[str, Any]:
    """The multi-process check's run (in each worker and in the test): fit on
    sharded rows in the global order with validation, then evaluate and
    predict (and `save_model` to `save_to`); JSON-ready results."""
    x, y = regression_data(1003)
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=8, seed=3,
                                          load_options=load_options)
    model = mlp()
    history = shardfeed.fit(model, ds, epochs=2, verbose=0, validation_data=(x[:200], y[:200]))
    if save_to is not None:
        shardfeed.save_model(model, save_to)
    return {
        "replicas": ds.world.num_replicas_in_sync,
        "history": history.history,
        "evaluate": shardfeed.evaluate(model, x, y, return_dict=True),
        "predict": shardfeed.predict(model, x[:77]).tolist(),
        "weights": [w.tolist() for w in model.get_weights()],
    }


def backup_fit(shardfeed: Any, callbacks: list[Any], epochs: int = 3) -> dict[str, Any]:
    """The resume checks' run (in each worker and in the test): 600 sharded
    rows in the global order, 12 per replica per step, 2 steps per call;
    JSON-ready history and weights."""
    x, y = regression_data(600)
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=12, seed=1)
    model = mlp()
    history = shardfeed.fit(model, ds, epochs=epochs, callbacks=callbacks, verbose=0,
                            options=shardfeed.FitOptions(steps_per_execution=2))
    return {"history": history.history, "weights": [w.tolist() for w in model.get_weights()]}
