"""`Batch`: one step's `(x, y, sample_weight)`, the same type on every backend.

Backend-neutral (no TensorFlow, no JAX): the TensorFlow epoch
(`_tf/epoch.py`) and the JAX epoch (`_jax/epoch.py`) both return it.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Batch(NamedTuple):
    """One step's rows on one replica (or per-replica values over several).

    `y` and `sample_weight` are None when the dataset has none.
    """

    x: Any
    y: Any
    sample_weight: Any
