"""The sparse-label check, on either backend: sparse categorical labels against the model.

Each sparse categorical crossentropy matched with its label column and output
size; out-of-range or fractional labels refused before the first step (under
XLA they would give NaN). The ranges come from the dataset's `label_stats`; the
backend passes a batch's spec and how to gather every replica's ranges.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from shardfeed._common import errors as _errors

# Datasets whose labels passed the sparse-label check, per model, with the
# compiled loss (its id) they were checked for: repeated fits and evaluations
# pay for the check once. Weak keys on both levels, so nothing is kept alive.
_LABELS_CHECKED: weakref.WeakKeyDictionary[
    Any, weakref.WeakKeyDictionary[keras.Model, int]
] = weakref.WeakKeyDictionary()


def _at(
    structure: Any, path: tuple[Any, ...], output_names: list[str]
) -> tuple[Any, tuple[Any, ...]]:
    """`structure[path[0]][path[1]]...` and the keys that led there, or None
    where the path does not lead anywhere. A name in a list of outputs stands
    for its position (Keras keys multi-output losses by output name)."""
    keys = []
    for key in path:
        if isinstance(structure, (list, tuple)) and isinstance(key, str):
            if key not in output_names:
                return None, ()
            key = output_names.index(key)
        try:
            structure = structure[key]
        except (KeyError, IndexError, TypeError):
            return None, ()
        keys.append(key)
    return structure, tuple(keys)


def _sparse_label_columns(
    model: keras.Model, spec: Any
) -> list[tuple[tuple[Any, ...], int, int | None]]:
    """`(the label's place in y, number of classes, ignore_class)` for each
    sparse categorical
    crossentropy in the model's compiled loss whose labels and output can be
    matched (single output, or outputs and labels keyed alike).

    Reads Keras' built `CompileLoss` (`_flat_losses`: path, resolved loss),
    which `_build` creates before the first trace; string losses resolve to
    the same function as the `SparseCategoricalCrossentropy` object.
    """
    flat_losses = getattr(getattr(model, "_compile_loss", None), "_flat_losses", None)
    if not flat_losses or spec.y is None:
        return []
    found: list[tuple[tuple[Any, ...], int, int | None]] = []
    outputs = None
    for path, loss, *_ in flat_losses:
        # Keras' (private) LossFunctionWrapper keeps the function as `fn`.
        if getattr(loss, "fn", None) is not keras.losses.sparse_categorical_crossentropy:
            continue
        if outputs is None:
            outputs = model.compute_output_spec(
                keras.tree.map_structure(
                    lambda s: keras.KerasTensor(s.shape, _dtype(s).name), spec.x
                )
            )
        names = list(getattr(model, "output_names", None) or [])
        (label, target), (output, _) = _at(spec.y, path, names), _at(outputs, path, names)
        classes = getattr(output, "shape", (None,))[-1] if output is not None else None
        if _is_array_spec(label) and classes is not None:
            if _dtype(label).kind in "biuf":
                ignore = getattr(loss, "_fn_kwargs", {}).get("ignore_class")
                found.append((target, int(classes), ignore))
    return found


def _label(value: float) -> int | float:
    return int(value) if np.isfinite(value) and float(value).is_integer() else float(value)


def check_sparse_labels(
    model: keras.Model,
    dataset: Any,
    name: str,
    spec: Any,
    gather: Callable[[list[np.ndarray]], np.ndarray],
) -> None:
    """Refuses labels a sparse categorical crossentropy cannot take, before the
    first step.

    Without the check, an out-of-range label stops Keras' non-XLA step with
    TensorFlow's "Received a label value of 7 which is outside the valid range
    of [0, 3)", but under XLA, and on GPUs (as TensorFlow documents for
    `sparse_softmax_cross_entropy_with_logits`), the loss silently becomes
    NaN; a fractional label is silently truncated. The labels are reduced to
    (min, max, fractional) on their devices once per dataset (cached there),
    gathered from every replica so every worker decides alike, and compared
    with the model's output size once per (dataset, model, compiled loss).

    Args:
        model: The compiled model.
        dataset: The backend's `ShardedResidentDataset` (its `label_stats`).
        name: The argument that held it, for the message.
        spec: One batch's `Batch` of arrays or specs (shape and dtype).
        gather: Every replica's `(1, 3)` stats, from this worker's list.
    """
    compile_loss = id(getattr(model, "_compile_loss", None))
    checked = _LABELS_CHECKED.setdefault(dataset, weakref.WeakKeyDictionary())
    if checked.get(model) == compile_loss:
        return
    for target, classes, ignore in _sparse_label_columns(model, spec):
        stats = gather([np.reshape(s, (1, 3)) for s in dataset.label_stats(target, ignore)])
        low, high, fractional = stats[:, 0].min(), stats[:, 1].max(), stats[:, 2].any()
        # Named as the data layer names columns (`y['kind']`).
        where = "y" + "".join(f"[{key!r}]" for key in target) + f" of `{name}`"
        span = f"labels span {_label(low)} to {_label(high)}"
        if low < 0 or high >= classes:
            bad = _label(low if low < 0 else high)
            also = "" if ignore is None else f" (or ignore_class={ignore})"
            raise ValueError(
                _errors.message(
                    "Labels of a sparse categorical crossentropy must be class indices in "
                    f"the valid range of [0, {classes}){also}: the model's output has "
                    f"{classes} units.",
                    f"a label value of {bad} in {where} ({span})",
                    f"Number the classes from 0 to {classes - 1}, or give the output layer "
                    "one unit per class.",
                )
            )
        if fractional:
            raise ValueError(
                _errors.message(
                    "Labels of a sparse categorical crossentropy must be whole class "
                    "indices (Keras would silently truncate 1.5 to 1).",
                    f"fractional or NaN labels in {where} ({span})",
                    "Pass integer class ids (e.g. `y.astype('int32')`); for one-hot or "
                    "soft targets use `categorical_crossentropy`.",
                )
            )
    checked[model] = compile_loss


def _is_array_spec(value: Any) -> bool:
    return value is not None and hasattr(value, "shape") and hasattr(value, "dtype")


def _dtype(spec: Any) -> np.dtype:
    """A spec's dtype as NumPy's (a `tf.DType`, a JAX or NumPy dtype)."""
    return np.dtype(keras.backend.standardize_dtype(spec.dtype))
