"""`Batch`: one step's `(x, y, sample_weight)`, the same type on every backend."""

from __future__ import annotations

from typing import Any, NamedTuple


class Batch(NamedTuple):
    """One step's rows on one replica (or per-replica values over several).

    `y` and `sample_weight` are None when the dataset has none.
    """

    x: Any
    y: Any
    sample_weight: Any
