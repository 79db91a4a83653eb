"""The device side of an epoch's order on JAX: rows moved in place, or copied into step order.

`relayout` runs `_data/relayout.py`'s rounds on the resident tables (one
`lax.all_to_all` in `shard_map` per round, tables donated). With an epoch copy,
each replica's rows are gathered into step order (`gather_local`), or exchanged
in one all-to-all whose moves are computed in NumPy (`moves`, `exchange`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardfeed._data.relayout import Round
from shardfeed._jax.world import REPLICA_AXIS, World

# `send_rows` is rounded up to a multiple of this share of a replica's epoch
# rows, so it rarely changes between epochs (each new size compiles the
# exchange once) and pads at most this much.
SEND_ROUNDING = 1 / 16


class Moves(NamedTuple):
    """Who sends which rows in the all-to-all of one epoch (global replica order).

    Attributes:
        send: `[num_replicas (source), num_replicas (destination), send_rows]`
            int32: rows of the source's buffer to send to each destination
            (padding: row 0).
        take: `[num_replicas (destination), slots]` int32: for each slot of
            the destination's epoch copy, its position in what it received
            (`source * send_rows + k`; padding: 0).
    """

    send: np.ndarray
    take: np.ndarray

    @property
    def send_rows(self) -> int:
        return int(self.send.shape[2])


def staging_rows(slots: int, num_replicas: int) -> int:
    """Rows one replica's exchange stages (sent plus received), as the memory
    check counts them: an even share of its epoch's slots to each replica,
    rounded as `moves` rounds, plus one rounding step for an uneven draw.
    An estimate: a permutation sends about evenly; `moves` gives the exact count."""
    step = max(1, int(np.ceil(slots * SEND_ROUNDING)))
    even = -(-slots // num_replicas)
    return 2 * num_replicas * (-(-even // step) * step + step)


def moves(
    rows: Sequence[np.ndarray], starts: Sequence[int], slots: int
) -> Moves:
    """The all-to-all that brings every replica its epoch's rows.

    Args:
        rows: Per destination replica, the global rows it takes in step order.
        starts: Per replica, the first global row its buffer holds (sharded:
            contiguous ranges in replica order).
        slots: Slots of each replica's epoch copy (`steps * per_replica_batch_size`).

    Returns:
        The `Moves`; `send_rows` is the largest count one replica sends
        another, rounded up to a multiple of `SEND_ROUNDING` of `slots`.

    Example:
        >>> m = moves([np.array([2, 0]), np.array([1, 3])], [0, 2], 2)
        >>> m.send[:, 0, 0].tolist(), m.take[0].tolist()  # to replica 0: row 0, then row 2
        ([0, 0], [1, 0])
    """
    n_rep = len(rows)
    bounds = np.asarray(starts, dtype=np.int64)
    owners = [np.searchsorted(bounds, r, side="right") - 1 for r in rows]
    counts = np.stack([np.bincount(o, minlength=n_rep) for o in owners])  # [dst, src]
    step = max(1, int(np.ceil(slots * SEND_ROUNDING)))
    send_rows = max(1, -(-int(counts.max(initial=1)) // step) * step)
    send = np.zeros((n_rep, n_rep, send_rows), np.int32)
    take = np.zeros((n_rep, slots), np.int32)
    for dst, (need, owner) in enumerate(zip(rows, owners, strict=True)):
        # Grouped by source, each group in the order `dst` takes its rows: a stable
        # sort of small ints is NumPy's radix sort, linear for any number of replicas.
        order = np.argsort(owner.astype(np.int16 if n_rep < 2**15 else np.int32), kind="stable")
        src = owner[order]
        first = np.concatenate([[0], np.cumsum(counts[dst])[:-1]])
        k = np.arange(len(need)) - first[src]  # position within its source's block
        send[src, dst, k] = need[order] - bounds[src]
        take[dst, order] = src * send_rows + k
    return Moves(send, take)


def local_array(world: World, per_replica: Sequence[np.ndarray]) -> jax.Array:
    """A global array sharded along rows from each global replica's part
    (every process passes all parts, computed alike; it uploads its own)."""
    parts = [per_replica[g] for g in world.global_replica_ids]
    buffers = [jax.device_put(p, d) for p, d in zip(parts, world.local_devices, strict=True)]
    shape = (len(per_replica) * parts[0].shape[0], *parts[0].shape[1:])
    return jax.make_array_from_single_device_arrays(
        shape, NamedSharding(world.mesh, P(REPLICA_AXIS)), buffers
    )


def _write(out: jax.Array, rows: jax.Array) -> jax.Array:
    """`rows` written over all of `out` (donated: the result is its buffer).
    Not `out.at[:].set(rows)`, a scatter: inside `jax.shard_map` over 2 or more
    devices, JAX 0.11.2's CPU compiler segfaults on it."""
    return lax.dynamic_update_slice_in_dim(out, rows, 0, axis=0)


@functools.cache
def _gather_fn(mesh: Mesh) -> Any:
    def gather(
        tables: tuple[jax.Array, ...], slots: jax.Array, out: tuple[jax.Array, ...]
    ) -> tuple[jax.Array, ...]:
        return tuple(
            _write(o, jnp.take(t, slots, axis=0, mode="clip"))
            for o, t in zip(out, tables, strict=True)
        )

    spec = P(REPLICA_AXIS)
    return jax.jit(
        jax.shard_map(gather, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec),
        donate_argnums=(2,),
    )


@functools.cache
def _exchange_fn(mesh: Mesh) -> Any:
    def exchange(
        tables: tuple[jax.Array, ...], send: jax.Array, take: jax.Array,
        out: tuple[jax.Array, ...],
    ) -> tuple[jax.Array, ...]:
        copies = []
        for t, o in zip(tables, out, strict=True):
            staged = jnp.take(t, send, axis=0, mode="clip")  # [R * send_rows, ...] by destination
            received = lax.all_to_all(staged, REPLICA_AXIS, 0, 0, tiled=True)  # by source
            copies.append(_write(o, jnp.take(received, take, axis=0, mode="clip")))
        return tuple(copies)

    spec = P(REPLICA_AXIS)
    return jax.jit(
        jax.shard_map(exchange, mesh=mesh, in_specs=(spec, spec, spec, spec), out_specs=spec),
        donate_argnums=(3,),
    )


@functools.cache
def _round_fn(mesh: Mesh) -> Any:
    def round_(
        tables: tuple[jax.Array, ...], send: jax.Array, receive: jax.Array
    ) -> tuple[jax.Array, ...]:
        out = []
        for t in tables:
            staged = jnp.take(t, send, axis=0, mode="clip")  # by destination
            received = lax.all_to_all(staged, REPLICA_AXIS, 0, 0, tiled=True)  # by source
            # Padding is sent to slot `len(t)`, out of range: dropped.
            out.append(t.at[receive].set(received, mode="drop"))
        return tuple(out)

    spec = P(REPLICA_AXIS)
    return jax.jit(
        jax.shard_map(round_, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec),
        donate_argnums=(0,),
    )


def relayout(
    world: World, tables: tuple[jax.Array, ...], moves: Iterable[Round]
) -> tuple[jax.Array, ...]:
    """Runs `_data/relayout.py`'s rounds on the resident tables, in place
    (donated: `tables` are deleted), and returns them: each round stages at
    most its `[num_replicas, rows_per_pair]` rows sent and received per replica."""
    fn = _round_fn(world.mesh)
    for r in moves:
        n_rep = r.send.shape[0]
        send = local_array(world, [r.send[s].reshape(-1) for s in range(n_rep)])
        receive = local_array(world, [r.receive[d].reshape(-1) for d in range(n_rep)])
        tables = fn(tables, send, receive)
    # Done before the caller's host work: a round's staging is freed once it ran.
    return jax.block_until_ready(tables)


@functools.cache
def _zeros_fn(mesh: Mesh, shapes: tuple[tuple[tuple[int, ...], Any], ...]) -> Any:
    sharding = NamedSharding(mesh, P(REPLICA_AXIS))
    return jax.jit(
        lambda: tuple(jnp.zeros(shape, dtype) for shape, dtype in shapes),
        out_shardings=tuple(sharding for _ in shapes),
    )


def _copy_shapes(
    world: World, tables: tuple[jax.Array, ...], slots: int
) -> tuple[tuple[tuple[int, ...], Any], ...]:
    return tuple(((world.num_replicas_in_sync * slots, *t.shape[1:]), t.dtype) for t in tables)


def fits(
    spare: tuple[jax.Array, ...] | None, world: World, tables: tuple[jax.Array, ...], slots: int
) -> bool:
    """Whether `spare` (a closed epoch's copy) can take an epoch copy of
    `slots` rows a replica of `tables`: the same shapes, dtypes and sharding."""
    if spare is None or len(spare) != len(tables):
        return False
    return all(
        not o.is_deleted() and (o.shape, o.dtype) == shape
        and o.sharding.is_equivalent_to(t.sharding, t.ndim)
        for o, t, shape in zip(spare, tables, _copy_shapes(world, tables, slots), strict=True)
    )


def new_copy(world: World, tables: tuple[jax.Array, ...], slots: int) -> tuple[jax.Array, ...]:
    """Zeroed buffers for an epoch copy of `slots` rows a replica of `tables`."""
    return _zeros_fn(world.mesh, _copy_shapes(world, tables, slots))()


def gather_local(
    world: World, tables: tuple[jax.Array, ...], slots: Sequence[np.ndarray],
    out: tuple[jax.Array, ...],
) -> tuple[jax.Array, ...]:
    """Each replica's epoch copy of rows it holds: `slots[g]` are positions in
    global replica `g`'s buffer, all replicas' of one length; written into
    `out` (donated: a closed epoch's copy that `fits`, or a `new_copy`)."""
    positions = local_array(world, [s.astype(np.int32) for s in slots])
    return _gather_fn(world.mesh)(tables, positions, out)


def exchange(
    world: World, tables: tuple[jax.Array, ...], plan_moves: Moves,
    out: tuple[jax.Array, ...],
) -> tuple[jax.Array, ...]:
    """Each replica's epoch copy of rows any replica holds (`moves`'s all-to-all);
    `out` as in `gather_local`."""
    n_rep = plan_moves.send.shape[0]
    send = local_array(world, [plan_moves.send[s].reshape(-1) for s in range(n_rep)])
    take = local_array(world, list(plan_moves.take))
    return _exchange_fn(world.mesh)(tables, send, take, out)
