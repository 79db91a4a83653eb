"""`save_model` on JAX: `_training/model_file.py`'s checks and write through `write_on_chief`
with the JAX world, after checking the processes hold the same weights."""

from __future__ import annotations

import os
from typing import Any

import keras

from shardfeed._common.chief_write import write_on_chief
from shardfeed._common.model_sync import check_in_sync, model_variables
from shardfeed._jax.world import current_world
from shardfeed._training import model_file as _model_file


def save_model(model: keras.Model, filepath: str | os.PathLike[str], **kwargs: Any) -> None:
    """Saves `model` once, from the chief, while the other processes wait.

    The same arguments, results and errors as the TensorFlow backend's
    `shardfeed.save_model` (see its documentation). Call it on every process
    at the same point: it ends with a collective. With several processes it
    first checks that they hold the same weights, and refuses (on every
    process, naming `shardfeed.sync_model`) when they do not.
    """
    path = _model_file.checked_path(model, filepath)
    world = current_world()
    check_in_sync(world, model_variables(model), f"save one model file ({path})")
    write_on_chief(world, path, _model_file.model_file_write(model, path, **kwargs))
