"""`save_model` on JAX: the chief writes the model file, every process waits.

The JAX counterpart of `_training/saving.py`: the same checks and atomic
write (`_training/model_file.py`), run through `write_on_chief` with the JAX
`World` (its `all_gather_bytes` is the barrier), so after it returns the
file is complete on every process, and a failed write raises
`ChiefWriteError` on every process.
"""

from __future__ import annotations

import os
from typing import Any

import keras

from shardfeed._common.chief_write import write_on_chief
from shardfeed._jax.world import current_world
from shardfeed._training import model_file as _model_file


def save_model(model: keras.Model, filepath: str | os.PathLike[str], **kwargs: Any) -> None:
    """Saves `model` once, from the chief, while the other processes wait.

    The same arguments, results and errors as the TensorFlow backend's
    `shardfeed.save_model` (see its documentation). Call it on every process
    at the same point: it ends with a collective.
    """
    path = _model_file.checked_path(model, filepath)
    write_on_chief(current_world(), path, _model_file.model_file_write(model, path, **kwargs))
