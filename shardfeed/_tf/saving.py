"""`save_model` on TensorFlow: `_training/model_file.py`'s checks and write through
`write_on_chief` with the TensorFlow world.

Why: every rank calling `model.save(path)` on a shared path interleaves the
writes (`BadZipFile: Bad CRC-32`); here the chief writes and renames, and every
rank learns how it went, raising `ChiefWriteError` together on failure.
"""

from __future__ import annotations

import os
from typing import Any

import keras

from shardfeed._common.chief_write import ChiefWriteError, write_on_chief
from shardfeed._tf.world import current_world
from shardfeed._training import model_file as _model_file

__all__ = ["ChiefWriteError", "save_model", "write_on_chief"]


def save_model(model: keras.Model, filepath: str | os.PathLike[str], **kwargs: Any) -> None:
    """Saves `model` once, from the chief, while the other workers wait.

    Call it on every worker at the same point (it ends with a barrier, a
    collective). Works under MultiWorkerMirroredStrategy, Horovod and one
    process alike; load the file for more training or evaluation inside
    `world.scope()` (see docs/keras.md, "Multi-worker saving").

    Args:
        model: A Keras 3 model.
        filepath: Where to write: a `.keras` file (or `.h5`, as `model.save`).
        **kwargs: Passed to `model.save` (e.g. `zipped=False`).

    Raises:
        TypeError: If `model` is not a Keras model.
        ValueError: For a path without `.keras` / `.h5`; with one worker, as
            `model.save`.
        ChiefWriteError: With several workers, on every rank, when the chief
            could not write the file (its error in the message).

    Example:
        >>> shardfeed.fit(model, ds, epochs=3)
        >>> shardfeed.save_model(model, "model.keras")  # on every worker
        >>> with world.scope():
        ...     model = keras.models.load_model("model.keras")
    """
    path = _model_file.checked_path(model, filepath)
    write = _model_file.model_file_write(model, path, **kwargs)
    write_on_chief(current_world(model.distribute_strategy), path, write)
