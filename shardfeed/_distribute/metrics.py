"""Reading a model's metrics as plain Python values, shared by every engine.

Separation of concerns: its own module so that `engine` (which imports
`horovod` lazily) and `horovod` both import it from here instead of from
each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import keras


def metric_results(model: keras.Model) -> dict[str, Any]:
    """The model's metric results (flattening dict results), as Keras' logs
    hold them (`pythonify_logs`): a float for a scalar result, a NumPy array
    for an array result such as `F1Score(average=None)`'s one per class."""
    results = {}
    for name, value in model.get_metrics_result().items():
        array = np.asarray(value)
        results[name] = float(array) if array.ndim == 0 else array
    return results
