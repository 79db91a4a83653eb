"""Streaming on TensorFlow: a shard too large for the device flows through a two-slot ring.

`StreamedRows`, `StreamingOrder`: each replica gets two slots of `chunk_rows`
rows; a background thread reads and uploads the next chunk while the loop trains
on the other, and no call spans two chunks. Each row once per epoch; the
shuffle is two-level (chunk order, then rows within a chunk); `placement="shard"` only.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._data.memory import stream_chunk_steps
from shardfeed._data.options import LoadOptions
from shardfeed._data.plan import ShardPlan
from shardfeed._data.sources import Columns
from shardfeed._tf.storage import ReplicaStore, allocate, write_rows


@dataclasses.dataclass(frozen=True)
class StreamLayout:
    """How shards stream: `chunk_steps` steps per chunk, two slots per replica."""

    chunk_steps: int
    per_replica_batch_size: int

    @property
    def chunk_rows(self) -> int:
        return self.chunk_steps * self.per_replica_batch_size

    def num_chunks(self, shard_rows: int) -> int:
        return max(1, -(-shard_rows // self.chunk_rows))


def stream_layout(
    plan: ShardPlan, row_bytes: int, usable_bytes: int | None, options: LoadOptions
) -> StreamLayout:
    """Chooses the chunk: `options.stream_chunk_bytes` per slot, shrunk so two
    slots fit in `usable_bytes`, and never more steps than a shard has.

    Raises:
        ValueError: For `placement="replicate"`.
        MemoryError: If not even two steps' rows fit.
    """
    if plan.placement != "shard":
        raise ValueError(
            _errors.message(
                "Streaming needs placement='shard' (each replica streams its own rows).",
                f"placement={plan.placement!r}",
                "Use placement='shard', or give each replica enough memory to hold every row.",
            )
        )
    b = plan.per_replica_batch_size
    steps = stream_chunk_steps(plan, row_bytes, usable_bytes, options.stream_chunk_bytes)
    if steps < 1:
        raise MemoryError(
            _errors.message(
                "Streaming needs room for two chunks of at least one step each.",
                f"per_replica_batch_size={b}, row_bytes={row_bytes}, "
                f"usable_bytes={usable_bytes}, stream_chunk_bytes={options.stream_chunk_bytes}",
                "Lower `per_replica_batch_size`, store a compact dtype, or use more replicas.",
            )
        )
    return StreamLayout(chunk_steps=int(steps), per_replica_batch_size=b)


def allocate_rings(
    columns: Columns,
    plan: ShardPlan,
    stream: StreamLayout,
    replica_ids: Sequence[int],
    devices: Sequence[str],
) -> tuple[ReplicaStore, ...]:
    """One two-slot ring per column on each local replica's device."""
    stores = []
    for replica, device in zip(replica_ids, devices, strict=True):
        start, stop = plan.shards[replica]
        rows = 2 * min(stream.chunk_rows, max(1, stop - start))
        variables = tuple(allocate((rows, *c.row_shape), c.dtype, device) for c in columns.columns)
        stores.append(ReplicaStore(replica, device, start, stop, variables))
    return tuple(stores)


class StreamedRows:
    """The `Residency` of streamed shards: each epoch refills the rings.

    Args:
        columns: Where rows are read.
        stores: The local rings.
        stream: The chunk size.
        seed: The dataset's seed.
        shuffle: The dataset's `shuffle` (training epochs only).
        options: Read options.
    """

    streamed = True

    def __init__(
        self,
        columns: Columns,
        stores: Sequence[ReplicaStore],
        stream: StreamLayout,
        seed: int | None,
        shuffle: bool | str,
        options: LoadOptions,
    ) -> None:
        self._columns, self._stores, self._stream = columns, stores, stream
        self._seed, self._shuffle, self._options = seed, shuffle, options

    def exclusive(self, training: bool) -> bool:
        return True  # one ring per replica: two open epochs would refill it

    def epoch_order(self, plan: ShardPlan, epoch: int, training: bool) -> StreamingOrder:
        seed = self._seed if self._shuffle and training else None
        return StreamingOrder(
            self._columns, self._stores, plan, self._stream, seed, epoch, self._options
        )


class StreamingOrder:
    """One epoch of a streamed dataset: index slices into the rings, the global
    rows they stand for, and the chunk uploads that must precede each call.

    Args:
        columns: Where rows are read.
        stores: The local rings.
        plan: The epoch's plan.
        stream: The chunk size.
        seed: Shuffle seed, or None for the rows' own order.
        epoch: Epoch number (seeds the shuffle).
        options: Read options (chunk bytes per transfer, finite checks).
    """

    def __init__(
        self,
        columns: Columns,
        stores: Sequence[ReplicaStore],
        plan: ShardPlan,
        stream: StreamLayout,
        seed: int | None,
        epoch: int,
        options: LoadOptions,
    ) -> None:
        self._columns, self._stores, self._plan = columns, stores, plan
        self._stream, self._options = stream, options
        b, steps = plan.per_replica_batch_size, plan.steps_per_epoch
        self._chunk_ids: list[list[int]] = []
        self._positions: list[np.ndarray] = []
        self._rows: list[np.ndarray] = []
        for store in stores:
            ids, positions, rows = self._replica_order(store, seed, epoch)
            used = plan.rows_per_epoch(store.replica)
            pad = steps * b - used
            self._chunk_ids.append(ids)
            self._positions.append(np.pad(positions[:used], (0, pad)).reshape(steps, b))
            self._rows.append(np.pad(rows[:used], (0, pad)).reshape(steps, b))
        chunk_steps = stream.chunk_steps
        self.call_bounds = list(range(0, steps, chunk_steps))
        self._uploads: dict[int, concurrent.futures.Future] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "shardfeed-stream")

    def _replica_order(self, store: ReplicaStore, seed: int | None, epoch: int):
        n, chunk_rows = store.num_rows, self._stream.chunk_rows
        chunks = self._stream.num_chunks(n)
        rng = None if seed is None else np.random.default_rng([seed, epoch, store.replica])
        ids = list(range(chunks))
        if rng is not None and chunks > 2:
            ids[:-1] = rng.permutation(chunks - 1).tolist()  # the short chunk stays last
        positions, rows = [], []
        for p, cid in enumerate(ids):
            m = min(chunk_rows, n - cid * chunk_rows)
            within = np.arange(m) if rng is None else rng.permutation(m)
            positions.append((p % 2) * chunk_rows + within)
            rows.append(store.row_start + cid * chunk_rows + within)
        return ids, np.concatenate(positions), np.concatenate(rows)

    # -- what the loop uses ----------------------------------------------------

    def prepare(self, start: int, stop: int) -> None:
        """Makes steps `[start, stop)` resident, then starts the next upload.

        A call never spans two chunks (`call_bounds`): the next chunk's upload
        overwrites the slot the previous call used.
        """
        position = start // self._stream.chunk_steps
        if (stop - 1) // self._stream.chunk_steps != position:
            raise RuntimeError(f"steps [{start}, {stop}) cross a streamed chunk's boundary")
        self._upload(position).result()
        self._upload(position + 1)

    def slice(self, start: int, stop: int) -> list[tf.Tensor]:
        out = []
        for positions, store in zip(self._positions, self._stores, strict=True):
            with tf.device(store.device):
                out.append(tf.constant(positions[start:stop], dtype=tf.int32))
        return out

    def rows(self, local: int) -> np.ndarray:
        return self._rows[local].reshape(-1)

    def release(self) -> None:
        pass  # streamed rows never move between replicas, so no epoch makes this stale

    def close(self) -> None:
        for future in self._uploads.values():
            future.cancel()
        self._executor.shutdown(wait=True)

    # -- uploads ---------------------------------------------------------------

    def _upload(self, position: int) -> concurrent.futures.Future:
        future = self._uploads.get(position)
        if future is None:
            future = self._executor.submit(self._write_chunk, position)
            self._uploads[position] = future
            self._uploads.pop(position - 2, None)  # its slot is being overwritten
        return future

    def _write_chunk(self, position: int) -> None:
        chunk_rows = self._stream.chunk_rows
        for ids, store in zip(self._chunk_ids, self._stores, strict=True):
            if position >= len(ids):
                continue  # this replica's shard has fewer chunks: its steps are padding
            start = store.row_start + ids[position] * chunk_rows
            stop = min(store.row_stop, start + chunk_rows)
            for column, variable in zip(self._columns.columns, store.variables, strict=True):
                write_rows(
                    column,
                    start,
                    stop,
                    variable,
                    (position % 2) * chunk_rows,
                    store.device,
                    self._options,
                )
