"""Who sends which rows to whom before a globally shuffled epoch of sharded data.

Pure arithmetic on NumPy row ids: every rank computes the same moves from the
epoch's permutation, the layout and the plan, so nothing is negotiated. Rounds
stage at most `round_rows` per replica and land in the slots their departures
freed: no second copy. Also a partial exchange's holdings (both backends).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._common.units import MIB
from shardfeed._data.plan import ShardPlan

# `LoadOptions(exchange_buffer_bytes="auto")`: an eighth of the largest shard,
# within these bounds. A fixed 256 MiB staged 1.4x the rows of a 366 MiB
# dataset on 2 devices (peak 2.79x); an eighth costs 0.125x and about 16
# rounds an epoch. The floor keeps small shards to a few rounds.
AUTO_BUFFER_SHARE = 8
AUTO_BUFFER_MIN_BYTES = 16 * MIB
AUTO_BUFFER_MAX_BYTES = 256 * MIB


@dataclasses.dataclass(frozen=True)
class Round:
    """One round of an exchange.

    Attributes:
        counts: `[R, R]` int64: `counts[s, d]` rows replica s sends to d.
        send_slots: Per replica, the slots whose rows it sends, grouped by
            destination in replica order; arrivals (grouped by source in
            replica order) are written into the same slots, in order.
        arriving_rows: Per replica, the global ids of the rows it receives,
            in arrival order (grouped by source).
    """

    counts: np.ndarray
    send_slots: tuple[np.ndarray, ...]
    arriving_rows: tuple[np.ndarray, ...]

    @property
    def max_send_rows(self) -> int:
        return int(self.counts.sum(axis=1).max(initial=0))


def row_dtype(num_rows: int) -> np.dtype:
    """The dtype of global row ids and slots: int32 below 2**31 rows. On narrow
    rows the host's per-row arrays are a share of the rows themselves (128-byte
    rows: each int64 array 6%), and on CPU devices the same memory."""
    return np.dtype(np.int32 if num_rows < 2**31 else np.int64)


def _replica_dtype(num_replicas: int) -> np.dtype:
    return np.dtype(np.int16 if num_replicas < 2**15 else np.int32)


def initial_layout(plan: ShardPlan) -> list[np.ndarray]:
    """Per replica, the global rows its slots hold after the upload."""
    dtype = row_dtype(plan.num_rows)
    return [np.arange(start, stop, dtype=dtype) for start, stop in plan.shards]


def epoch_rows(
    plan: ShardPlan, permutation: np.ndarray, replicas: Sequence[int] | None = None
) -> list[np.ndarray]:
    """Per replica (of `replicas`, default all), the global rows it uses in a
    globally shuffled epoch, in step order: its slice `[r*b, (r+1)*b)` of each
    full global step, then its share of the partial last step
    (`ShardPlan.global_order_positions`, the slicing of
    `placement="replicate"`), in the permutation's dtype.

    Example:
        >>> plan = plan_shards(10, 2, 2)
        >>> [r.tolist() for r in epoch_rows(plan, np.arange(10))]
        [[0, 1, 4, 5, 8], [2, 3, 6, 7, 9]]
    """
    # Strided views of the permutation, not `global_order_positions`' index
    # arrays: one output array per replica is all the host memory it takes
    # (8 bytes a row and a few temporaries of it were measured on JAX's RSS).
    b, n_rep = plan.per_replica_batch_size, plan.num_replicas
    if n_rep == 1:  # its rows are the order's first ones: a view, no copy
        return [permutation[: plan.rows_per_epoch(0)]]
    full = plan.full_steps_per_epoch * plan.global_batch_size
    body = permutation[:full].reshape(plan.full_steps_per_epoch, n_rep, b)
    tail = full + np.cumsum([0, *plan.last_step_rows]) if plan.has_partial_step else None
    out = []
    for r in range(n_rep) if replicas is None else replicas:
        parts = [body[:, r, :].reshape(-1)]
        if tail is not None:
            parts.append(permutation[tail[r] : tail[r + 1]])
        out.append(np.concatenate(parts))
    return out


def global_destinations(
    held: list[np.ndarray], needed: list[np.ndarray], num_rows: int
) -> np.ndarray:
    """Each row's replica after the exchange: the replica that uses it, or,
    for a row no replica uses this epoch, where it is, moved only when its
    replica needs the slot (to the replicas with free slots, in order)."""
    source = _replica_of(held, num_rows)
    dest = np.full(num_rows, -1, dtype=source.dtype)
    for r, rows in enumerate(needed):
        dest[rows] = r
    unused = dest < 0
    dest[unused] = source[unused]
    del source
    capacity = np.array([len(h) for h in held])
    surplus = np.bincount(dest, minlength=len(held)) - capacity
    takers = [r for r in range(len(held)) if surplus[r] < 0]
    for r in range(len(held)):
        if surplus[r] <= 0:
            continue
        # `needed[r]` fits in r's slots, so r holds at least `surplus[r]` unused rows.
        spare = held[r][unused[held[r]]][: surplus[r]]
        for row in spare:
            while surplus[takers[0]] == 0:
                takers.pop(0)
            dest[row] = takers[0]
            surplus[takers[0]] += 1
        surplus[r] = 0
    return dest


def partial_destinations(
    held: list[np.ndarray], fraction: float, seed: int, epoch: int, num_rows: int
) -> np.ndarray:
    """Each row's replica after a partial exchange: every replica puts
    `floor(fraction * rows it holds)` of its rows, drawn from
    `(seed, epoch, replica)`, into a pool; the pool is shuffled from
    `(seed, epoch)` and dealt back in the same counts. Rows outside the
    pool stay.

    A function of which rows each replica holds, not of their slots: the
    draw is over each replica's rows in ascending order, so both backends
    (whose exchanges leave rows in different slots) hold the same rows
    epoch after epoch.

    Example:
        >>> held = [np.array([1, 0, 2]), np.array([3, 4, 5])]
        >>> d = partial_destinations(held, 0.5, 0, 0, 6)
        >>> bool((d == partial_destinations([h[::-1] for h in held], 0.5, 0, 0, 6)).all())
        True
    """
    dest = _replica_of(held, num_rows)
    pool, counts = [], []
    for r, rows in enumerate(held):
        rows = np.sort(rows)
        m = int(fraction * len(rows))
        pick = np.random.default_rng([seed, epoch, r]).permutation(len(rows))[:m]
        pool.append(rows[pick])
        counts.append(m)
    mixed = np.random.default_rng([seed, epoch]).permutation(np.concatenate(pool))
    dest[mixed] = np.repeat(np.arange(len(held)), counts)
    return dest


def partial_targets(
    held: list[np.ndarray], fraction: float, seed: int, epochs: range, num_rows: int
) -> np.ndarray:
    """Which replica holds each row after the partial exchanges of `epochs`,
    one after another, from `held` (`partial_destinations`, epoch by epoch).

    What a run that trained those epochs in turn holds: the JAX backend
    replays them from the loaded shards when it opens an epoch out of turn
    (a resumed run), so an epoch's rows per replica depend only on
    `(seed, epoch)`.

    Args:
        held: Per replica, the rows it holds before the first of `epochs`.
        fraction, seed: As in `partial_destinations`.
        epochs: The epochs to replay, in order (at least one).
        num_rows: Rows in all.

    Returns:
        `[num_rows]` int64: each row's replica after the last of `epochs`.

    Example:
        >>> once = partial_destinations([np.arange(4), np.arange(4, 8)], 0.5, 0, 0, 8)
        >>> twice = partial_targets([np.arange(4), np.arange(4, 8)], 0.5, 0, range(2), 8)
        >>> bool((twice == partial_destinations(holdings(once, 2), 0.5, 0, 1, 8)).all())
        True
    """
    if not len(epochs):
        raise ValueError(f"no epoch to replay: epochs={epochs!r} (a caller's error)")
    target = np.empty(0, np.int64)
    for i, epoch in enumerate(epochs):
        if i:
            held = holdings(target, len(held))
        target = partial_destinations(held, fraction, seed, epoch, num_rows)
    return target


def holdings(target: np.ndarray, num_replicas: int) -> list[np.ndarray]:
    """Per replica, the rows `target` gives it, ascending (int32 below 2**31 rows).

    Example:
        >>> [h.tolist() for h in holdings(np.array([1, 0, 1, 0]), 2)]
        [[1, 3], [0, 2]]
    """
    # A stable sort of replica numbers: rows grouped by replica, ascending in each.
    order = np.argsort(target, kind="stable")
    bounds = np.cumsum(np.bincount(target, minlength=num_replicas))[:-1]
    dtype = np.int32 if len(target) < 2**31 else np.int64
    return [part.astype(dtype) for part in np.split(order, bounds)]


def iter_rounds(
    held: list[np.ndarray], dest: np.ndarray, round_rows: int
) -> Iterator[Round]:
    """Cuts the moves `held -> dest` into rounds of at most `round_rows` rows
    sent and received per replica, one at a time (each round's arrays are
    made when it is taken: all rounds at once held 16 bytes a moved row).

    The transfer matrix is balanced (each replica receives as many rows as
    it sends), so it splits into cycles of replicas; a round takes flow from
    cycles while every replica on them has room, and on a cycle each replica
    sends exactly what it receives.

    Args:
        held: Per replica, the global row in each slot now.
        dest: Each global row's replica after the exchange.
        round_rows: Most rows a replica sends (and receives) per round.

    Yields:
        The rounds, in order; none when nothing moves.
    """
    n_rep = len(held)
    queues: dict[tuple[int, int], list[np.ndarray]] = {}
    slot_dtype = row_dtype(max((len(h) for h in held), default=0))
    matrix = np.zeros((n_rep, n_rep), dtype=np.int64)
    for s, rows in enumerate(held):
        targets = dest[rows]
        for d in range(n_rep):
            if d != s:
                slots = np.flatnonzero(targets == d).astype(slot_dtype)
                queues[(s, d)] = [slots, rows[slots]]
                matrix[s, d] = len(slots)
        del targets
    for counts in _round_counts(_cycles(matrix), n_rep, round_rows):
        send, arriving = [], []
        for r in range(n_rep):
            send.append(
                np.concatenate([_take(queues, (r, d), counts[r, d], 0) for d in range(n_rep)])
            )
            arriving.append(
                np.concatenate([_take(queues, (s, r), counts[s, r], 1) for s in range(n_rep)])
            )
        for s, d in zip(*np.nonzero(counts), strict=True):
            queues[(s, d)] = [q[counts[s, d] :] for q in queues[(s, d)]]
        yield Round(counts, tuple(send), tuple(arriving))


def apply_round(held: list[np.ndarray], rnd: Round) -> None:
    """Updates the layout as the round's transfer does."""
    for r, slots in enumerate(rnd.send_slots):
        held[r][slots] = rnd.arriving_rows[r]


def staged_rows_per_row(num_replicas: int, num_workers: int, backend: str | None) -> int:
    """Rows the engine's all-to-all stages on a device per row a replica sends.

    One process (device-to-device copies) and Horovod (`hvd.alltoall`): a
    send and a receive buffer, 2. Several `tf.distribute` workers: one
    all-gather per round, every replica's send buffer plus its own,
    `num_replicas + 1`. `backend=None` (not known: `memory_plan`) counts the
    all-gather for several workers, the larger.

    Example:
        >>> staged_rows_per_row(8, 2, "horovod"), staged_rows_per_row(8, 2, None)
        (2, 9)
    """
    if num_workers == 1 or backend == "horovod":
        return 2
    return num_replicas + 1


def buffer_bytes(requested: int | Literal["auto"], plan: ShardPlan, row_bytes: int) -> int:
    """`LoadOptions.exchange_buffer_bytes` for this plan: as given, or for
    `"auto"` an eighth of the largest shard's bytes, at least 16 MiB and at
    most 256 MiB. Every rank resolves the same number (the plan is global).

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> plan = plan_shards(2**20, 2, 256, "shard", False)  # 512 Ki rows a shard
        >>> buffer_bytes("auto", plan, 732) // MIB, buffer_bytes("auto", plan, 4) // MIB
        (45, 16)
        >>> buffer_bytes(1000, plan, 4)
        1000
    """
    if requested != "auto":
        return requested
    largest = max(plan.shard_rows(r) for r in range(plan.num_replicas)) * row_bytes
    return min(AUTO_BUFFER_MAX_BYTES, max(AUTO_BUFFER_MIN_BYTES, largest // AUTO_BUFFER_SHARE))


def round_rows(buffer_bytes: int, row_bytes: int, staged_rows_per_row: int) -> int:
    """Rows per replica per round that keep one round's staging within
    `buffer_bytes` (`staged_rows_per_row` staged rows per row sent, see
    `staged_rows_per_row`).

    Raises:
        ValueError: If the buffer cannot stage one row.
    """
    rows = buffer_bytes // max(1, row_bytes * staged_rows_per_row)
    if rows < 1:
        raise ValueError(
            _errors.message(
                "`LoadOptions.exchange_buffer_bytes` must hold one round of at least one "
                "row per replica.",
                f"exchange_buffer_bytes={buffer_bytes}, row_bytes={row_bytes}, "
                f"staged_rows_per_row={staged_rows_per_row}",
                f"Use exchange_buffer_bytes >= {row_bytes * staged_rows_per_row}.",
            )
        )
    return int(rows)


def staging_bytes(
    plan: ShardPlan, row_bytes: int, buffer_bytes: int, staged_rows_per_row: int
) -> int:
    """Device bytes per replica a global-order exchange may stage: the
    buffer, or less when `staged_rows_per_row` (see `staged_rows_per_row`)
    whole shards are smaller; 0 on one replica."""
    if plan.num_replicas == 1 or plan.placement != "shard":
        return 0
    largest = max(plan.shard_rows(r) for r in range(plan.num_replicas)) * row_bytes
    return min(buffer_bytes, staged_rows_per_row * largest)


def _replica_of(held: list[np.ndarray], num_rows: int) -> np.ndarray:
    source = np.empty(num_rows, dtype=_replica_dtype(len(held)))
    for r, rows in enumerate(held):
        source[rows] = r
    return source


def _take(queues, key, count, which) -> np.ndarray:
    if key not in queues or count == 0:
        return np.zeros(0, dtype=np.int32)
    return queues[key][which][:count]


def _cycles(matrix: np.ndarray) -> list[tuple[list[int], int]]:
    """Splits a balanced transfer matrix (zero diagonal) into cycles with flows."""
    matrix = matrix.copy()
    cycles = []
    while matrix.any():
        start = int(np.flatnonzero(matrix.sum(axis=1))[0])
        path, seen, node = [start], {start: 0}, start
        while True:
            # A replica reached by a transfer receives rows, so it also sends some.
            node = int(np.flatnonzero(matrix[node])[0])
            if node in seen:
                cycle = path[seen[node] :]
                break
            seen[node] = len(path)
            path.append(node)
        edges = list(zip(cycle, cycle[1:] + cycle[:1], strict=True))
        flow = int(min(matrix[s, d] for s, d in edges))
        for s, d in edges:
            matrix[s, d] -= flow
        cycles.append((cycle, flow))
    return cycles


def _round_counts(cycles, n_rep: int, round_rows: int) -> list[np.ndarray]:
    left = [flow for _, flow in cycles]
    out = []
    while any(left):
        room = np.full(n_rep, round_rows, dtype=np.int64)
        counts = np.zeros((n_rep, n_rep), dtype=np.int64)
        for i, (cycle, _) in enumerate(cycles):
            amount = min(left[i], int(room[cycle].min()))
            if amount <= 0:
                continue
            for s, d in zip(cycle, cycle[1:] + cycle[:1], strict=True):
                counts[s, d] += amount
            room[cycle] -= amount
            left[i] -= amount
        out.append(counts)
    return out
