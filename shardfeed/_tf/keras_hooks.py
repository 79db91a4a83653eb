"""TensorFlow's side of Keras' own entry points (`_training/keras_hooks.py`):
its dataset, `fit`/`evaluate`/`predict`, and where a model's arrays go."""

from __future__ import annotations

from collections.abc import Hashable

import keras

from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._tf.evaluation import evaluate, predict
from shardfeed._tf.training import fit
from shardfeed._tf.world import current_world, is_default_strategy
from shardfeed._training import keras_hooks as _hooks


def _where(model: keras.Model) -> _hooks.Where:
    world = current_world(model.distribute_strategy)
    # The default strategy is a new object per thread and call: one key for it
    # (and for Horovod's world over it); another strategy is its own key (held,
    # so no later strategy can take its id).
    key: Hashable = (
        ("default", world.rank, world.world_size)
        if is_default_strategy(world.strategy)
        else world.strategy
    )
    return _hooks.Where(
        world.num_replicas_in_sync, world.is_chief, key, {"strategy": world.strategy}, world
    )


BACKEND = _hooks.Backend("tensorflow", ShardedResidentDataset, fit, evaluate, predict, _where)


def install() -> None:
    _hooks.install(BACKEND)
