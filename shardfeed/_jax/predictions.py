"""Predictions back in the original row order, on every process (`in_row_order`):
each call's outputs gathered from every process, one output per row in the order
given."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from shardfeed._jax.loop import to_host


def _rows_on_host(value: Any, partial: bool) -> np.ndarray:
    """One call's output leaf as rows, every process's (a full call's
    `[steps, global batch, ...]` is sharded over processes; the partial
    step's is replicated)."""
    if partial:
        return to_host(value)
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        value = multihost_utils.process_allgather(value, tiled=True)
    array = np.asarray(value)
    return array.reshape(-1, *array.shape[2:])


def in_row_order(results: list[tuple[bool, Any]], slot_rows: np.ndarray) -> Any:
    """`predict`'s outputs of every piece (`Loop.iterate`), one per row in the
    original order, on every process (`slot_rows`: each emitted row's global
    row number)."""
    partials = [partial for partial, _ in results]
    per_call_leaves = [jax.tree.leaves(outputs) for _, outputs in results]
    order = np.argsort(slot_rows, kind="stable")
    leaves = []
    for leaf_per_call in zip(*per_call_leaves, strict=True):
        parts = [_rows_on_host(v, p) for p, v in zip(partials, leaf_per_call, strict=True)]
        leaves.append(np.concatenate(parts)[order])
    return jax.tree.unflatten(jax.tree.structure(results[0][1]), leaves)
