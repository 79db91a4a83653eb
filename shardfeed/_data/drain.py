"""Draining a `tf.data` pipeline of single rows into host chunks, in order.

Separation of concerns: the TF-ecosystem sources (`tfdata`, `tfrecord`) build
pipelines; this module reads rows `[start, stop)` from one, continuing the
previous read's iterator when a read continues it (the storage reads a
column chunk after chunk), so a pipeline runs once per column, not once per
chunk. It never imports TensorFlow itself: it only calls the pipeline's
`.batch` and the batches' `.numpy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from shardfeed._common import errors as _errors

# Rows per host batch while draining: about this many bytes at once.
_DRAIN_BYTES = 4 * 2**20


class Cursor:
    """Reads rows of `make(skip)` (a dataset of single rows) sequentially;
    a read that continues the previous one continues its iterator.

    Args:
        make: Builds the dataset of rows starting at row `skip`.
        row_bytes: Bytes per row (sizes the host batches).
        source: Where the rows come from, for messages.
    """

    def __init__(self, make: Callable[[int], Any], row_bytes: int, source: str) -> None:
        self._make = make
        self._batch = max(1, _DRAIN_BYTES // max(1, row_bytes))
        self._source = source
        self._position: int | None = None
        self._iterator: Any = None
        self._left: np.ndarray | None = None

    def read(self, start: int, stop: int, out: np.ndarray) -> None:
        if self._position != start or self._left is None:
            self._iterator = iter(self._make(start).batch(self._batch))
            self._left = out[:0]
        filled = 0
        while filled < stop - start:
            if not len(self._left):
                try:
                    self._left = next(self._iterator).numpy()
                except StopIteration:
                    self._position = None
                    raise ValueError(
                        _errors.message(
                            "A tf.data source must hold the rows it was declared with.",
                            f"{self._source} ended after {start + filled} rows, "
                            f"{stop} were expected",
                            "Pass the right `num_rows` (or none, for a dataset of known "
                            "cardinality).",
                        )
                    ) from None
            take = min(stop - start - filled, len(self._left))
            out[filled : filled + take] = self._left[:take]
            self._left = self._left[take:]
            filled += take
        self._position = stop

    def close(self) -> None:
        self._iterator, self._left, self._position = None, None, None
