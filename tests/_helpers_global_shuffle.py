"""The rows and model of the global-shuffle tests, in one process
(`tests/_tf/test_global_shuffle.py`) and on workers (`_global_shuffle_worker.py`):
a dict input with a uint8 column, sample weights. TensorFlow only."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf


def data(rows: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """`rows` rows: x = {"a": float32 (6), "b": uint8 (2)}, y, sample weights."""
    rng = np.random.default_rng(0)
    x = {
        "a": rng.normal(size=(rows, 6)).astype("float32"),
        "b": rng.integers(0, 256, size=(rows, 2)).astype("uint8"),
    }
    y = (x["a"] @ rng.normal(size=(6, 1))).astype("float32")
    w = rng.uniform(0.5, 1.5, size=rows).astype("float32")
    return x, y, w


def scale(x):
    """The datasets' transform: "b" to float32 in [0, 1]."""
    return {"a": x["a"], "b": tf.cast(x["b"], "float32") / 255.0}


def build_model() -> keras.Model:
    """The seeded, compiled model of `data`'s rows (build it in the strategy's scope)."""
    keras.utils.set_random_seed(7)
    a, b = keras.Input((6,), name="a"), keras.Input((2,), name="b")
    h = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([a, b]))
    built = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(h))
    built.compile(optimizer="adam", loss="mse", weighted_metrics=["mae"])
    return built
