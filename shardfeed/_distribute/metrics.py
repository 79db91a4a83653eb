"""Reading a model's metrics as plain floats, shared by every engine.

Separation of concerns: its own module so that `engine` (which imports
`horovod` lazily) and `horovod` both import it from here instead of from
each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras


def metric_results(model: keras.Model) -> dict[str, float]:
    """The model's metric results as floats (flattening dict results)."""
    return {name: float(value) for name, value in model.get_metrics_result().items()}
