"""Draining a `tf.data` pipeline of single rows into host chunks, in order (`Cursor`).

A read that continues the previous one continues its iterator, so a pipeline
runs once, not once per chunk, and every leaf of an element comes from the same
pass. Never imports TensorFlow: it calls the pipeline's `.batch` and `.numpy`.
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

    Each element holds `num_leaves` leaves (a tuple when more than one). One
    pass feeds every leaf: rows drained for one leaf wait for the others
    until they read them, so readers that take every leaf's rows chunk by
    chunk (the storage's upload) keep about one chunk per leaf on the host.

    Args:
        make: Builds the dataset of rows starting at row `skip`.
        row_bytes: Bytes per row, all leaves together (sizes the host batches).
        source: Where the rows come from, for messages.
        num_leaves: Leaves per element.
        on_pass: Called before each new pass over the pipeline (may raise:
            see `tfdata`, which refuses a second pass over a pipeline that
            reshuffles on every pass).
    """

    def __init__(
        self,
        make: Callable[[int], Any],
        row_bytes: int,
        source: str,
        num_leaves: int = 1,
        on_pass: Callable[[], None] | None = None,
    ) -> None:
        self._make = make
        self._batch = max(1, _DRAIN_BYTES // max(1, row_bytes))
        self._source = source
        self._num_leaves = num_leaves
        self._on_pass = on_pass
        self._iterator: Any = None
        self._position = 0  # rows the iterator has yielded (a global row index)
        # Per leaf: the drained rows it has not read yet, from row `_first[leaf]`.
        self._pending: list[list[np.ndarray]] = []
        self._first: list[int] = []

    def read(self, start: int, stop: int, out: np.ndarray, leaf: int = 0) -> None:
        if self._iterator is None or start < self._first[leaf]:
            if self._on_pass is not None:
                self._on_pass()
            self._iterator = iter(self._make(start).batch(self._batch))
            self._position = start
            self._pending = [[] for _ in range(self._num_leaves)]
            self._first = [start] * self._num_leaves
        while self._position < stop:
            try:
                batch = next(self._iterator)
            except StopIteration:
                position = self._position
                self.close()
                raise ValueError(
                    _errors.message(
                        "A tf.data source must hold the rows it was declared with.",
                        f"{self._source} ended after {position} rows, {stop} were expected",
                        "Pass the right `num_rows` (or none, for a dataset of known "
                        "cardinality).",
                    )
                ) from None
            parts = batch if self._num_leaves > 1 else (batch,)
            for pending, part in zip(self._pending, parts, strict=True):
                pending.append(part.numpy())
            self._position += len(self._pending[0][-1])
        self._take(leaf, start, stop, out)

    def _take(self, leaf: int, start: int, stop: int, out: np.ndarray) -> None:
        """Moves rows `[start, stop)` of `leaf` into `out`, dropping earlier ones."""
        pending, row, filled = self._pending[leaf], self._first[leaf], 0
        while row < stop:
            rows = pending[0]
            lo, hi = max(0, start - row), min(len(rows), stop - row)
            if lo < hi:
                out[filled : filled + hi - lo] = rows[lo:hi]
                filled += hi - lo
            if hi < len(rows):
                pending[0] = rows[hi:]
                row += hi
                break
            pending.pop(0)
            row += len(rows)
        self._first[leaf] = row

    def close(self) -> None:
        self._iterator, self._pending, self._first = None, [], []
