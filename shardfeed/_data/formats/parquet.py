"""Parquet files: the readers `files.parquet` and `files.parquet_columns` (pyarrow,
imported on use): one column, only the row groups a range overlaps. What is
verified: docs/data.md."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data.formats.base import FileArray, PathLike, existing, optional


class _ParquetArray(FileArray):
    """One Parquet column, read row group by row group.

    Only the row groups overlapping a range are decoded, one at a time, and
    only this column, so a read holds at most one row group of one column
    beside the output.
    """

    _handles = ("_file",)

    def __init__(
        self,
        path: str,
        column: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        fixed: tuple[bool, ...],
        group_starts: tuple[int, ...],
    ) -> None:
        self.path = path
        self.column = column
        self.shape = shape
        self.dtype = dtype
        self.source = f"{path}[{column!r}]"
        self._fixed = fixed  # per nesting level: fixed_size_list (True) or list
        self._group_starts = group_starts  # first row of each row group, then num_rows
        self._file: Any = None

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if self._file is None:
            self._file = open_parquet(self.path)
        group = bisect.bisect_right(self._group_starts, start) - 1
        row, pos = start, 0
        while row < stop:
            group_start, group_stop = self._group_starts[group], self._group_starts[group + 1]
            take = min(stop, group_stop) - row
            if take > 0:
                table = self._read_group(group)
                for chunk in table.column(0).slice(row - group_start, take).chunks:
                    out[pos : pos + len(chunk)] = self._to_numpy(chunk, row)
                    pos += len(chunk)
                    row += len(chunk)
            group += 1

    def _read_group(self, group: int) -> Any:
        import pyarrow as pa

        try:
            return self._file.read_row_group(group, columns=[self.column])
        except (pa.ArrowException, OSError) as err:
            # OSError: a page whose CRC-32 does not match; ArrowException: a
            # page that does not decode (or decompress).
            raise ValueError(_damaged_page(self.source, group, err)) from err

    def _to_numpy(self, array: Any, first_row: int) -> np.ndarray:
        import pyarrow.compute as pc

        rows = len(array)
        for level, fixed in enumerate(self._fixed):
            width = self.shape[1 + level]
            if array.null_count:
                self._refuse_nulls(array, first_row)
            if not fixed:
                lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
                bad = np.flatnonzero(lengths != width)
                if len(bad):
                    # At nesting level L each row holds prod(shape[1:1+L]) lists.
                    per_row = math.prod(self.shape[1 : 1 + level])
                    row = first_row + int(bad[0]) // max(1, per_row)
                    raise ValueError(
                        _errors.message(
                            "A list column is read as a 2-D array, so every row's list "
                            "must have the same length (the first row's).",
                            f"{self.source} row {row} has length {int(lengths[bad[0]])}, "
                            f"expected {width}",
                            "Pad or trim the lists to one length, or store them as a "
                            "fixed-size list.",
                        )
                    )
            array = array.flatten()
        if array.null_count:
            self._refuse_nulls(array, first_row)
        values = array.to_numpy(zero_copy_only=False)
        return values.reshape((rows, *self.shape[1:]))

    def _refuse_nulls(self, array: Any, first_row: int) -> None:
        raise ValueError(
            _errors.message(
                "Resident data cannot hold nulls: every row needs a number.",
                f"{self.source} has {array.null_count} null value(s) in rows "
                f"starting at {first_row}",
                "Fill or drop the null rows before building the dataset.",
            )
        )


def _parquet_layout(source: str, arrow_type: Any, first: Any) -> tuple[np.dtype, tuple, tuple]:
    """Maps a column type to (dtype, row shape, fixed per level); list widths
    come from the first row (`first`, a one-row array) and are checked on read."""
    import pyarrow as pa

    dims: list[int] = []
    fixed: list[bool] = []
    value = first
    while True:
        if pa.types.is_fixed_size_list(arrow_type):
            dims.append(arrow_type.list_size)
            fixed.append(True)
        elif pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
            width = None
            if value is not None and len(value) and value.null_count == 0:
                offsets = value.offsets.to_numpy()
                width = int(offsets[1] - offsets[0])
            dims.append(0 if width is None else width)
            fixed.append(False)
        else:
            break
        arrow_type = arrow_type.value_type
        # The first element of this level, to read the next level's width from.
        value = value.flatten()[:1] if value is not None and len(value) else None
    if not (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
    ):
        raise TypeError(
            _errors.message(
                "A Parquet column must hold numbers (integers, floats or booleans), "
                "or fixed-size/equal-length lists of them.",
                f"{source} type={arrow_type}",
                "Encode strings, dates or decimals as numbers before writing the file, "
                "or pick a numeric column.",
            )
        )
    return np.dtype(arrow_type.to_pandas_dtype()), tuple(dims), tuple(fixed)


def _damaged_page(source: str, group: int, err: BaseException) -> str:
    return _errors.message(
        "Every page of a Parquet column must decode and match its page checksum (when "
        "the writer stored one).",
        f"{source} row group {group}: {type(err).__name__}: {err}",
        "The file is damaged or was copied incompletely; copy or write it again.",
    )


def open_parquet(path: Any) -> Any:
    """A `pq.ParquetFile` over a path or an open binary file."""
    import pyarrow.parquet as pq

    # Pages written with a CRC-32 (`write_page_checksum=True`, as `shardfeed
    # split` writes them) are checked as they are read; pages without one are not.
    return pq.ParquetFile(path, page_checksum_verification=True)


def parquet(path: PathLike, column: str) -> FileArray:
    """A lazy leaf over one column of a Parquet file.

    A read decodes only the row groups that overlap the requested rows, and
    only `column`. Numeric columns become 1-D arrays; fixed-size lists become
    2-D (nested ones N-D); variable lists become 2-D when every row has the
    first row's length (checked as rows are read). Pages the writer stored a
    CRC-32 for (`write_page_checksum=True`, as `shardfeed split` does) are
    verified as they are read; pages without one cannot be.

    Args:
        path: The Parquet file.
        column: A top-level column name.

    Returns:
        A `FileArray` with shape `(num_rows, *list_lengths)`.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: If `column` is missing; on read, for nulls, unequal list
            lengths, or a page that does not decode or match its checksum.
        TypeError: For non-numeric columns.

    Example:
        >>> y = shardfeed.files.parquet("labels.parquet", "label")
    """
    return parquet_columns(path, [column])[column]


def parquet_columns(path: PathLike, columns: Sequence[str]) -> dict[str, FileArray]:
    """Lazy leaves over several columns of one Parquet file.

    Args:
        path: The Parquet file.
        columns: Top-level column names.

    Returns:
        `{column: FileArray}` in the order given; each reads only its column.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: If `columns` is empty or names a missing column.
        TypeError: For non-numeric columns.

    Example:
        >>> cols = shardfeed.files.parquet_columns("train.parquet", ["features", "label"])
        >>> ds = shardfeed.ShardedResidentDataset(cols["features"], cols["label"], ...)
    """
    pa = optional("pyarrow")
    optional("pyarrow.parquet")
    path = existing(path)
    if isinstance(columns, str) or not columns:
        raise ValueError(
            _errors.message(
                "`columns` must be a non-empty list of column names.",
                f"columns={columns!r}",
                "Pass e.g. `['features', 'label']`, or use `files.parquet(path, column)`.",
            )
        )
    try:
        file = open_parquet(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(
            _errors.message(
                "The file must be a complete Parquet file.",
                f"path={path!r} ({err})",
                "Check that the file is Parquet and was written completely.",
            )
        ) from err
    with file:
        schema = file.schema_arrow
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise ValueError(
                _errors.message(
                    "Each column must be in the Parquet file.",
                    f"columns={missing!r} for {path}, which holds {schema.names}",
                    "Pass column names from the list.",
                )
            )
        meta = file.metadata
        starts = [0]
        for group in range(meta.num_row_groups):
            starts.append(starts[-1] + meta.row_group(group).num_rows)
        leaves: dict[str, FileArray] = {}
        for column in columns:
            arrow_type = schema.field(column).type
            first = None
            if starts[-1] and _has_variable_list(arrow_type):
                try:
                    batch = next(file.iter_batches(batch_size=1, columns=[column]))
                except (pa.ArrowException, OSError) as err:
                    raise ValueError(_damaged_page(f"{path}[{column!r}]", 0, err)) from err
                first = batch.column(0)
            dtype, dims, fixed = _parquet_layout(f"{path}[{column!r}]", arrow_type, first)
            leaves[column] = _ParquetArray(
                path, column, (starts[-1], *dims), dtype, fixed, tuple(starts)
            )
    return leaves


def _has_variable_list(arrow_type: Any) -> bool:
    import pyarrow as pa

    while pa.types.is_fixed_size_list(arrow_type):
        arrow_type = arrow_type.value_type
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
