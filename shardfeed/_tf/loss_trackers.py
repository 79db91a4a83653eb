"""Keras' per-output loss logs (`a_loss`, `b_loss`) as its TensorFlow trainer computes them.

Keras' traced steps weigh each output's loss by the *static* batch size, None
on tf.data batches: each batch counts once. Ours have static shapes, which
weighed by rows (0.2-5% off Keras'), so `keras_weights` gives the trackers
Keras' weight while a compiled call is traced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras


@contextlib.contextmanager
def keras_weights(model: keras.Model) -> Iterator[None]:
    """Inside the block, `model`'s per-output loss trackers ignore a static
    (Python int) batch size given as their weight, as in Keras' traced steps."""
    trackers = list(getattr(getattr(model, "_compile_loss", None), "metrics", None) or [])
    # A nested trace (an `evaluate` in a callback) finds them patched already.
    patched = [t for t in trackers if "update_state" not in vars(t)]
    for tracker in patched:
        object.__setattr__(tracker, "update_state", _unsized(tracker.update_state))
    try:
        yield
    finally:
        for tracker in patched:
            object.__delattr__(tracker, "update_state")


def _unsized(update_state: Any) -> Any:
    def update(values: Any, sample_weight: Any = None) -> Any:
        if isinstance(sample_weight, int):  # `shape[0]` known while tracing
            sample_weight = None
        return update_state(values, sample_weight=sample_weight)

    return update
