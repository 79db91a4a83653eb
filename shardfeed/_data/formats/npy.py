"""`.npy` files: the header parser and the reader `files.npy` (rows read by
`base.RawArray`; pickled data never loaded). What is verified: docs/data.md."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data.formats.base import PathLike, RawArray, check_size, existing
from shardfeed._data.validate import check_array


def read_header(fp: Any, source: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Reads a .npy header with NumPy's own helpers, refusing pickled data."""
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except ValueError as err:
        raise ValueError(
            _errors.message(
                "The file must be a .npy array (format version 1.0 or 2.0).",
                f"{source}: {err}",
                "Write it with `np.save(path, array)`.",
            )
        ) from err
    return tuple(int(d) for d in shape), bool(fortran_order), np.dtype(dtype)



def check_header(
    source: str, shape: tuple[int, ...], dtype: np.dtype, fortran_order: bool
) -> None:
    """Refuses a .npy header (of a file or an .npz member) that cannot be read by rows.

    Raises:
        TypeError: For object (pickled) or non-numeric dtypes.
        ValueError: For no row dimension, a negative dimension or Fortran order.
    """
    check_array(source, shape, dtype, "file")
    if fortran_order and len(shape) > 1:
        raise ValueError(
            _errors.message(
                "Rows must be contiguous in the file (C order) so a row range is one "
                "read; a Fortran-order file interleaves every row with all others.",
                f"{source} fortran_order=True, shape={shape}",
                "Save it in C order: `np.save(path, np.ascontiguousarray(array))`.",
            )
        )


def npy(path: PathLike) -> RawArray:
    """A lazy leaf over a `.npy` file; each read is one positioned file read.

    Only the header is read here. Rows are read on demand, one range at a
    time, straight into the returned array: host memory stays at the rows
    asked for (no memmap pages left resident).

    Args:
        path: The `.npy` file (format version 1.0 or 2.0, C order, numeric).

    Returns:
        A `FileArray` with the file's shape and dtype (byte order made native).

    Raises:
        FileNotFoundError: If the file does not exist.
        TypeError: For object (pickled) or non-numeric dtypes.
        ValueError: For a file that is not .npy, Fortran order, no row
            dimension, or a size that disagrees with the header (truncated).

    Example:
        >>> x = shardfeed.files.npy("train_x.npy")
        >>> ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=256, seed=0)
    """
    path = existing(path)
    with open(path, "rb") as f:
        return from_file(f, path)


def from_file(f: Any, path: str) -> RawArray:
    """`npy` for a file the caller opened (and keeps open, e.g. to read from it)."""
    f.seek(0)
    shape, fortran_order, dtype = read_header(f, path)
    offset = f.tell()
    size = os.fstat(f.fileno()).st_size
    check_header(path, shape, dtype, fortran_order)
    # Python ints: a hostile header's shape product cannot wrap around (NumPy's
    # int64 product of (2**40, 2**40) is 0), so it is caught here as a size mismatch.
    check_size(path, offset + math.prod(shape) * dtype.itemsize, size)
    return RawArray(path, offset, shape, dtype, source=path)
