"""Input specs of the `split` and `plan` commands: `name=path[:field]` -> a lazy leaf.

Opens each with its format's reader (`_data/formats`), headers only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shardfeed._common import errors as _errors
from shardfeed._data.formats.base import reader_for
from shardfeed._data.formats.npy import npy


def open_input(spec: str) -> tuple[str, Any]:
    """Parses one input spec into a name and a lazy leaf (reads headers only).

    Args:
        spec: `name=path.npy`, `name=file.npz:key`, `name=file.h5:dataset` or
            `name=file.parquet:column` (suffixes as in `formats.base.READERS`).

    Returns:
        `(name, leaf)`.

    Raises:
        ValueError: For a malformed spec or an unsupported suffix; otherwise
            as the format's reader raises (FileNotFoundError, TypeError, ...).

    Example:
        >>> open_input("y=data.npz:labels")
    """
    name, sep, location = spec.partition("=")
    if not sep or not name or not location:
        raise ValueError(
            _errors.message(
                "Each input must be written `name=path`.",
                f"input={spec!r}",
                "Write e.g. `x=train_x.npy y=train_y.npy`.",
            )
        )
    if location.lower().endswith(".npy"):
        return name, npy(location)
    file_path, sep, field = location.rpartition(":")
    # Every reader but .npy's takes the array's name inside the file.
    reader = reader_for(Path(file_path).suffix)
    if not sep or reader is None or reader is npy or not field:
        raise ValueError(
            _errors.message(
                "An input must be a .npy file, or `file.npz:key`, `file.h5:dataset` or "
                "`file.parquet:column`.",
                f"input={spec!r}",
                "Name the array inside .npz, HDF5 and Parquet files after a colon.",
            )
        )
    return name, reader(file_path, field)


def open_inputs(
    specs: Sequence[str], open_one: Callable[[str], tuple[str, Any]] | None = None
) -> dict[str, Any]:
    """Opens `name=...` input specs (the CLI's positional arguments) by name.

    Args:
        specs: The specs, e.g. `x=x.npy`, `y=data.npz:labels`.
        open_one: Parses one spec into `(name, leaf)`; default `open_input`.

    Returns:
        `{name: leaf}` in the order given.

    Raises:
        ValueError: If a name is given twice, or as `open_one` raises.
    """
    open_one = open_one or open_input
    arrays: dict[str, Any] = {}
    for spec in specs:
        name, leaf = open_one(spec)
        if name in arrays:
            raise ValueError(
                _errors.message(
                    "Each input needs its own name.",
                    f"name={name!r} given twice",
                    "Rename one of the inputs.",
                )
            )
        arrays[name] = leaf
    return arrays
