"""What `memory_plan` is given: arrays, file leaves or `(shape, dtype)` descriptions.

Turns a dataset-style structure into one `ColumnSpec` per array and the row
count, with the sources' checks; reads no rows (a file leaf gives its header).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data.sources import Column, check_lengths, make_column


class ColumnSpec(NamedTuple):
    """One array of the plan: its name, the shape of one row and its dtype."""

    name: str
    row_shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class Described:
    """An array described by shape and dtype only; nothing ever reads its rows."""

    shape: tuple[int, ...]
    dtype: np.dtype


def is_description(value: Any) -> bool:
    """Whether `value` is a `(shape, dtype)` pair rather than data."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        return False
    shape, dtype = value
    return isinstance(shape, (int, tuple, list)) and isinstance(dtype, (str, np.dtype, type))


def describe(name: str, value: Any) -> Described:
    """Checks a `(shape, dtype)` pair named `name` and returns it as a `Described`.

    Args:
        name: The array's name, for error messages.
        value: `(shape, dtype)`: a whole number or a sequence of them, and
            anything `np.dtype` accepts.

    Returns:
        The `Described` array.

    Raises:
        ValueError: For a shape that is not whole numbers >= 0.
        TypeError: For something that is not a NumPy dtype.

    Example:
        >>> describe("x", ((1000, 32), "float32"))
        Described(shape=(1000, 32), dtype=dtype('float32'))
    """
    shape, dtype = value
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(
            _errors.message(
                "A described array must be `(shape, dtype)` with a shape of whole numbers.",
                f"{name}={value!r}",
                "Write e.g. `{'x': ((1000000, 32), 'float32'), 'y': ((1000000,), 'int64')}`.",
            )
        )
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as err:
        raise TypeError(
            _errors.message(
                "A described array's dtype must be a NumPy dtype.",
                f"{name}.dtype={dtype!r}",
                "Use e.g. 'float32', 'float16', 'int64', 'uint8' or 'bool'.",
            )
        ) from err
    return Described(shape, np_dtype)


def _flatten(value: Any, name: str) -> list[tuple[str, Any]]:
    # Mappings and lists nest as in `keras.tree`; a `(shape, dtype)` pair is a leaf.
    if isinstance(value, Mapping):
        return [
            leaf
            for key, item in value.items()
            for leaf in _flatten(item, f"{name}[{key!r}]" if name else str(key))
        ]
    if isinstance(value, (list, tuple)) and not is_description(value):
        return [leaf for i, item in enumerate(value) for leaf in _flatten(item, f"{name}[{i}]")]
    return [(name, describe(name, value) if is_description(value) else value)]


def _column(name: str, leaf: Any) -> Column:
    if isinstance(leaf, Described):
        # A described array has no rows to slice; validate its shape and dtype
        # through a zero-row stand-in, then put the described rows back.
        column = make_column(
            name,
            np.empty((0, *leaf.shape[1:]), leaf.dtype) if leaf.shape else np.empty((), leaf.dtype),
        )
        return dataclasses.replace(column, shape=leaf.shape)
    return make_column(name, leaf)


def column_specs(data: Any) -> tuple[tuple[ColumnSpec, ...], int]:
    """The arrays of `data`, in order, and their common number of rows.

    Args:
        data: An array, a list/dict of arrays, `shardfeed.files` leaves, or
            `(shape, dtype)` descriptions, nested as `ShardedResidentDataset`
            accepts them. Top-level dict keys name the arrays as given.

    Returns:
        `(columns, num_rows)`.

    Raises:
        ValueError: For no arrays at all, or arrays of different lengths.
        TypeError: For leaves that are not numeric arrays or a bad dtype.

    Example:
        >>> column_specs({"x": ((10, 3), "float32")})[1]
        10
    """
    if data is None:
        raise ValueError(
            _errors.message(
                "A dataset needs inputs.",
                "x=None",
                "Pass `x` as an array or a list/dict of arrays.",
            )
        )
    # Top-level dict keys name the arrays as given (`image`, not `x['image']`).
    leaves = _flatten(data, "" if isinstance(data, Mapping) else "x")
    if not leaves:
        raise ValueError(
            _errors.message(
                "`x` must hold at least one array.",
                f"x={data!r}",
                "Pass arrays in `x` or leave it as None.",
            )
        )
    columns = [_column(name, leaf) for name, leaf in leaves]
    num_rows = check_lengths(columns)
    return tuple(ColumnSpec(c.name, c.row_shape, c.dtype) for c in columns), num_rows
