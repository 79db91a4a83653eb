"""Moving sharded rows in place for an epoch's global order, in bounded rounds (JAX's exchange).

Pure NumPy: which replica holds each row this epoch (`targets`) and the rounds
that move them (`rounds`), each at most `rows_per_pair` rows per pair of
replicas, arriving only in emptied slots. Apart from `exchange.py` because it
keeps 4 bytes a row or less on the host and its rounds have the fixed shape one
`lax.all_to_all` takes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np


class Round(NamedTuple):
    """One round of moves, global replica order.

    Attributes:
        send: `[source, destination, rows_per_pair]` int32: slots of the
            source's buffer whose rows go to each destination (padding: 0).
        receive: `[destination, source, rows_per_pair]` int32: the slot each
            received row is written to (padding: `slots`, out of range, dropped).
    """

    send: np.ndarray
    receive: np.ndarray


def targets(layout: Sequence[np.ndarray], rows: Sequence[np.ndarray]) -> np.ndarray:
    """Which replica holds each global row after the move.

    Args:
        layout: Per replica, the global row in each of its slots (its shard's
            count of them).
        rows: Per replica, the global rows it takes this epoch (at most its
            shard's count: a training plan never gives a replica more).

    Returns:
        `[num_rows]` (int16 below 32,768 replicas): the replica of each row.
        A replica keeps the rows nobody takes that it holds, up to its
        count; the others fill the replicas with room left, in replica order.

    Example:
        >>> targets([np.array([0, 1]), np.array([2, 3])], [np.array([3]), np.array([0])]).tolist()
        [1, 0, 1, 0]
    """
    counts = np.array([len(held) for held in layout])
    num_rows = int(counts.sum())
    # Replica numbers: 2 bytes a row (a 4-byte row number is what the host keeps otherwise).
    dtype = np.int16 if len(layout) < 2**15 else np.int32
    target: np.ndarray = np.full(num_rows, -1, dtype)
    for g, taken in enumerate(rows):
        if len(taken) > counts[g]:
            raise ValueError(
                f"replica {g} takes {len(taken)} rows but holds {counts[g]} (a plan error)"
            )
        target[taken] = g
    room = counts - np.bincount(target[target >= 0], minlength=len(layout))
    for g, held in enumerate(layout):
        kept = held[target[held] < 0][: room[g]]  # nobody takes them: they stay
        target[kept] = g
        room[g] -= len(kept)
    # The rest of the rows nobody takes: to the replicas with room, in order.
    left = np.flatnonzero(target < 0)
    target[left] = np.searchsorted(np.cumsum(room), np.arange(len(left)), side="right")
    return target


def rows_per_pair(num_replicas: int, row_bytes: int, buffer_bytes: int) -> int:
    """Rows each replica sends each other one per round so that a round stages
    (sends plus receives, `2 * num_replicas` blocks) at most `buffer_bytes`.

    Example:
        >>> rows_per_pair(2, 128, 2**20)
        2048
    """
    return max(1, buffer_bytes // (2 * num_replicas * max(1, row_bytes)))


def staging_bytes(num_replicas: int, row_bytes: int, buffer_bytes: int, most_rows: int) -> int:
    """Device bytes one replica's rounds stage at most (sends plus receives):
    `2 * num_replicas` blocks of `rows_per_pair` rows, or of the power of two
    `rounds` rounds the largest move up to, when `most_rows` (the most rows
    one replica can send another: a shard, or a partial exchange's pool) is
    smaller.

    Example:
        >>> staging_bytes(2, 128, 2**20, 10**6), staging_bytes(2, 128, 2**20, 100)
        (1048576, 65536)
    """
    per_pair = rows_per_pair(num_replicas, row_bytes, buffer_bytes)
    per_pair = min(per_pair, 1 << max(0, most_rows - 1).bit_length())
    return 2 * num_replicas * per_pair * max(1, row_bytes)


def rounds(
    layout: Sequence[np.ndarray], target: np.ndarray, slots: int, per_pair: int
) -> tuple[Iterator[Round], list[np.ndarray]]:
    """The rounds that move every row to its `target` replica, and the layout after.

    The rounds are made one at a time as they are consumed (the host holds
    one round's indices, not every round's), and the layout after them is
    complete once they all are: `layout`'s own arrays, updated in place (no
    second copy of it on the host).

    Args:
        layout: Per replica, the global row in each of its slots; each keeps
            its count (`targets` gives every replica as many rows as it holds).
        target: The replica of each global row (`targets`).
        slots: Slots of each replica's buffer (the receive padding's index).
        per_pair: Most rows one replica sends another in a round (fewer when
            no pair moves that many: the largest move, rounded up to a power of 2).

    Returns:
        The rounds, in order, and per replica the global row in each slot after them.

    Example:
        >>> moves, after = rounds([np.array([0, 1]), np.array([2, 3])],
        ...                       np.array([1, 0, 1, 0]), 2, 8)
        >>> len(list(moves)), [a.tolist() for a in after]
        (1, [[3, 1], [2, 0]])
    """
    after = list(layout)
    return _rounds(after, target, slots, per_pair), after


def _rounds(
    after: list[np.ndarray], target: np.ndarray, slots: int, per_pair: int
) -> Iterator[Round]:
    n_rep = len(after)
    # Per (source, destination): the source's slots whose rows go there, in slot order.
    pending = [[np.empty(0, np.int32)] * n_rep for _ in range(n_rep)]
    for s, held in enumerate(after):
        dest = target[held]
        moving = np.flatnonzero(dest != s).astype(np.int32)
        order = np.argsort(dest[moving], kind="stable")
        bounds = np.searchsorted(dest[moving][order], np.arange(n_rep + 1))
        for d in range(n_rep):
            pending[s][d] = moving[order[bounds[d] : bounds[d + 1]]]
        del dest, moving, order
    del target  # 4 bytes a row, not needed past here
    done = np.zeros((n_rep, n_rep), np.int64)
    total = np.array([[len(p) for p in row] for row in pending], np.int64)
    # No more staging than the largest move needs, a power of two (few compiles).
    most = int(total.max(initial=1))
    per_pair = min(per_pair, 1 << max(0, most - 1).bit_length())
    # Each replica's emptied slots not yet written, oldest first.
    free: list[list[np.ndarray]] = [[] for _ in range(n_rep)]
    free_count = np.zeros(n_rep, np.int64)
    while (left := total - done).any():
        k = _round_counts(left, free_count, per_pair)
        send = np.zeros((n_rep, n_rep, per_pair), np.int32)
        receive = np.full((n_rep, n_rep, per_pair), slots, np.int32)
        moved_rows = [[np.empty(0, np.int64)] * n_rep for _ in range(n_rep)]
        for s in range(n_rep):
            for d in range(n_rep):
                if k[s, d]:
                    taken = pending[s][d][done[s, d] : done[s, d] + k[s, d]]
                    send[s, d, : k[s, d]] = taken
                    moved_rows[s][d] = after[s][taken]
                    free[s].append(taken)
            free_count[s] += k[s].sum()
        for d in range(n_rep):
            need = int(k[:, d].sum())
            if not need:
                continue
            pool = np.concatenate(free[d])
            into, rest = pool[:need], pool[need:]
            free[d] = [rest] if len(rest) else []
            free_count[d] -= need
            at = 0
            for s in range(n_rep):
                n = k[s, d]
                receive[d, s, :n] = into[at : at + n]
                after[d][into[at : at + n]] = moved_rows[s][d]
                at += n
        done += k
        yield Round(send, receive)


def _round_counts(left: np.ndarray, free: np.ndarray, per_pair: int) -> np.ndarray:
    """Rows each pair moves in the next round: at most `per_pair`, and no
    replica receives more than it has emptied (its free slots plus this
    round's sends). Never all zero while rows are left: the moves left form
    a circulation once no receiver has a free slot, so a cycle of them fits."""
    k = np.minimum(left, per_pair)
    while True:
        over = k.sum(axis=0) - free - k.sum(axis=1)
        if (over <= 0).all():
            break
        for d in np.flatnonzero(over > 0):
            cut = int(over[d])
            for src in np.argsort(-k[:, d], kind="stable"):  # the largest senders first
                less = min(cut, int(k[src, d]))
                k[src, d] -= less
                cut -= less
                if not cut:
                    break
    if k.any():
        return k
    cycle = _cycle(left > 0)
    amount = min(per_pair, *(int(left[edge]) for edge in cycle))
    for edge in cycle:
        k[edge] = amount
    return k


def _cycle(edges: np.ndarray) -> list[tuple[int, int]]:
    """A directed cycle among `edges[s, d]` (one exists: see `_round_counts`)."""
    start = int(np.flatnonzero(edges.any(axis=1))[0])
    path, seen = [start], {start: 0}
    while True:
        nxt = int(np.flatnonzero(edges[path[-1]])[0])
        if nxt in seen:
            return list(itertools.pairwise([*path[seen[nxt] :], nxt]))
        seen[nxt] = len(path)
        path.append(nxt)
