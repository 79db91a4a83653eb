"""The sparse-label check on TensorFlow: the dataset's spec and the engine's gather around
`_training/sparse_labels.py`'s backend-neutral check."""

from __future__ import annotations

import keras

from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._training import sparse_labels as _sparse_labels


def check_sparse_labels(model: keras.Model, dataset: ShardedResidentDataset, name: str) -> None:
    """`sparse_labels.check_sparse_labels` with the dataset's `element_spec`,
    the ranges gathered from every replica by the engine."""
    engine = dataset.engine
    _sparse_labels.check_sparse_labels(
        model, dataset, name, dataset.element_spec, engine.all_gather
    )
