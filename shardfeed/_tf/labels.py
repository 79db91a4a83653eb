"""A label column's `(min, max, fractional)` per replica on TensorFlow: resident rows reduced
on their device (a few scalars come back), streamed rows read from the source in chunks."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from shardfeed._data import sources as _sources
from shardfeed._tf import storage as _storage


def store_label_stats(
    store: _storage.ReplicaStore,
    col: _sources.Column,
    column: int,
    ignore: int | None,
    *,
    streamed: bool,
    chunk_bytes: int,
) -> np.ndarray:
    """`np.array([min, max, fractional])` of column `column` over one replica's rows.

    Args:
        store: The replica's storage.
        col: The column's source (read in chunks when `streamed`).
        column: Its index among the dataset's columns (its variable in `store`).
        ignore: A value that counts as 0 (a loss's `ignore_class`).
        streamed: The rows are not resident: read them from `col`.
        chunk_bytes: Bytes per read when streamed.

    Returns:
        float64 `[min, max, fractional]` (`fractional` 1.0 if some value is
        not a whole number or NaN); `[inf, -inf, 0]` for a replica without rows.

    Example:
        >>> store_label_stats(ds.stores[0], ds.columns.columns[1], 1, None,
        ...                   streamed=False, chunk_bytes=2**20)
        array([0., 9., 0.])
    """
    if store.num_rows == 0:
        return np.array([np.inf, -np.inf, 0.0])
    if streamed:
        rows = max(1, chunk_bytes // max(1, col.row_bytes))
        parts = [
            _value_stats(col.read(start, min(store.row_stop, start + rows)), ignore)
            for start in range(store.row_start, store.row_stop, rows)
        ]
        lows, highs, fractional = zip(*parts, strict=True)
        return np.array([min(lows), max(highs), float(any(fractional))])
    variable = store.variables[column]
    with tf.device(store.device):
        # A replica without rows holds one zero row; others hold exactly theirs.
        values = variable if variable.shape[0] == store.num_rows else variable[: store.num_rows]
        return np.array([float(v) for v in _value_stats(values, ignore)])


def _value_stats(values: Any, ignore: int | None) -> tuple[Any, Any, Any]:
    """`(min, max, any fractional or NaN)` of a NumPy array or a tensor (reduced
    where it lives)."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind == "b":
            values = values.astype(np.int8)
        if ignore is not None and np.can_cast(np.min_scalar_type(ignore), values.dtype):
            values = np.where(values == ignore, 0, values)
        fractional = values.dtype.kind in "fc" and bool(np.any(values != np.floor(values)))
        return float(values.min()), float(values.max()), fractional
    values = tf.convert_to_tensor(values)
    if values.dtype == tf.bool:
        values = tf.cast(values, tf.int8)
    if ignore is not None and values.dtype.min <= ignore <= values.dtype.max:
        values = tf.where(values == tf.cast(ignore, values.dtype), tf.zeros_like(values), values)
    if values.dtype.is_floating:
        fractional = tf.reduce_any(values != tf.floor(values))
    else:
        fractional = tf.constant(False)
    return tf.reduce_min(values), tf.reduce_max(values), fractional

