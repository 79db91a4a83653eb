"""Predictions back in the original row order, on every worker (`in_row_order`): padding
dropped, every replica's rows gathered, one output per row in the order given."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from shardfeed._tf.epoch import ResidentEpoch


def in_row_order(
    engine: Any, order: ResidentEpoch, chunks: list[list[Any]], structure: Any
) -> Any:
    """Every row's output, sorted by row number, from every replica's chunks.

    Args:
        engine: The engine (its `all_gather` crosses workers).
        order: The evaluation epoch (`slot_rows(local)`: each slot's row, -1
            for padding).
        chunks: Per local replica, per compiled call, the flat output leaves.
        structure: One replica's output structure (to pack the leaves into).

    Returns:
        The outputs, one per row of the whole dataset, in row order.

    Example:
        >>> in_row_order(engine, ds.epoch(0, training=False), chunks, structure)
    """
    # Every replica has steps * per_replica_batch_size slots; padding: row -1.
    rows_per_replica, leaves_per_replica = [], []
    for local in range(len(chunks)):
        rows_per_replica.append(order.slot_rows(local))
        leaves_per_replica.append(
            [
                np.concatenate([c[j] for c in chunks[local]]).reshape(-1, *leaf.shape[2:])
                for j, leaf in enumerate(chunks[local][0])
            ]
        )
    rows = engine.all_gather(rows_per_replica)
    keep = np.flatnonzero(rows >= 0)
    in_order = keep[np.argsort(rows[keep], kind="stable")]
    leaves = [
        engine.all_gather([leaves[j] for leaves in leaves_per_replica])[in_order]
        for j in range(len(leaves_per_replica[0]))
    ]
    return keras.tree.pack_sequence_as(structure, leaves)
