"""HDF5 files: the reader `files.hdf5`, through h5py (imported on use; `read_direct`
converts byte order with no temporary). What is verified: docs/data.md."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data.formats.base import (
    FileArray,
    PathLike,
    existing,
    native,
    optional,
)
from shardfeed._data.validate import check_array


class _Hdf5Array(FileArray):
    """An HDF5 dataset; the file is opened on first read so the leaf pickles."""

    _handles = ("_file",)

    def __init__(self, path: str, dataset: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.path = path
        self.dataset = dataset
        self.shape = shape
        self.dtype = dtype
        self.source = f"{path}[{dataset!r}]"
        self._file: Any = None

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if self._file is None:
            self._file = _open_hdf5(self.path)
        # read_direct writes into `out` (converting byte order) with no temporary.
        self._file[self.dataset].read_direct(out, source_sel=np.s_[start:stop])


def _open_hdf5(path: str) -> Any:
    import h5py  # optional dependency: `pip install shardfeed[files]`

    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise OSError(
            _errors.message(
                "The file must be an HDF5 file h5py can open.",
                f"path={path!r} ({err})",
                "Check that the file is HDF5 (not .npz or Parquet) and was written completely.",
            )
        ) from err


def hdf5(path: PathLike, dataset: str) -> FileArray:
    """A lazy leaf over an HDF5 dataset, read by row ranges through h5py.

    The file is opened here only to read the dataset's shape and dtype, then
    closed; it is reopened on the first read, so the leaf can be pickled and
    sent to other processes before it reads anything.

    Args:
        path: The HDF5 file.
        dataset: The dataset's path in the file, e.g. `"train/images"`.

    Returns:
        A `FileArray` with the dataset's shape and dtype.

    Raises:
        FileNotFoundError: If the file does not exist.
        OSError: If h5py cannot open the file.
        ValueError: If `dataset` is not a dataset in the file, or is scalar.
        TypeError: For non-numeric datasets (strings, compound types).

    Example:
        >>> images = shardfeed.files.hdf5("train.h5", "images")
    """
    path = existing(path)
    h5py = optional("h5py")
    with _open_hdf5(path) as f:
        node = f.get(dataset)
        if not isinstance(node, h5py.Dataset):
            names: list[str] = []
            f.visititems(
                lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None
            )
            raise ValueError(
                _errors.message(
                    "`dataset` must name a dataset in the HDF5 file.",
                    f"dataset={dataset!r} for {path}, which holds datasets {names}",
                    "Pass one of the listed names (groups are separated by '/').",
                )
            )
        shape = tuple(int(d) for d in node.shape) if node.shape is not None else ()
        dtype = np.dtype(node.dtype)
    source = f"{path}[{dataset!r}]"
    check_array(source, shape, dtype, "file")
    return _Hdf5Array(path, dataset, shape, native(dtype))
