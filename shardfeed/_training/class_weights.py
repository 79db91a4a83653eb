"""`class_weight`: per-row weights from each row's class, looked up inside the step.

As Keras for arrays (a sparse label rounded, or a one-hot label's argmax; a
missing class weighs 1), in `keras.ops` so both backends' loops call
`ClassWeights.weights`; no weight column is stored.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data.dataset_args import RowSpec

# Class ids above this would make the lookup table large for no reason.
_MAX_CLASS_ID = 1_000_000


@dataclasses.dataclass(frozen=True)
class ClassWeights:
    """The weight of each class `0..len(table)-1`; any other class weighs 1.

    Hashable, so compiled loops can be cached per class weighting.
    """

    table: tuple[float, ...]

    def weights(self, y: Any) -> Any:
        """One weight per row of the label batch `y` (traced, either backend)."""
        ops = keras.ops
        if len(y.shape) > 1:
            if y.shape[-1] == 1:
                y = ops.squeeze(y, axis=-1)
            else:
                y = ops.argmax(y, axis=-1)
        dtype = np.dtype(keras.backend.standardize_dtype(y.dtype))
        if np.issubdtype(dtype, np.floating):
            # Rounding in the label's own float type is exact (no float64:
            # JAX runs without x64); as Keras, half to even.
            y = ops.round(y)
        elif not np.issubdtype(dtype, np.integer):
            y = ops.cast(y, "int32")  # e.g. bool labels
        # Known classes are tested before the cast, so a huge label cannot
        # wrap into the table.
        size = len(self.table)
        known = ops.logical_and(y >= 0, y < size)
        classes = ops.cast(ops.clip(y, 0, size - 1), "int32")
        table = ops.convert_to_tensor(self.table, keras.backend.floatx())
        looked_up = ops.take(table, classes)
        return ops.where(known, looked_up, ops.ones_like(looked_up))


def class_weights(class_weight: Mapping[int, float] | None, dataset: Any) -> ClassWeights | None:
    """Checks `class_weight` against the dataset's targets, as Keras does.

    Raises:
        TypeError: If `class_weight` is not a mapping.
        ValueError: For non-integer or negative classes, non-finite weights,
            a dataset with sample weights, several targets, or labels that are
            not one class per row.
    """
    if class_weight is None:
        return None
    if not isinstance(class_weight, Mapping):
        raise TypeError(
            _errors.message(
                "`class_weight` must be a dict from class index to weight.",
                f"type(class_weight)={type(class_weight).__name__}",
                "Pass e.g. `class_weight={0: 1.0, 1: 5.0}`.",
            )
        )
    bad = [
        k
        for k, v in class_weight.items()
        if not (_errors.is_integer(k) and 0 <= k <= _MAX_CLASS_ID)
        or not (isinstance(v, numbers.Real) and math.isfinite(v))
    ]
    if bad or not class_weight:
        raise ValueError(
            _errors.message(
                "`class_weight` maps class indices (integers from 0) to finite weights.",
                f"class_weight={dict(class_weight)!r}",
                "Pass e.g. `class_weight={0: 1.0, 1: 5.0}` (classes left out weigh 1).",
            )
        )
    spec = dataset.row_specs
    if spec.sample_weight is not None:
        raise ValueError(
            _errors.message(
                "`class_weight` and sample weights cannot be used together (as in Keras).",
                "class_weight and a dataset built with sample_weight",
                "Multiply the class weights into the dataset's `sample_weight` column "
                "(`sample_weight * weights[y]`), or leave `class_weight` out.",
            )
        )
    # A single target is one spec; several outputs are a structure of them.
    target = spec.y if isinstance(spec.y, RowSpec) else None
    rank = None if target is None else len(target.shape)
    if target is None or rank is None or rank > 2:
        shape = None if target is None else (dataset.num_rows, *target.shape[1:])
        got = "several outputs" if target is None else f"shape {shape}"
        raise ValueError(
            _errors.message(
                "`class_weight` needs a single target with one class per row: sparse "
                "labels `(n,)` / `(n, 1)` or one-hot labels `(n, classes)` (as in Keras).",
                f"targets of {got}",
                "For several outputs, build the weights into the dataset's `sample_weight`.",
            )
        )
    size = max(int(k) for k in class_weight) + 1
    table = [1.0] * size
    for k, v in class_weight.items():
        table[int(k)] = float(v)
    return ClassWeights(tuple(table))
