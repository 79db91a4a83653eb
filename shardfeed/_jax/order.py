"""Each JAX epoch's order: which global rows every replica takes, step by step (`EpochRows`).

NumPy permutations drawn alike on every process: the global order from
`(seed, epoch)`, `"local"` and a partial exchange's per-replica order from
`(seed, epoch, replica)`, rows in order otherwise. The same semantics as
TensorFlow's, other permutations.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from shardfeed._data import exchange as _exchange
from shardfeed._data.plan import ShardPlan


class EpochRows(NamedTuple):
    """Per global replica, the global rows it takes in step order
    (`plan.rows_per_epoch(r)` of them), and whether they must move between
    replicas (the global order of sharded rows on several replicas, or a
    partial exchange); `target`: each global row's replica this epoch where
    the order says (a partial exchange: also the rows no step takes), else
    None (`_data/relayout.py`'s `targets` places those)."""

    rows: list[np.ndarray]
    moved: bool
    target: np.ndarray | None = None


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
    plan: ShardPlan, shuffle: bool | str, seed: int | None, epoch: int, training: bool,
    moves_rows: bool,
) -> EpochRows:
    """The epoch's rows per replica (evaluation: each replica's own rows in
    order, `shuffle` ignored). `moves_rows`: the dataset's
    (`DatasetBase.moves_rows`): sharded rows that follow one order of all rows
    (the global shuffle, or rows in order) move to the replica whose slice of
    a global batch they are.

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> plan = plan_shards(6, 2, 2)
        >>> [r.tolist() for r in epoch_rows(plan, False, None, 0, True, True).rows]
        [[0, 1, 4], [2, 3, 5]]
    """
    shuffle = shuffle if training else False
    moved = training and moves_rows
    if plan.placement == "shard" and shuffle is not True and not moved:
        rows = []
        for r, (start, stop) in enumerate(plan.shards):
            local = permutation(stop - start, seed, (epoch, r), shuffle == "local")
            rows.append(local[: plan.rows_per_epoch(r)] + start)
        return EpochRows(rows, False)
    # One order of all rows (drawn, or in order), each global step a slice of it.
    order = permutation(plan.num_rows, seed, (epoch,), shuffle is True)
    return EpochRows(_exchange.epoch_rows(plan, order), moved)


def mixed_rows(
    plan: ShardPlan, held: list[np.ndarray] | None, since: int | None, fraction: float,
    seed: int, epoch: int,
) -> EpochRows:
    """A partially exchanged epoch's rows per replica: the rows the neutral
    `exchange.partial_targets` gives it this epoch (TensorFlow's holdings),
    ascending, then permuted from `(seed, epoch, replica)`; `moved`: they
    must be moved there (`target`: each row's replica).

    Args:
        plan: The epoch's plan.
        held: Per replica, the rows it holds after partial epoch `since`
            (any slot order); None: as loaded. Replayed from the loaded
            shards when `since` is None or after `epoch` (opened out of turn).
        since, fraction, seed, epoch: As above; `fraction` below 1.

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> rows = mixed_rows(plan_shards(8, 2, 2), None, None, 0.5, 0, 0).rows
        >>> sorted(np.concatenate(rows).tolist()) == list(range(8))
        True
    """
    if held is None or since is None or since > epoch:
        held, since = [np.arange(a, b) for a, b in plan.shards], -1
    if since == epoch:  # already held: nothing moves
        target = np.empty(plan.num_rows, np.int64)
        for g, rows in enumerate(held):
            target[rows] = g
    else:
        target = _exchange.partial_targets(
            held, fraction, seed, range(since + 1, epoch + 1), plan.num_rows
        )
    # 2 bytes a row on the host while the epoch opens, not 8.
    target = target.astype(np.int16 if plan.num_replicas < 2**15 else np.int32)
    out = []
    for r, mine in enumerate(_exchange.holdings(target, plan.num_replicas)):
        order = permutation(len(mine), seed, (epoch, r), True)
        out.append(mine[order[: plan.rows_per_epoch(r)]])
    return EpochRows(out, True, target)


def slot_rows(plan: ShardPlan, rows: list[np.ndarray]) -> np.ndarray:
    """Global row of each real row of the epoch, in the order the steps emit
    them: each full step's replicas in order, then the partial step's.

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> plan = plan_shards(7, 2, 2)
        >>> slot_rows(plan, epoch_rows(plan, False, None, 0, False, True).rows).tolist()
        [0, 1, 4, 5, 2, 3, 6]
    """
    b, full = plan.per_replica_batch_size, plan.full_steps_per_epoch
    body = np.stack([r[: full * b].reshape(full, b) for r in rows], axis=1).reshape(-1)
    tail = [r[full * b :] for r in rows] if plan.has_partial_step else []
    return np.concatenate([body, *tail]).astype(np.int64)
