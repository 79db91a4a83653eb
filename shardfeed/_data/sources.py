"""Sources: the user's arrays and leaves as named columns that read row ranges.

Knows nothing of replicas, devices or batches. Reads are lazy and ranged: a
worker reads only its replicas' rows, one bounded chunk at a time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import optree

from shardfeed._common import errors as _errors
from shardfeed._data.validate import check_array

# optree (what keras.tree uses) instead of keras.tree: this layer must not
# import TensorFlow, so `shardfeed plan` and `shardfeed split` start fast.


@dataclasses.dataclass(frozen=True)
class Column:
    """One leaf of the user's data: a named array of rows.

    Attributes:
        name: Where the leaf sits in the user's structure, e.g. `x['image']`.
        part: Which part it belongs to: `"x"`, `"y"` or `"sample_weight"`.
        data: The array-like holding the rows (read lazily).
        shape: Full shape; `shape[0]` is the number of rows.
        dtype: NumPy dtype of the rows, kept as given (uint8 stays uint8).
    """

    name: str
    part: str
    data: Any
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def num_rows(self) -> int:
        return self.shape[0]

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * self.dtype.itemsize

    def read(self, start: int, stop: int, check_finite: bool = False) -> np.ndarray:
        """Reads rows `[start, stop)` as a C-contiguous NumPy array.

        Args:
            start: First row.
            stop: One past the last row.
            check_finite: Raise if a float row holds NaN or inf.

        Returns:
            An array of shape `(stop - start, *row_shape)` and this column's dtype.

        Raises:
            ValueError: If `check_finite` is set and the rows hold NaN or inf.
        """
        if hasattr(self.data, "numpy") and not isinstance(self.data, np.ndarray):
            rows = self.data[start:stop].numpy()  # tf.Tensor: slice before copying
        else:
            rows = np.asarray(self.data[start:stop])
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if check_finite and self.dtype.kind in "fc" and not np.isfinite(rows).all():
            bad = int(np.flatnonzero(~np.isfinite(rows.reshape(len(rows), -1)).all(axis=1))[0])
            raise ValueError(
                _errors.message(
                    "Inputs must be finite when `check_finite=True`.",
                    f"{self.name} row {start + bad} holds NaN or inf",
                    "Clean or drop those rows before building the dataset, or "
                    "pass `check_finite=False` to upload them as they are.",
                )
            )
        return rows


@dataclasses.dataclass(frozen=True)
class Columns:
    """The user's `(x, y, sample_weight)` flattened into named columns.

    Attributes:
        columns: Leaves in flatten order (dict keys sorted, as `keras.tree`): all
            of x, then y, then
            sample_weight.
        x: The structure of x with leaves replaced by column indices (None
            for an absent optional input).
        y: Likewise for y, or None.
        sample_weight: Likewise for sample_weight, or None.
        num_rows: Rows in every column.
    """

    columns: tuple[Column, ...]
    x: Any
    y: Any
    sample_weight: Any
    num_rows: int

    @property
    def row_bytes(self) -> int:
        return sum(c.row_bytes for c in self.columns)

    def describe(self) -> str:
        return ", ".join(f"{c.name}: {c.dtype.name}{list(c.row_shape)}" for c in self.columns)

    def rows(self, start: int, stop: int) -> tuple[Any, Any, Any]:
        """`(x, y, sample_weight)` of rows `[start, stop)`: the user's
        structures with each array replaced by a lazy view (nothing is read
        or copied until a range of it is), to build another dataset from."""
        views = [_RowRange(c.data, start, stop, c.shape, c.dtype) for c in self.columns]

        def structure(s: Any) -> Any:
            return None if s is None else optree.tree_map(lambda i: views[i], s)

        return structure(self.x), structure(self.y), structure(self.sample_weight)


class _RowRange:
    """Rows `[start, stop)` of an array-like, read lazily (no copy until read)."""

    def __init__(self, data: Any, start: int, stop: int, shape: tuple[int, ...], dtype: Any):
        self._data, self._start = data, start
        self.shape = (stop - start, *shape[1:])
        self.dtype = dtype
        self.source = getattr(data, "source", None)

    def __getitem__(self, rows: slice) -> Any:
        begin, end, _ = rows.indices(self.shape[0])
        return self._data[self._start + begin : self._start + end]


def _path_name(part: str, path: Sequence[Any]) -> str:
    return part + "".join(f"[{p!r}]" for p in path)


def _as_array_like(leaf: Any, name: str) -> Any:
    """Returns `leaf` if it can be sliced by rows lazily, else a NumPy array."""
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype") and hasattr(leaf, "__getitem__"):
        return leaf
    if isinstance(leaf, (list, tuple, int, float)) or np.isscalar(leaf):
        return np.asarray(leaf)
    raise TypeError(
        _errors.message(
            "Each leaf of `x`, `y` and `sample_weight` must be an array with a "
            "`shape`, a `dtype` and row slicing (NumPy array, tf.Tensor, "
            "np.memmap, h5py.Dataset, a `shardfeed.files` reader).",
            f"type({name})={type(leaf).__name__}",
            "Convert it with `np.asarray(...)` first.",
        )
    )


def make_column(name: str, leaf: Any, part: str = "x") -> Column:
    """Validates one leaf and describes it as a `Column` (reads no rows).

    Raises:
        TypeError: For non-array leaves, object or non-numeric dtypes.
        ValueError: For a leaf without a row dimension (or with a negative one).
    """
    data = _as_array_like(leaf, name)
    shape = tuple(int(d) for d in data.shape)
    dtype = np.dtype(getattr(data.dtype, "as_numpy_dtype", data.dtype))
    check_array(name, shape, dtype, "array")
    return Column(name=name, part=part, data=data, shape=shape, dtype=dtype)


def check_lengths(columns: Sequence[Column]) -> int:
    """The common number of rows of `columns`.

    Raises:
        ValueError: If the columns disagree (each named with its length) or
            hold no row.
    """
    if len({c.num_rows for c in columns}) > 1:
        # File-backed leaves (shardfeed.files) say which file they read.
        listed = ", ".join(
            f"{c.name} has {c.num_rows}"
            + (f" ({c.data.source})" if isinstance(getattr(c.data, "source", None), str) else "")
            for c in columns
        )
        raise ValueError(
            _errors.message(
                "All arrays must have the same number of rows.",
                listed,
                "Trim or align the arrays so each row of x has its y (and sample_weight).",
            )
        )
    num_rows = columns[0].num_rows
    if num_rows == 0:
        raise ValueError(
            _errors.message(
                "A dataset needs at least one row.",
                "num_rows=0",
                "Check how the arrays were loaded or filtered.",
            )
        )
    return num_rows


def columns_from_arrays(x: Any, y: Any = None, sample_weight: Any = None) -> Columns:
    """Flattens `(x, y, sample_weight)` into validated columns.

    Args:
        x: An array, or a list/tuple/dict of arrays (multi-input).
        y: Same forms as `x` (multi-output), or None.
        sample_weight: An array of one weight per row (or a structure matching
            `y`), or None.

    Returns:
        A `Columns` holding every leaf, all with the same number of rows.

    Raises:
        TypeError: For non-array leaves, object or non-numeric dtypes.
        ValueError: For empty data or arrays of different lengths.

    Example:
        >>> cols = columns_from_arrays({"a": np.zeros((4, 2))}, np.ones(4))
        >>> cols.num_rows
        4
    """
    if x is None:
        raise ValueError(
            _errors.message(
                "A dataset needs inputs.",
                "x=None",
                "Pass `x` as an array or a list/dict of arrays.",
            )
        )
    columns: list[Column] = []
    structures: dict[str, Any] = {}
    for part, value in (("x", x), ("y", y), ("sample_weight", sample_weight)):
        if value is None:
            structures[part] = None
            continue
        paths, values, treespec = optree.tree_flatten_with_path(value, none_is_leaf=True)
        leaves = list(zip(paths, values, strict=True))
        if not leaves:
            raise ValueError(
                _errors.message(
                    f"`{part}` must hold at least one array.",
                    f"{part}={value!r}",
                    f"Pass arrays in `{part}` or leave it as None.",
                )
            )
        indices: list[int | None] = []
        for path, leaf in leaves:
            # None in `x` is an absent optional model input (`keras.Input(...,
            # optional=True)`), as Keras takes it: no column, None in every batch.
            if leaf is None and part == "x" and len(leaves) > 1:
                indices.append(None)
                continue
            indices.append(len(columns))
            columns.append(make_column(_path_name(part, path), leaf, part))
        structures[part] = optree.tree_unflatten(treespec, indices)
    num_rows = check_lengths(columns)
    return Columns(
        columns=tuple(columns),
        x=structures["x"],
        y=structures["y"],
        sample_weight=structures["sample_weight"],
        num_rows=num_rows,
    )
