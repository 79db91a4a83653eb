"""What `fit`, `evaluate` and `predict` accept on TensorFlow: `_training/arguments.py`'s
checks and `wrap_arrays` bound to TensorFlow's dataset class, arrays going onto the
model's strategy (the shared names re-exported here), the sparse-label check
with TensorFlow's gather, and that model and dataset share a strategy."""

from __future__ import annotations

from typing import Any

import keras

from shardfeed._common import errors as _errors
from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._tf.world import current_world, initialized_world, is_default_strategy
from shardfeed._training import arguments as _arguments
from shardfeed._training import sparse_labels as _sparse_labels
from shardfeed._training.arguments import (
    DEFAULT_EVAL_BATCH_SIZE,
    FIT_TRANSFORMS,
    Transform,
    check_batch_size,
    check_model,
    resolve_verbose,
)

__all__ = [
    "DEFAULT_EVAL_BATCH_SIZE",
    "FIT_TRANSFORMS",
    "Transform",
    "as_dataset",
    "check_dataset",
    "check_model",
    "check_sparse_labels",
    "check_targets",
    "resolve_transform",
    "resolve_verbose",
]


_BOUND = _arguments.DatasetArguments(ShardedResidentDataset)
check_dataset = _BOUND.check_dataset
check_targets = _BOUND.check_targets
resolve_transform = _BOUND.resolve_transform


def as_dataset(
    data: Any,
    y: Any,
    sample_weight: Any,
    per_replica_batch_size: int | None,
    model: keras.Model,
    template: ShardedResidentDataset | None = None,
    transform: Transform | None = None,
) -> ShardedResidentDataset:
    """Wraps arrays in an unshuffled dataset on the model's strategy, for
    evaluation or prediction, applying `transform` to their `x`.

    `template` (the training dataset, for `validation_data`) lends its
    placement, transform, batch size and load options.
    """
    check_batch_size(per_replica_batch_size)
    if isinstance(data, ShardedResidentDataset):
        return data
    check_model_scope(model)
    world = current_world(model.distribute_strategy)
    return _arguments.wrap_arrays(
        ShardedResidentDataset, data, y, sample_weight, per_replica_batch_size,
        world.num_replicas_in_sync, template, transform, strategy=world.strategy,
    )


def check_sparse_labels(model: keras.Model, dataset: ShardedResidentDataset, name: str) -> None:
    """`sparse_labels.check_sparse_labels` with the dataset's `element_spec`,
    the ranges gathered from every replica by the engine."""
    engine = dataset.engine
    _sparse_labels.check_sparse_labels(
        model, dataset, name, dataset.element_spec, engine.all_gather
    )


def check_strategy(model: keras.Model, dataset: ShardedResidentDataset) -> None:
    """Refuses a model and a dataset on different strategies, naming the one
    built outside the strategy's scope (the one on the default strategy)."""
    model_strategy = model.distribute_strategy
    data_strategy = dataset.world.strategy
    if model_strategy is data_strategy:
        return
    received = (
        f"model.distribute_strategy={type(model_strategy).__name__}, "
        f"dataset strategy={type(data_strategy).__name__}"
    )
    constraint = "The model and the dataset must use the same `tf.distribute` strategy."
    if is_default_strategy(data_strategy):
        raise ValueError(
            _errors.message(
                constraint + " The dataset was built outside the strategy's scope.",
                received,
                "Build the dataset inside the scope the model was built in: `with "
                "world.scope(): dataset = shardfeed.ShardedResidentDataset(...)` (or pass "
                "`ShardedResidentDataset(..., strategy=model.distribute_strategy)`).",
            )
        )
    if is_default_strategy(model_strategy):
        constraint += " The model was built, compiled or loaded outside the strategy's scope."
    raise ValueError(
        _errors.message(
            constraint,
            received,
            "Build, compile or load the model inside the dataset's strategy scope, "
            "e.g. `world = shardfeed.init()` (or `world = dataset.world`), then "
            "`with world.scope(): model = keras.models.load_model(path)`.",
        )
    )


def check_model_scope(model: keras.Model) -> None:
    """Refuses a model outside the strategy `shardfeed.init` started, for
    arrays given to `evaluate`/`predict` (they would run on the model's
    default strategy: one device, and alone on each worker)."""
    world = initialized_world()
    if world is None or is_default_strategy(world.strategy):
        return
    if is_default_strategy(model.distribute_strategy):
        raise ValueError(
            _errors.message(
                "The model must be built, compiled or loaded inside the scope of the "
                "strategy `shardfeed.init()` started.",
                f"model.distribute_strategy={type(model.distribute_strategy).__name__}, "
                f"shardfeed.init() strategy={type(world.strategy).__name__}",
                "Build or load it inside that scope: `with world.scope(): model = "
                "keras.models.load_model(path)`.",
            )
        )
