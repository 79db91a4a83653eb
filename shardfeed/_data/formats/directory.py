"""Shard directories: the reader `files.directory` (a glob's files, sorted, joined by `concat`)."""

from __future__ import annotations

import os
from pathlib import Path

from shardfeed._common import errors as _errors
from shardfeed._data.formats.base import FileArray, PathLike, concat, reader_for
from shardfeed._data.formats.npy import npy


def directory(path: PathLike, pattern: str = "*.npy", *, field: str | None = None) -> FileArray:
    """Shard files in a directory, sorted by name, as one lazy leaf.

    The format follows the files' suffix: `.npy`; `.npz` (`field` is the
    key); `.h5`/`.hdf5` (`field` is the dataset); `.parquet` (`field` is
    the column). Only headers are read here; a row range that spans two
    shards reads from both.

    Args:
        path: The directory.
        pattern: A glob for the shard files, e.g. `"train-*.npy"`. Names are
            sorted as strings, so number shards with leading zeros.
        field: The key, dataset or column inside each shard (not for .npy).

    Returns:
        A `FileArray` over all shards, in name order.

    Raises:
        FileNotFoundError: If no file matches.
        ValueError: For mixed suffixes, a missing or unexpected `field`, or
            row shapes that disagree.
        TypeError: For dtypes that disagree.

    Example:
        >>> x = shardfeed.files.directory("train/", "x-*.npy")
    """
    root = Path(path)
    files = sorted(p for p in root.glob(pattern) if p.is_file())
    if not files:
        raise FileNotFoundError(
            _errors.message(
                "The directory must hold at least one file matching `pattern`.",
                f"path={os.fspath(path)!r}, pattern={pattern!r}",
                "Check the directory and the glob (e.g. `'x-*.npy'`).",
            )
        )
    suffixes = sorted({p.suffix.lower() for p in files})
    if len(suffixes) > 1:
        raise ValueError(
            _errors.message(
                "All shard files must have one format.",
                f"suffixes={suffixes} in {os.fspath(path)!r} for pattern={pattern!r}",
                "Narrow `pattern` to one suffix, e.g. `'*.npy'`.",
            )
        )
    suffix = suffixes[0]
    opener = reader_for(suffix)
    if opener is None:
        raise ValueError(
            _errors.message(
                "Shard files must be .npy, .npz, HDF5 (.h5, .hdf5) or Parquet (.parquet).",
                f"suffix={suffix!r} in {os.fspath(path)!r}",
                "Convert the shards, or narrow `pattern` to supported files.",
            )
        )
    if (opener is npy) != (field is None):
        needs = (
            "must not be given for .npy files"
            if opener is npy
            else (f"is required for {suffix} files (the key, dataset or column to read)")
        )
        raise ValueError(
            _errors.message(
                f"`field` {needs}.",
                f"field={field!r}, pattern={pattern!r}",
                "Pass `field=` only for .npz, HDF5 and Parquet shards.",
            )
        )
    leaves = [opener(p) if field is None else opener(p, field) for p in files]
    name = os.fspath(root / pattern) + ("" if field is None else f"[{field!r}]")
    return concat(leaves, source=f"{name} ({len(files)} files)")
