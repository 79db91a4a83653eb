"""Each JAX epoch's order: which global rows every replica takes, step by step.

Owns the permutations on JAX, drawn with NumPy on every process alike:
`shuffle=True` is the global order, one permutation of all rows per epoch
from `np.random.default_rng((seed, epoch))`, each global step a slice of it
(`ShardPlan.global_order_positions`); `"local"`: each sharded replica permutes
its own rows from `(seed, epoch, replica)`; False (and evaluation): rows in
order. The permutations differ from the TensorFlow backend's
(`tf.random.experimental.stateless_shuffle`); the semantics are the same.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from shardfeed._data import exchange as _exchange
from shardfeed._data.plan import ShardPlan


class EpochRows(NamedTuple):
    """Per global replica, the global rows it takes in step order
    (`plan.rows_per_epoch(r)` of them), and whether they must move between
    replicas (the global order of sharded rows on several replicas)."""

    rows: list[np.ndarray]
    moved: bool


def permutation(n: int, seed: int | None, key: tuple[int, ...], shuffle: bool) -> np.ndarray:
    """`range(n)`, shuffled from `(seed, *key)` when `shuffle`: int32 below
    2**31 rows (half the host memory of int64), the same order either way.

    Example:
        >>> permutation(5, None, (0,), False).tolist()
        [0, 1, 2, 3, 4]
    """
    order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    if shuffle:
        assert seed is not None  # checked when the dataset was built
        # In place: `Generator.permutation(n)` shuffles an int64 `arange(n)`
        # with the same draws, so the order is the same.
        np.random.default_rng((seed, *key)).shuffle(order)
    return order


def epoch_rows(
    plan: ShardPlan, shuffle: bool | str, seed: int | None, epoch: int, training: bool
) -> EpochRows:
    """The epoch's rows per replica (evaluation: in order, `shuffle` ignored).

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> [r.tolist() for r in epoch_rows(plan_shards(6, 2, 2), False, None, 0, True).rows]
        [[0, 1, 2], [3, 4, 5]]
    """
    shuffle = shuffle if training else False
    if plan.placement == "shard" and shuffle is not True:
        rows = []
        for r, (start, stop) in enumerate(plan.shards):
            local = permutation(stop - start, seed, (epoch, r), shuffle == "local")
            rows.append(local[: plan.rows_per_epoch(r)] + start)
        return EpochRows(rows, False)
    # The global order (or replicated rows in order): slices of one order of all rows.
    order = permutation(plan.num_rows, seed, (epoch,), shuffle is True)
    moved = plan.placement == "shard" and plan.num_replicas > 1
    return EpochRows(_exchange.epoch_rows(plan, order), moved)


def slot_rows(plan: ShardPlan, rows: list[np.ndarray]) -> np.ndarray:
    """Global row of each real row of the epoch, in the order the steps emit
    them: each full step's replicas in order, then the partial step's.

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> plan = plan_shards(7, 2, 2)
        >>> slot_rows(plan, epoch_rows(plan, False, None, 0, True).rows).tolist()
        [0, 1, 4, 5, 2, 3, 6]
    """
    b, full = plan.per_replica_batch_size, plan.full_steps_per_epoch
    body = np.stack([r[: full * b].reshape(full, b) for r in rows], axis=1).reshape(-1)
    tail = [r[full * b :] for r in rows] if plan.has_partial_step else []
    return np.concatenate([body, *tail]).astype(np.int64)
