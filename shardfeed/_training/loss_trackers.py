"""Keras' per-output loss logs (`a_loss`, `b_loss`) as its TensorFlow trainer computes them.

Keras' `CompileLoss` updates each output's `Mean` tracker with the batch's
loss and `sample_weight=y_pred.shape[0]`, the *static* batch size. Keras'
TensorFlow trainer traces its step on tf.data batches whose static batch size
is unknown, so that weight is None there: each batch's loss counts once, a
short last batch as much as a full one (its eager steps, `run_eagerly=True`,
see the real size and weigh by rows). The total `loss` is not affected (its
tracker takes the dynamic batch size). shardfeed's traced batches have static
shapes, which made the weight the batch's rows: per-output logs 0.2-5% off
Keras' wherever batches differ in size. `keras_weights` gives the trackers
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
