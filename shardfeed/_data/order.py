"""Each epoch's order, the same on every backend: which global rows every
replica takes, step by step (`EpochRows`).

NumPy permutations drawn alike on every process and backend: the global
order from `(seed, epoch)`, `"local"` and a partial exchange's per-replica
order from `(seed, epoch, replica)`, rows in order otherwise. TensorFlow
turns these rows into its index matrices, JAX into its positions; how rows
reach the replica that takes them is each backend's own.

Why a stored permutation and not a stateless one (a keyed Feistel cipher of
`(seed, epoch, position)`, as datarax draws): both loops take each step's
rows from an array on the device, and the global order's exchange plans its
moves from the whole epoch's rows, so every epoch needs every row's place
anyway. Measured 2026-12-05 (2-core VM shared with other jobs, best of 3):
a NumPy PCG64 shuffle of an int32 `arange` took 49 ms for 1M rows and 1.07 s
for 10M at 4 bytes a row; a vectorized 4-round Feistel with cycle-walking
took 93 ms and 2.95 s at 72 bytes a row (uint64 temporaries), and one step's
256 rows 0.2-0.5 ms on the host, as long as a W2 step. TensorFlow's former
`stateless_shuffle` took 40 ms and 0.86 s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from shardfeed._data import exchange as _exchange
from shardfeed._data.plan import ShardPlan

# The name a resume state records for this order (`_training/resume_state.py`):
# a state written under another order cannot continue inside an epoch.
NAME = "numpy-pcg64-1"


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
    A bijection of `range(n)` by construction (a shuffle of it).

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


def shard_positions(
    plan: ShardPlan, shuffle: bool | str, seed: int | None, epoch: int, replica: int
) -> np.ndarray:
    """Positions in `replica`'s own shard (rows `start + position`) it takes
    in step order, when sharded rows stay where they were loaded: permuted
    from `(seed, epoch, replica)` for `"local"`, in order otherwise.

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> shard_positions(plan_shards(6, 2, 2), False, None, 0, 1).tolist()
        [0, 1, 2]
    """
    start, stop = plan.shards[replica]
    local = permutation(stop - start, seed, (epoch, replica), shuffle == "local")
    return local[: plan.rows_per_epoch(replica)]


def global_rows(
    plan: ShardPlan,
    shuffle: bool | str,
    seed: int | None,
    epoch: int,
    replicas: Sequence[int] | None = None,
) -> list[np.ndarray]:
    """Per replica (of `replicas`, default all), its slice of one order of all
    rows (`ShardPlan.global_order_positions`): drawn from `(seed, epoch)` when
    `shuffle is True`, rows in order otherwise."""
    order = permutation(plan.num_rows, seed, (epoch,), shuffle is True)
    return _exchange.epoch_rows(plan, order, replicas)


def stays_in_place(plan: ShardPlan, shuffle: bool | str, moved: bool) -> bool:
    """Whether each replica takes rows of its own shard (`shard_positions`)
    rather than a slice of one order of all rows (`global_rows`)."""
    return plan.placement == "shard" and shuffle is not True and not moved


def epoch_rows(
    plan: ShardPlan,
    shuffle: bool | str,
    seed: int | None,
    epoch: int,
    training: bool,
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
    if stays_in_place(plan, shuffle, moved):
        rows = []
        for r, (start, _) in enumerate(plan.shards):
            rows.append(shard_positions(plan, shuffle, seed, epoch, r) + start)
        return EpochRows(rows, False)
    return EpochRows(global_rows(plan, shuffle, seed, epoch), moved)


def mixed_order(held: np.ndarray, seed: int, epoch: int, replica: int, count: int) -> np.ndarray:
    """A partially exchanged epoch's order on one replica: the first `count`
    of the rows it holds (`held`, ascending), permuted from
    `(seed, epoch, replica)`; as indices into `held`."""
    return permutation(len(held), seed, (epoch, replica), True)[:count]


def mixed_rows(
    plan: ShardPlan,
    held: list[np.ndarray] | None,
    since: int | None,
    fraction: float,
    seed: int,
    epoch: int,
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
        out.append(mine[mixed_order(mine, seed, epoch, r, plan.rows_per_epoch(r))])
    return EpochRows(out, True, target)


def slot_rows(plan: ShardPlan, rows: Iterable[np.ndarray]) -> np.ndarray:
    """Global row of each real row of the epoch, in the order the steps emit
    them: each full step's replicas in order, then the partial step's.

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> plan = plan_shards(7, 2, 2)
        >>> slot_rows(plan, epoch_rows(plan, False, None, 0, False, True).rows).tolist()
        [0, 1, 4, 5, 2, 3, 6]
    """
    rows = list(rows)
    b, full = plan.per_replica_batch_size, plan.full_steps_per_epoch
    body = np.stack([r[: full * b].reshape(full, b) for r in rows], axis=1).reshape(-1)
    tail = [r[full * b :] for r in rows] if plan.has_partial_step else []
    return np.concatenate([body, *tail]).astype(np.int64)
