"""The array rules, written once: numeric dtype, a row dimension, no negative
dimension, and their messages (the fix worded for a file, an array or `split`)."""

from __future__ import annotations

from typing import Literal

import numpy as np

from shardfeed._common import errors as _errors

# Kinds NumPy uses for numbers: bool, signed/unsigned integers, floats, complex.
NUMERIC_KINDS = "biufc"

Origin = Literal["file", "array", "split"]

# Why an object array is refused: a file's rows would have to be unpickled; an
# array's are Python objects already.
_OBJECT_FILE = (
    "Object arrays cannot be read: their rows are pickled Python objects (shardfeed never "
    "unpickles, `allow_pickle` stays off) and could not be uploaded to a device anyway."
)
_OBJECT_ARRAY = (
    "Object (pickled) arrays cannot be uploaded to a device: their rows are Python objects, "
    "not numbers."
)
_NUMERIC = "Resident data must be numeric (bool, integer, float or complex)."
_ROWS = "Each array needs a leading row dimension."
_DIMENSIONS = "Every dimension of an array must be >= 0."

# The fix each rule suggests, by where the array came from.
_FIXES: dict[str, dict[str, str]] = {
    "file": {
        "object": "Convert the data to a numeric dtype and save it again, e.g. "
        "`np.save(path, np.stack(list_of_arrays).astype('float32'))`.",
        "numeric": "Encode strings or records as numbers (e.g. a vocabulary lookup) "
        "and save those instead.",
        "rows": "Save one value per row, e.g. `np.full(num_rows, value)`.",
        "dimensions": "The header is damaged; write the file again (e.g. `np.save`).",
    },
    "array": {
        "object": "Convert the data to a numeric dtype (e.g. "
        "`np.stack(list_of_arrays).astype('float32')`).",
        "numeric": "Encode strings or records as numbers (e.g. a vocabulary lookup) "
        "before building the dataset.",
        "rows": "Pass one value per row, e.g. `np.full(num_rows, value)`.",
        "dimensions": "Pass an array whose shape NumPy accepts (`np.asarray(...)`).",
    },
    "split": {
        "object": "Convert the data to a numeric dtype (e.g. "
        "`np.stack(list_of_arrays).astype('float32')`) before splitting.",
        "numeric": "Encode strings or records as numbers (e.g. a vocabulary lookup) "
        "before splitting.",
        "rows": "Pass one value per row, e.g. `np.full(num_rows, value)`.",
        "dimensions": "Pass an array whose shape NumPy accepts (`np.asarray(...)`).",
    },
}


def is_numeric(dtype: np.dtype) -> bool:
    """True for bool, integer, float and complex dtypes (never object or strings)."""
    return np.dtype(dtype).kind in NUMERIC_KINDS


def check_array(
    name: str, shape: tuple[int, ...], dtype: np.dtype, origin: Origin = "array"
) -> None:
    """Refuses an array that cannot be resident data, naming it in the message.

    Args:
        name: How messages name the array, e.g. `"x"`, `"a.npz['x']"` or
            `"arrays['x']"`.
        shape: Its full shape; `shape[0]` is the number of rows.
        dtype: Its dtype.
        origin: Where it came from (`"file"`, `"array"` or `"split"`), which
            decides the fix the message suggests.

    Raises:
        TypeError: For an object (pickled) or non-numeric dtype.
        ValueError: For no row dimension or a negative dimension.

    Example:
        >>> check_array("x", (4, 3), np.dtype("float32"))
    """
    fixes = _FIXES[origin]
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        # `hasobject`: also a record dtype with an object field.
        constraint = _OBJECT_FILE if origin == "file" else _OBJECT_ARRAY
        raise TypeError(_errors.message(constraint, f"{name}.dtype={dtype}", fixes["object"]))
    if not is_numeric(dtype):
        raise TypeError(_errors.message(_NUMERIC, f"{name}.dtype={dtype}", fixes["numeric"]))
    if not shape:
        raise ValueError(_errors.message(_ROWS, f"{name}.shape=()", fixes["rows"]))
    if any(d < 0 for d in shape):
        raise ValueError(
            _errors.message(_DIMENSIONS, f"{name}.shape={tuple(shape)}", fixes["dimensions"])
        )
