"""A model's metrics as plain Python values, for every TensorFlow engine (its own module so
`engine` and `horovod` need not import each other)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from keras.src.trainers.trainer import Trainer

if TYPE_CHECKING:
    import keras


def reported_metrics(model: keras.Model, skip_loss: bool) -> list[Any]:
    """The model's metrics, without Keras' loss tracker (`loss`) when
    `skip_loss`: shardfeed's loop logs its own exact loss in its place."""
    tracker = getattr(model, "_loss_tracker", None) if skip_loss else None
    return [m for m in model.metrics if tracker is None or m is not tracker]


def metric_results(model: keras.Model, skip_loss: bool = False) -> dict[str, Any]:
    """The model's metric results (flattening dict results), as Keras' logs
    hold them (`pythonify_logs`): a float for a scalar result, a NumPy array
    for an array result such as `F1Score(average=None)`'s one per class.

    `skip_loss`: without Keras' loss tracker, whose value the caller
    replaces: reading it cost about 0.5 ms of host work per compiled call on
    W2 (a quarter of `fit`'s host work per epoch). A model that
    overrides `get_metrics_result` gets its own, whole.
    """
    own = type(model).get_metrics_result is not Trainer.get_metrics_result
    if own or not skip_loss:
        values = model.get_metrics_result()
    else:
        values = {}
        for metric in reported_metrics(model, skip_loss):
            result = metric.result()
            if isinstance(result, dict):
                values.update(result)
            else:
                values[metric.name] = result
    results = {}
    for name, value in values.items():
        array = np.asarray(value)
        results[name] = float(array) if array.ndim == 0 else array
    return results
