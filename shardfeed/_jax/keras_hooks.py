"""JAX's side of Keras' own entry points (`_training/keras_hooks.py`): its
dataset, `fit`/`evaluate`/`predict`, and where a model's arrays go."""

from __future__ import annotations

import keras

from shardfeed._jax.dataset import ShardedResidentDataset
from shardfeed._jax.evaluation import evaluate, predict
from shardfeed._jax.training import fit
from shardfeed._jax.world import current_world
from shardfeed._training import keras_hooks as _hooks


def _where(model: keras.Model) -> _hooks.Where:
    del model  # the world decides on JAX, not the model
    world = current_world()
    return _hooks.Where(
        world.num_replicas_in_sync, world.is_chief,
        (world.rank, world.world_size, *(str(d) for d in world.local_devices)), {}, world,
    )


BACKEND = _hooks.Backend("jax", ShardedResidentDataset, fit, evaluate, predict, _where)


def install() -> None:
    _hooks.install(BACKEND)
