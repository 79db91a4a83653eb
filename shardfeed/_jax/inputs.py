"""What `fit`, `evaluate` and `predict` accept on JAX: `_training/arguments.py`'s checks and
`wrap_arrays` bound to the JAX dataset class, plus what only JAX needs (`overrides`,
the sparse labels' ranges gathered across processes).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from jax.experimental import multihost_utils
from keras.src.backend.jax.trainer import JAXTrainer

from shardfeed._jax.dataset import ShardedResidentDataset
from shardfeed._jax.world import current_world
from shardfeed._training import arguments as _arguments
from shardfeed._training import sparse_labels as _sparse_labels

_BOUND = _arguments.DatasetArguments(ShardedResidentDataset)
check_dataset = _BOUND.check_dataset
check_targets = _BOUND.check_targets
resolve_transform = _BOUND.resolve_transform


def as_dataset(
    data: Any,
    y: Any,
    sample_weight: Any,
    per_replica_batch_size: int | None,
    template: ShardedResidentDataset | None = None,
    transform: _arguments.Transform | None = None,
    max_steps: int | None = None,
) -> ShardedResidentDataset:
    """Wraps arrays in an unshuffled dataset on the current world's replicas,
    for evaluation or prediction, applying `transform` to their `x`.

    `template` (the training dataset, for `validation_data`) lends its
    placement, transform, batch size and load options. `max_steps` (Keras'
    `max_steps_per_epoch` cap) keeps only the rows of that many global
    batches, as Keras takes the first batches in row order.
    """
    _arguments.check_batch_size(per_replica_batch_size)
    if isinstance(data, ShardedResidentDataset):
        return data
    return _arguments.wrap_arrays(
        ShardedResidentDataset, data, y, sample_weight, per_replica_batch_size,
        current_world().num_replicas_in_sync, template, transform, max_steps,
    )


def overrides(model: keras.Model, step: str) -> bool:
    """Whether the model's class overrides Keras' JAX `step` (e.g. a
    `train_step` that trains on `x` alone needs no targets)."""
    return getattr(type(model), step) is not getattr(JAXTrainer, step)


def _gather_stats(local: list[np.ndarray]) -> np.ndarray:
    """Every replica's `(1, 3)` label stats, this worker's first, in rank order."""
    rows = np.concatenate([np.asarray(s) for s in local])
    if current_world().world_size > 1:
        rows = np.asarray(multihost_utils.process_allgather(rows))
    return rows.reshape(-1, 3)


def check_sparse_labels(
    model: keras.Model, dataset: ShardedResidentDataset, name: str, spec: Any
) -> None:
    """The backend-neutral sparse-label check with one batch's `spec` (from
    `Loop.build`), the ranges gathered across processes."""
    _sparse_labels.check_sparse_labels(model, dataset, name, spec, _gather_stats)
