"""`memory_plan`: per-rank rows, bytes, steps and memory fit, before anything loads.

Arithmetic only (the shard plan times the bytes per row, against one device's
free memory, taken for every device of the cluster); reads no rows, never
imports TensorFlow, so it runs on a login node with NumPy alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

from shardfeed._common import errors as _errors
from shardfeed._common.units import MIB
from shardfeed._data import exchange as _exchange
from shardfeed._data import memadvice as _memadvice
from shardfeed._data import memory as _memory
from shardfeed._data.described import ColumnSpec, column_specs
from shardfeed._data.memnumbers import MemoryNumbers, RankMemory, WayOut
from shardfeed._data.plan import (
    Placement,
    _check_positive,
    plan_shards,
    uses_exchange,
)


class MemoryPlan(MemoryNumbers):
    """Per-rank rows, bytes, steps and memory fit of a sharded resident dataset,
    with their words: `table()` and `advice()` (`MemoryNumbers` has the
    attributes).
    """

    def table(self) -> str:
        """The plan as plain text: a summary, one aligned row per rank, the verdict.

        Returns:
            Lines joined by newlines, without a trailing newline.

        Example:
            >>> print(memory_plan({"x": ((1001, 32), "float32")}, num_workers=3,
            ...                   per_replica_batch_size=100,
            ...                   device_memory_bytes=2**30).table())
        """
        return _memadvice.table(self)

    def advice(self) -> list[str]:
        """What would make the data fit, with numbers; empty when it fits.

        Three ways out, each computed for the largest device: more replicas
        with `placement="shard"`, compact float dtypes cast back in
        `transform`, and streaming the shard in double-buffered chunks.

        Returns:
            One sentence per way out (empty when every rank fits or the free
            memory is unknown).

        Example:
            >>> plan = memory_plan({"x": ((10**8, 32), "float32")}, num_workers=1,
            ...                    per_replica_batch_size=256, device_memory_bytes=8 * 2**30)
            >>> plan.advice()[0].split(", ")[1]
            'at least 2 replicas in total keep every device within 6.40 GiB usable'
        """
        return _memadvice.advice(self)


def _free_device_bytes(device_memory_bytes: int | None) -> tuple[int | None, str]:
    # The plan is for like devices: this machine's first GPU, else its host RAM.
    if device_memory_bytes is not None:
        return device_memory_bytes, "given"
    free, source = _memory.free_bytes("GPU:0")
    if free is None:
        free, source = _memory.free_bytes("CPU:0")
    return free, source


def memory_plan(
    data: Any,
    *,
    num_workers: int,
    per_replica_batch_size: int,
    replicas_per_worker: int = 1,
    placement: Placement = "shard",
    drop_remainder: bool = False,
    device_memory_bytes: int | None = None,
    memory_fraction: float = 0.8,
    workers_per_host: int = 1,
    shuffle: bool | Literal["local"] = True,
    exchange_buffer_bytes: int | Literal["auto"] = "auto",
) -> MemoryPlan:
    """Plans where the rows go and whether each worker's devices can hold them.

    Nothing is read or allocated: only shapes and dtypes are used, so a plan
    for a terabyte of files or of arrays not yet made costs milliseconds.

    Args:
        data: What `ShardedResidentDataset` holds: an array, a list/dict of
            arrays, `shardfeed.files` leaves -- put x, y and sample_weight in
            one dict to count them all -- or, for arrays that do not exist yet,
            a dict of `name -> (shape, dtype)`, e.g.
            `{"x": ((1000000, 32), "float32")}`. Both forms may be mixed.
        num_workers: Workers (ranks, usually hosts).
        per_replica_batch_size: Rows each replica takes per step.
        replicas_per_worker: Devices per worker (e.g. 8 GPUs).
        placement: `"shard"` (each replica holds its rows) or `"replicate"`
            (each replica holds every row).
        drop_remainder: Drop a partial last step (training epochs).
        device_memory_bytes: Free bytes per device; None reads this machine:
            GPU 0 through NVML, else the host's available RAM (then a
            worker's devices share it, as logical CPU devices do).
        memory_fraction: Share of free memory the data may take; the rest is
            headroom for the model, optimizer state and activations.
        workers_per_host: Workers sharing one host, in rank order (e.g. 2
            for `shardfeed launch --num-workers 2` on one machine). When the
            devices are the host's RAM, all their shards must fit in it
            together.
        shuffle: The dataset's `shuffle`: True (the global order) with
            `placement="shard"` counts the exchange's staging buffer on
            every device; `"local"` and False need none.
        exchange_buffer_bytes: `LoadOptions.exchange_buffer_bytes` (`"auto"`:
            sized to the largest shard, as the dataset does).

    Returns:
        The `MemoryPlan`; `.table()` prints it and `.advice()` says what to
        change when it does not fit.

    Raises:
        ValueError: For non-positive counts or sizes, more workers per host
            than workers, a `memory_fraction`
            outside (0, 1], an unknown placement, arrays of different
            lengths, or a training epoch with no step (fewer rows than
            replicas).
        TypeError: For leaves that are not numeric arrays or a bad dtype.

    Example:
        >>> plan = memory_plan({"x": ((1000000, 32), "float32"), "y": ((1000000,), "int64")},
        ...                    num_workers=4, per_replica_batch_size=256,
        ...                    device_memory_bytes=16 * 1024**3)
        >>> plan.ranks[0].bytes_per_device, plan.fits
        (34000000, True)
    """
    _check_positive("num_workers", num_workers, "Pass the number of workers (ranks), e.g. 4.")
    _check_positive(
        "replicas_per_worker", replicas_per_worker, "Pass the devices per worker, e.g. 8."
    )
    _check_positive(
        "workers_per_host", workers_per_host, "Pass the workers started on each host, e.g. 1."
    )
    if workers_per_host > num_workers:
        raise ValueError(
            _errors.message(
                "`workers_per_host` must be at most `num_workers`.",
                f"workers_per_host={workers_per_host}, num_workers={num_workers}",
                "Pass the workers started on each host (all of them: num_workers).",
            )
        )
    _memory.check_memory_fraction(memory_fraction)
    if device_memory_bytes is not None and (
        isinstance(device_memory_bytes, bool)
        or not isinstance(device_memory_bytes, int)
        or device_memory_bytes < 1
    ):
        raise ValueError(
            _errors.message(
                "`device_memory_bytes` must be None or a positive integer.",
                f"device_memory_bytes={device_memory_bytes!r}",
                "Pass the free bytes per device, e.g. 80 * 1024**3.",
            )
        )
    _check_positive(
        "per_replica_batch_size", per_replica_batch_size, "Pass a batch size such as 256."
    )
    columns, num_rows = column_specs(data)
    free, source = _free_device_bytes(device_memory_bytes)
    setup = _Setup(
        columns, num_rows, per_replica_batch_size, placement, drop_remainder, free, source,
        memory_fraction,
    )
    mem = setup.plan(num_workers, replicas_per_worker, workers_per_host, shuffle,
                     exchange_buffer_bytes)
    if mem.fits or not mem.ranks[0].staging_bytes:
        return mem
    return dataclasses.replace(mem, ways_out=setup.ways_out(mem, exchange_buffer_bytes))


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What stays fixed while a plan is made again with one change (the data,
    the batch, the free memory as read once)."""

    columns: tuple[ColumnSpec, ...]
    num_rows: int
    per_replica_batch_size: int
    placement: Placement
    drop_remainder: bool
    free: int | None
    source: str
    memory_fraction: float

    def plan(
        self,
        num_workers: int,
        replicas_per_worker: int,
        workers_per_host: int,
        shuffle: bool | Literal["local"],
        exchange_buffer_bytes: int | Literal["auto"],
        columns: tuple[ColumnSpec, ...] | None = None,
    ) -> MemoryPlan:
        columns = columns or self.columns
        num_rows = self.num_rows
        num_replicas = num_workers * replicas_per_worker
        plan = plan_shards(
            num_rows, num_replicas, self.per_replica_batch_size, self.placement,
            self.drop_remainder, training=True,
        )
        row_bytes = sum(c.row_bytes for c in columns)
        free, source = self.free, self.source
        usable = _memory.usable_bytes(free, self.memory_fraction)
        shared_host = _memory.shares_host_ram(source)
        # The backend is not known here: several workers count the larger staging.
        factor = _exchange.staged_rows_per_row(num_replicas, num_workers, backend=None)
        buffer_bytes = _exchange.buffer_bytes(exchange_buffer_bytes, plan, row_bytes)
        staged = (
            _exchange.staging_bytes(plan, row_bytes, buffer_bytes, factor)
            if uses_exchange(shuffle, plan)
            else 0
        )
        # Bytes per device as the dataset counts them, one device per replica.
        replicas = range(num_replicas)
        on_device = _memory.device_bytes(
            plan, replicas, [str(r) for r in replicas], row_bytes,
            staged + _memory.call_rows_bytes(plan, row_bytes) + _memory.position_bytes(plan),
            _memory.HOST_INDEX_BYTES_PER_ROW if shared_host else 0,
        )
        host_bytes: dict[int, int] = {}
        for replica in replicas:
            host = replica // replicas_per_worker // workers_per_host
            host_bytes[host] = host_bytes.get(host, 0) + on_device[str(replica)]
        ranks = []
        for rank in range(num_workers):
            ids = tuple(range(rank * replicas_per_worker, (rank + 1) * replicas_per_worker))
            held = tuple(plan.shard_rows(r) for r in ids)
            held_bytes = tuple(n * row_bytes for n in held)
            host = rank // workers_per_host
            ranks.append(
                RankMemory(
                    rank=rank,
                    replica_ids=ids,
                    rows_per_replica=held,
                    bytes_per_replica=held_bytes,
                    steps_per_epoch=plan.steps_per_epoch,
                    dropped_rows_per_epoch=sum(plan.dropped_rows(r) for r in ids),
                    # Logical CPU devices share the host's RAM (as `_memory.memory_reports` adds
                    # them), and so do all the workers on one host.
                    needed_bytes=host_bytes[host]
                    if shared_host
                    else max(on_device[str(r)] for r in ids),
                    free_bytes=free,
                    usable_bytes=usable,
                    host=host,
                    staging_bytes=staged,
                )
            )
        return MemoryPlan(
            shard_plan=plan,
            num_workers=num_workers,
            replicas_per_worker=replicas_per_worker,
            columns=columns,
            memory_fraction=self.memory_fraction,
            memory_source=source,
            ranks=tuple(ranks),
            workers_per_host=workers_per_host,
            shuffle=shuffle,
            exchange_buffer_bytes=buffer_bytes,
        )

    def ways_out(
        self, mem: MemoryNumbers, requested: int | Literal["auto"]
    ) -> tuple[WayOut, ...]:
        """Each change that could make `mem` fit, planned again (with the
        `requested` buffer: `"auto"` resized to each plan's shards)."""
        base = (mem.num_workers, mem.replicas_per_worker, mem.workers_per_host)
        shuffle, buffer = mem.shuffle, requested
        ways = []
        # More workers (or hosts, when the workers on a host share its RAM).
        per_group = mem.workers_per_host if mem.shared_host else 1
        change = "hosts" if per_group > 1 else "workers"

        def with_groups(groups: int) -> MemoryPlan | None:
            workers = groups * per_group
            if workers * base[1] > self.num_rows:
                return None  # a training step needs a row on every replica
            return self.plan(workers, base[1], base[2], shuffle, buffer)

        groups = -(-mem.num_workers // per_group)
        ways.append(_fewest(change, groups, with_groups))
        if shuffle is True:
            ways.append(WayOut("shuffle_local", None, self.plan(*base, "local", buffer)))
        ways.append(self._largest_buffer(mem, base, mem.exchange_buffer_bytes))
        compact = tuple(
            c._replace(dtype=_memadvice.COMPACT.get(c.dtype, c.dtype)) for c in mem.columns
        )
        if compact != mem.columns:
            ways.append(WayOut("compact", None, self.plan(*base, shuffle, buffer, compact)))
        return tuple(ways)

    def _largest_buffer(
        self, mem: MemoryNumbers, base: tuple[int, int, int], buffer: int
    ) -> WayOut:
        """The largest `exchange_buffer_bytes` below `buffer` that fits (the
        staging shrinks with it; it must still stage one row per round)."""
        factor = _exchange.staged_rows_per_row(
            mem.num_workers * base[1], mem.num_workers, backend=None
        )
        low = factor * mem.row_bytes  # stages one row
        smallest = self.plan(*base, mem.shuffle, low)
        if low >= buffer or not smallest.fits:
            return WayOut("exchange_buffer_bytes", None, smallest)
        good, bad = low, buffer  # fits at good, not at bad
        while bad - good > 1:
            middle = (good + bad) // 2
            if self.plan(*base, mem.shuffle, middle).fits:
                good = middle
            else:
                bad = middle
        if good >= MIB:
            good -= good % MIB  # a round number to type
        return WayOut("exchange_buffer_bytes", good, self.plan(*base, True, good))


def _fewest(
    change: str, current: int, plan_for: Callable[[int], MemoryPlan | None]
) -> WayOut:
    """The fewest groups (workers or hosts) above `current` whose plan fits:
    doubling until one fits, then halving the gap (the needed bytes fall as
    groups are added, up to the staging they approach)."""
    tried, last = current, None
    count = current
    while True:
        count = max(count + 1, count * 2)
        mem = plan_for(count)
        if mem is None or count > _MAX_GROUPS:
            return WayOut(change, None, last)
        if mem.fits:
            break
        tried, last = count, mem
    good, bad = count, tried
    while good - bad > 1:
        middle = (good + bad) // 2
        candidate = plan_for(middle)
        if candidate is not None and candidate.fits:
            good, mem = middle, candidate
        else:
            bad = middle
    return WayOut(change, good, plan_for(good))


# More workers than any cluster has: the search stops there.
_MAX_GROUPS = 1 << 16
