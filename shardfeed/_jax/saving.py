"""`save_model` on JAX: the chief writes the model file, every process waits.

The JAX counterpart of `_tf/saving.py`: the same checks and atomic
write (`_training/model_file.py`), run through `write_on_chief` with the JAX
`World` (its `all_gather_bytes` is the barrier), so after it returns the
file is complete on every process, and a failed write raises
`ChiefWriteError` on every process. Before writing, the processes check
that they hold the same weights (`_common/model_sync.check_in_sync`): a
loop of the user's that never synced an unseeded model has trained other
weights on each, and the file would hold rank 0's alone.
"""

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
