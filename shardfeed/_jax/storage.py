"""Resident storage on JAX: each column one global `jax.Array` sharded along rows, and its fit.

Device `r` holds replica `r`'s rows; each process fills only its own devices'
buffers, chunk by chunk through a jitted, donating `dynamic_update_slice` (why:
`jax.device_put` of a whole column holds a second host copy). Free bytes from
`Device.memory_stats()`, else the host's RAM, checked with `_data/memory.py`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from shardfeed._common import errors as _errors
from shardfeed._data import memory as _memory
from shardfeed._data.options import LoadOptions
from shardfeed._data.plan import ShardPlan
from shardfeed._data.sources import Column, Columns
from shardfeed._jax.world import REPLICA_AXIS, World

# `free_bytes`' source for what `jax.Device.memory_stats()` reports.
MEMORY_STATS_SOURCE = "memory_stats"


def device_name(device: Any) -> str:
    """`"GPU:<id>"` for accelerators, `"CPU:<id>"` for CPU devices: the names
    `_data/memory.py` groups (CPU devices share the host's RAM)."""
    kind = "CPU" if device.platform == "cpu" else "GPU"
    return f"{kind}:{device.id}"


def free_bytes(device: Any) -> tuple[int | None, str]:
    """Free bytes on a JAX device, and where the number came from.

    `memory_stats()` gives `bytes_limit` (the allocator's pool) and
    `bytes_in_use` where the platform keeps them (GPUs); CPU devices give
    None and share the host's RAM (`/proc/meminfo`).
    """
    try:
        stats = device.memory_stats()
    except Exception:  # a platform without the query
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), MEMORY_STATS_SOURCE
    if device.platform == "cpu":
        free = _memory.host_available_bytes()
        return free, (_memory.HOST_RAM_SOURCE if free is not None else "unknown")
    return None, "unknown"


def rows_per_replica(plan: ShardPlan) -> int:
    """Rows of each device's buffer: the largest shard (every shard padded to it)."""
    return max(1, max(stop - start for start, stop in plan.shards))


def stored_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a column is held in: as given, but 64-bit types as JAX holds
    them without `jax_enable_x64` (32-bit; what Keras on JAX feeds, too), and
    in native byte order (JAX has no big-endian dtypes: `np.arange(10,
    dtype='>f4')` raised a raw TypeError). Each chunk is byte-swapped as it is
    uploaded (`astype`: one chunk-sized host buffer at a time, never a copy
    of the column)."""
    native = np.dtype(dtype).newbyteorder("=")
    return np.dtype(jax.dtypes.canonicalize_dtype(native))


def memory_reports(
    world: World, plan: ShardPlan, row_bytes: int, extra_bytes: int, options: LoadOptions
) -> list[_memory.MemoryReport]:
    """Bytes each local device will hold (its rows plus `extra_bytes` per
    replica: an epoch's copy or positions, and staging) against its usable bytes."""
    names = {device_name(d): d for d in world.local_devices}
    needed = _memory.device_bytes(
        plan, world.global_replica_ids, list(names), row_bytes, extra_bytes,
        _memory.index_bytes_per_row(list(names), options.device_memory_bytes),
    )
    return _memory.memory_reports(
        needed,
        options.memory_fraction,
        options.device_memory_bytes,
        read_free=lambda name: free_bytes(names[name] if name in names else world.local_devices[0]),
    )


@functools.partial(jax.jit, donate_argnums=0)
def _write(buffer: jax.Array, rows: jax.Array, start: jax.Array) -> jax.Array:
    # Donated: the buffer is updated in place, never held twice on the device.
    return lax.dynamic_update_slice_in_dim(buffer, rows, start, axis=0)


def _zeros(shape: tuple[int, ...], dtype: np.dtype, device: Any) -> jax.Array:
    # Made on `device` itself: `jnp.zeros(..., device=d)` fills the buffer on the
    # default device and copies it (measured: 2 CPU devices, a 496 MB column
    # peaked at twice its size while loading).
    return jax.jit(
        functools.partial(jnp.zeros, shape, dtype), out_shardings=SingleDeviceSharding(device)
    )()


def check_range(column: Column, rows: np.ndarray, start: int, dtype: np.dtype) -> None:
    """Refuses 64-bit integers that 32 bits (JAX's default) cannot hold."""
    if rows.dtype == dtype or dtype.kind not in "iu" or not rows.size:
        return
    info = np.iinfo(dtype)
    low, high = int(rows.min()), int(rows.max())
    if low < info.min or high > info.max:
        raise ValueError(
            _errors.message(
                f"JAX holds {rows.dtype.name} columns as {dtype.name} (without "
                "`jax_enable_x64`); this column's values do not fit.",
                f"{column.name} rows from {start}: min={low}, max={high}",
                "Store the column in a dtype that holds its values (e.g. float32), or "
                "enable 64-bit JAX with `jax.config.update('jax_enable_x64', True)`.",
            )
        )


def _upload_column(
    column: Column, plan: ShardPlan, world: World, options: LoadOptions
) -> jax.Array:
    rows_each = rows_per_replica(plan)
    dtype = stored_dtype(column.dtype)
    chunk_rows = max(1, options.chunk_bytes // max(1, column.row_bytes))
    devices = world.local_devices
    buffers = [_zeros((rows_each, *column.row_shape), dtype, d) for d in devices]
    # Local replicas holding one range (replicated rows) share each chunk's read.
    holders: dict[tuple[int, int], list[int]] = {}
    for local, replica in enumerate(world.global_replica_ids):
        holders.setdefault(plan.shards[replica], []).append(local)
    for (start, stop), locals_ in holders.items():
        for first in range(start, stop, chunk_rows):
            rows = column.read(first, min(stop, first + chunk_rows), options.check_finite)
            check_range(column, rows, first, dtype)
            rows = rows.astype(dtype, copy=False)
            for local in locals_:
                chunk = jax.device_put(rows, devices[local])
                buffers[local] = _write(buffers[local], chunk, jnp.int32(first - start))
            # One chunk in flight: dispatch is asynchronous, and each queued
            # write holds its host chunk (measured: the load's peak varied by
            # 7% of the rows with the machine's load).
            jax.block_until_ready([buffers[local] for local in locals_])
    sharding = NamedSharding(world.mesh, P(REPLICA_AXIS))
    shape = (plan.num_replicas * rows_each, *column.row_shape)
    return jax.make_array_from_single_device_arrays(shape, sharding, buffers)


def upload(
    columns: Columns, plan: ShardPlan, world: World, options: LoadOptions
) -> tuple[jax.Array, ...]:
    """Allocates each column's buffers on this process's devices and fills
    them in chunks of at most `options.chunk_bytes`.

    Args:
        columns: The user's columns (read lazily, chunk by chunk).
        plan: Which rows each replica holds (the evaluation plan: nothing dropped).
        world: The replicas and their mesh.
        options: Chunk size and `check_finite`.

    Returns:
        One global array per column, `[num_replicas * rows_per_replica(plan), ...]`,
        sharded along rows over `world.mesh`; rows past a shard's end are zeros.

    Example:
        >>> tables = upload(columns, plan, current_world(), LoadOptions())
        >>> tables[0].addressable_shards[0].data.shape
        (250, 32)
    """
    return tuple(_upload_column(c, plan, world, options) for c in columns.columns)
