"""What `fit`, `evaluate` and `predict` accept on TensorFlow: `_training/arguments.py`'s
checks and `wrap_arrays` bound to TensorFlow's dataset class, arrays going onto the
model's strategy (the shared names re-exported here), and the sparse-label check
with TensorFlow's gather."""

from __future__ import annotations

from typing import Any

import keras

from shardfeed._tf.compiled import check_model_scope
from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._tf.world import current_world
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
