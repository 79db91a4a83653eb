"""A model file every worker waits for: what both backends' `save_model` share.

The argument checks (a Keras model, a `.keras` / `.h5` path) and
`model_file_write`, a temporary file renamed into place, so a reader never
sees half a file; each backend runs it through `write_on_chief`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras

from shardfeed._common import errors as _errors


def checked_path(model: Any, filepath: str | os.PathLike[str]) -> Path:
    """The path `save_model` writes, after checking its arguments.

    Raises:
        TypeError: If `model` is not a Keras model.
        ValueError: For a path without `.keras` / `.h5`.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            _errors.message(
                "`save_model` saves Keras 3 models (`keras.Model`).",
                f"type(model)={type(model).__name__}",
                "Pass the model you trained with `shardfeed.fit`.",
            )
        )
    path = Path(filepath)
    if path.suffix not in (".keras", ".h5"):
        raise ValueError(
            _errors.message(
                "`save_model` writes what `model.save` writes: a `.keras` (or legacy `.h5`) file.",
                f"filepath={str(filepath)!r}",
                'Name the file e.g. "model.keras"; for weights alone, save them on the '
                "chief (`if world.is_chief: model.save_weights(...)`), then `world.barrier()`.",
            )
        )
    return path


def model_file_write(model: keras.Model, path: Path, **kwargs: Any) -> Callable[[], None]:
    """The chief's write: `model.save` to a temporary file beside `path`,
    renamed into place (removed if the save fails)."""
    # The same suffix: `model.save` picks the format from it.
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial{path.suffix}")

    def write() -> None:
        try:
            model.save(str(partial), **kwargs)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)

    return write
