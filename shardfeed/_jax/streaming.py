"""Streaming on JAX: a shard that does not fit flows through a two-slot ring (`StreamedEpoch`).

Rows stay on the host; each epoch's resident order is cut into chunks of whole
steps, each assembled on the host in step order by a background thread and
uploaded while the previous one trains. A compiled call never crosses a chunk
(`call_bounds`). The host assembles the order because it holds every row anyway.
"""

from __future__ import annotations

import concurrent.futures
import math
from typing import Any, Literal, Protocol

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardfeed._common import errors as _errors
from shardfeed._data import memory as _memory
from shardfeed._data import order as _order
from shardfeed._data.batch import Batch
from shardfeed._data.options import LoadOptions
from shardfeed._data.plan import EpochSizes, ShardPlan
from shardfeed._data.sources import Column
from shardfeed._jax import storage as _storage
from shardfeed._jax.epoch import BatchFn, EpochArrays, ResidentEpoch
from shardfeed._jax.world import REPLICA_AXIS, World, replicated


class StreamSource(Protocol):
    """What a streamed epoch reads of its dataset (`ShardedResidentDataset`,
    which imports this module: typed here, so `streaming` never imports `dataset`)."""

    @property
    def world(self) -> World: ...
    @property
    def columns(self) -> Any: ...
    @property
    def load_options(self) -> LoadOptions: ...
    @property
    def shuffle(self) -> bool | Literal["local"]: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def moves_rows(self) -> bool: ...
    def batch_fn(self, per_replica_batch_size: int, augment: bool) -> BatchFn: ...
    def opened(self, epoch: ResidentEpoch) -> None: ...


def slot_rows(
    world: World, plan: ShardPlan, row_bytes: int, usable_per_replica: int | None,
    options: LoadOptions,
) -> int:
    """Rows of one ring slot: `stream_chunk_bytes`, shrunk so two slots fit
    in a replica's usable bytes, whole steps, never more steps than an epoch.

    Raises:
        MemoryError: If not even one step's rows fit twice.
    """
    steps = _memory.stream_chunk_steps(
        plan, row_bytes, usable_per_replica, options.stream_chunk_bytes
    )
    if steps < 1:
        raise MemoryError(
            _errors.message(
                "Streaming needs room for two chunks of at least one step each.",
                f"per_replica_batch_size={plan.per_replica_batch_size}, row_bytes={row_bytes}, "
                f"usable_bytes={usable_per_replica}, "
                f"stream_chunk_bytes={options.stream_chunk_bytes}",
                "Lower `per_replica_batch_size`, store a compact dtype, or use more replicas.",
            )
        )
    return max(1, min(steps, plan.full_steps_per_epoch)) * plan.per_replica_batch_size


def usable_per_replica(reports: list[_memory.MemoryReport], world: World) -> int | None:
    """Usable bytes per local replica (CPU devices share the host's RAM: one
    report for all of them)."""
    usable = [r.usable_bytes for r in reports if r.usable_bytes is not None]
    if not usable:
        return None
    shared = 1 if len(reports) > 1 else len(world.local_devices)
    return min(usable) // shared


def ring_reports(
    world: World, plan: ShardPlan, row_bytes: int, rows_per_slot: int, options: LoadOptions
) -> list[_memory.MemoryReport]:
    """The memory check of a streamed dataset: two slots per replica, no rows."""
    return _storage.memory_reports(world, plan, 0, 2 * rows_per_slot * row_bytes, options)


def take_rows(column: Column, rows: np.ndarray, options: LoadOptions) -> np.ndarray:
    """`column`'s rows at `rows` (global numbers, any order), in that order,
    in the dtype the devices hold (`storage.stored_dtype`)."""
    dtype = _storage.stored_dtype(column.dtype)
    if isinstance(column.data, np.ndarray):  # NumPy and `np.memmap`: one gather
        out = np.ascontiguousarray(column.data[rows], dtype=column.dtype)
        if options.check_finite and out.dtype.kind in "fc" and not np.isfinite(out).all():
            bad = int(np.flatnonzero(~np.isfinite(out.reshape(len(out), -1)).all(axis=1))[0])
            column.read(int(rows[bad]), int(rows[bad]) + 1, True)  # raises, naming the row
    else:
        # Ranged reads in row order, a window at a time (files read forwards).
        out = np.empty((len(rows), *column.row_shape), column.dtype)
        order = np.argsort(rows, kind="stable")
        ranked = rows[order]
        window = max(1, options.chunk_bytes // max(1, column.row_bytes))
        i = 0
        while i < len(ranked):
            first = int(ranked[i])
            j = int(np.searchsorted(ranked, first + window, side="left"))
            block = column.read(first, int(ranked[j - 1]) + 1, options.check_finite)
            out[order[i:j]] = block[ranked[i:j] - first]
            i = j
    if len(rows):
        _storage.check_range(column, out, int(rows.min()), dtype)
    return out.astype(dtype, copy=False)


def host_label_stats(
    column: Column, plan: ShardPlan, replica_ids: tuple[int, ...], ignore: int | None,
    options: LoadOptions,
) -> list[np.ndarray]:
    """`labels.label_stats` of rows on the host, read in chunks: per local
    replica, float64 `[min, max, fractional]` of its rows."""
    dtype = _storage.stored_dtype(column.dtype)
    step = max(1, options.chunk_bytes // max(1, column.row_bytes))
    out = []
    for replica in replica_ids:
        start, stop = plan.shards[replica]
        low, high, fractional = np.inf, -np.inf, 0.0
        for first in range(start, stop, step):
            values = column.read(first, min(stop, first + step)).astype(dtype, copy=False)
            if values.dtype == np.bool_:
                values = values.astype(np.int8)
            if ignore is not None:
                values = np.where(values == ignore, np.zeros_like(values), values)
            if values.dtype.kind == "f":
                fractional = max(fractional, float(np.any(values != np.floor(values))))
            low = float(np.min([low, np.min(values).astype(np.float32)]))
            high = float(np.max([high, np.max(values).astype(np.float32)]))
        out.append(np.array([low, high, fractional]))
    return out


class StreamedEpoch(ResidentEpoch):
    """One epoch of a streamed JAX dataset: the resident epoch's steps and
    batches, with the rows brought to the devices a chunk at a time.

    What differs from a resident epoch: `arrays` is None; `call_arrays(start,
    stop)` hands out the chunk holding steps `[start, stop)` (which must not
    cross `call_bounds`), for `batch_fn(arrays, step)` with the epoch's own
    step numbers; a traced `batch(step)` is refused.
    """

    chunk_steps: int

    def __init__(
        self,
        dataset: StreamSource,
        plan: ShardPlan,
        epoch: int,
        training: bool,
        first_step: int,
        augment: bool,
        rows_per_slot: int,
    ) -> None:
        # The resident epoch's sizes, without its arrays: the rows stream in.
        EpochSizes.__init__(self, plan, epoch, training, first_step)
        world = dataset.world
        self._world, self._mesh = world, world.mesh
        self._columns, self._options = dataset.columns, dataset.load_options
        self.batch_fn = dataset.batch_fn(plan.per_replica_batch_size, augment)
        b = plan.per_replica_batch_size
        # A batch larger than the slot (a resumed plan's) still streams a step at a time.
        self.chunk_steps = max(1, min(rows_per_slot // b, max(1, plan.full_steps_per_epoch)))
        self._rows = _order.epoch_rows(
            plan, dataset.shuffle, dataset.seed, epoch, training, dataset.moves_rows
        ).rows
        self.arrays = None
        self._closed = False
        self._number = jax.device_put(np.int32(epoch), NamedSharding(self._mesh, P()))
        self._full_steps = jax.device_put(
            np.int32(plan.full_steps_per_epoch), NamedSharding(self._mesh, P())
        )
        # The ring: chunk index -> its upload (at most two: in use, and next).
        self._slots: dict[int, concurrent.futures.Future[EpochArrays]] = {}
        self._current: int | None = None
        self._last: Any = None  # the last result read from the current chunk
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # What `ResidentEpoch.__init__` sets besides its resident data (not
        # called: it would load that data): the iterator's position hook.
        self._on_step = None
        dataset.opened(self)

    # -- what it is ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def num_chunks(self) -> int:
        return max(1, math.ceil(self.full_steps / self.chunk_steps))

    @property
    def call_bounds(self) -> list[int]:
        """The steps a compiled call must start at: each chunk's first step."""
        return list(range(0, max(1, self.full_steps), self.chunk_steps))

    def __repr__(self) -> str:
        return super().__repr__().replace("ResidentEpoch(", "StreamedEpoch(", 1)

    # -- batches ---------------------------------------------------------------

    def call_arrays(self, start: int, stop: int) -> EpochArrays:
        """The device data of full steps `[start, stop)`: their chunk, waited
        for; the next chunk's upload starts. Steps must not cross a chunk
        boundary (`call_bounds`)."""
        self._check_open()
        chunk = start // self.chunk_steps
        if not (0 <= start < stop <= self.full_steps) or (stop - 1) // self.chunk_steps != chunk:
            raise ValueError(
                _errors.message(
                    "A streamed epoch hands out one chunk at a time: steps `[start, stop)` "
                    "must be full steps within one chunk.",
                    f"start={start}, stop={stop}, call_bounds={self.call_bounds}, "
                    f"full_steps={self.full_steps}",
                    "Cut calls at `epoch.call_bounds` (each chunk's first step).",
                )
            )
        if chunk != self._current:
            self._advance(chunk)
        return self._slots[chunk].result()

    def ran(self, result: Any) -> None:
        """Remembers the last result read from the current chunk: before its
        slot is let go of, it is waited for (a call may still be reading it)."""
        self._last = result

    def partial_batch(self) -> Batch | None:
        """The partial last step's real rows (all replicas', in global order),
        read on the host and replicated on every device; None without one."""
        if not self.has_partial_step:
            return None
        self._check_open()
        first = self.plan.full_steps_per_epoch * self.per_replica_batch_size
        rows = np.concatenate([
            r[first : first + n] for r, n in zip(self._rows, self.plan.last_step_rows, strict=True)
        ])
        replicated = NamedSharding(self._mesh, P())
        columns = tuple(
            jax.device_put(take_rows(c, rows, self._options), replicated)
            for c in self._columns.columns
        )
        return self.batch_fn.assemble(columns, self._number, np.int32(self.steps - 1))

    def batch(self, step: Any) -> Batch:
        """The `Batch` of `step`, eagerly (its chunk streamed in first); a
        traced `step` is refused: a jitted loop takes `call_arrays(...)`."""
        if isinstance(step, jax.Array) and not isinstance(step, np.ndarray):
            raise TypeError(
                _errors.message(
                    "A streamed epoch has no `arrays` holding every step: a traced step "
                    "needs the chunk that holds it.",
                    f"step={step!r}",
                    "In a jitted loop, pass `epoch.call_arrays(start, stop)` to "
                    "`epoch.batch_fn(arrays, step)` for steps within one of `epoch.call_bounds`.",
                )
            )
        self._check_open()
        self._check_step(step)
        if step >= self.full_steps:
            batch = self.partial_batch()
            assert batch is not None
            return batch
        arrays = self.call_arrays(step, step + 1)
        out = self.batch_fn.jitted(arrays, np.int32(step))
        self.ran(out)
        return out

    def close(self) -> None:
        """Lets go of the ring (its device slots) and the upload thread."""
        self.release()
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def invalidate(self) -> None:
        self.close()

    def release(self) -> None:
        """Lets go of the ring's slots (another epoch of the dataset streams
        now); later steps stream their chunks in again."""
        if self._last is not None:
            jax.block_until_ready(self._last)
            self._last = None
        for future in self._slots.values():
            future.cancel()
            if not future.cancelled():
                future.exception()  # an upload under way ends before its slot goes
        self._slots.clear()
        self._current = None

    # -- internals -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(
                _errors.message(
                    "This streamed epoch is closed: its ring was let go of (`close()`).",
                    f"epoch={self.epoch}, training={self.training}",
                    "Open the epoch again with `dataset.epoch(...)`.",
                )
            )

    def _advance(self, chunk: int) -> None:
        """Makes `chunk` the one in use: the slot of the one before goes once
        its last call is done; the next chunk starts uploading."""
        if self._last is not None:
            jax.block_until_ready(self._last)  # the old slot is read no more
            self._last = None
        for held in [c for c in self._slots if c not in (chunk, chunk + 1)]:
            future = self._slots.pop(held)
            if not future.cancel():
                future.exception()  # an upload under way ends before its slot goes
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, "shardfeed-jax-stream")
        for c in (chunk, chunk + 1):
            if c < self.num_chunks and c not in self._slots:
                self._slots[c] = self._executor.submit(self._upload, c)
        self._current = chunk

    def _upload(self, chunk: int) -> EpochArrays:
        """Chunk `chunk` on the devices: each local replica's rows of its
        steps, in step order, padded to the slot; waited for, so its host
        rows are let go of when it returns."""
        b, steps = self.per_replica_batch_size, self.chunk_steps
        first, last = chunk * steps, min(self.full_steps, (chunk + 1) * steps)
        slot = steps * b
        world = self._world
        sharding = NamedSharding(self._mesh, P(REPLICA_AXIS))
        columns = []
        for column in self._columns.columns:
            buffers = []
            for replica, device in zip(world.global_replica_ids, world.local_devices,
                                       strict=True):
                rows = self._rows[replica][first * b : last * b]
                taken = take_rows(column, rows, self._options)
                if len(taken) < slot:  # the last chunk: padding, never handed out
                    padded = np.zeros((slot, *column.row_shape), taken.dtype)
                    padded[: len(taken)] = taken
                    taken = padded
                buffers.append(jax.device_put(taken, device))
                del taken
            shape = (self.plan.num_replicas * slot, *column.row_shape)
            columns.append(jax.make_array_from_single_device_arrays(shape, sharding, buffers))
        jax.block_until_ready(columns)
        # Not `jax.device_put` onto the mesh: across processes that is a
        # collective, and this thread's would cross the main thread's.
        start = replicated(np.int32(first), self._mesh)
        return EpochArrays(tuple(columns), self._number, None, start, self._full_steps)
