"""The memory plan's numbers without words: `RankMemory` (one rank's line), `MemoryNumbers`.

Apart from the plan so the words can read them while the plan uses the words:
memplan -> memadvice -> memnumbers, one way (a contract in pyproject.toml).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from shardfeed._data import memory as _memory
from shardfeed._data.described import ColumnSpec
from shardfeed._data.plan import ShardPlan


@dataclasses.dataclass(frozen=True)
class RankMemory:
    """What one worker (rank) holds and whether it fits.

    Attributes:
        rank: The worker's index.
        replica_ids: Global ids of its replicas (`rank * replicas_per_worker + i`).
        rows_per_replica: Rows each of its devices holds.
        bytes_per_replica: Bytes each of its devices holds.
        steps_per_epoch: Training steps per epoch (the same on every rank).
        dropped_rows_per_epoch: Rows of its replicas left out of each epoch.
        needed_bytes: Bytes that must fit in `usable_bytes`: the largest
            device's, or, when devices share host RAM, all the devices of
            all the workers on its host together.
        free_bytes: Free bytes per device (None when unknown).
        usable_bytes: `int(free_bytes * memory_fraction)` (None when unknown).
        host: Index of the host it runs on (`rank // workers_per_host`).
        staging_bytes: Per device, the most the per-epoch exchange of the
            global shuffle stages (counted in `needed_bytes`; 0 without it).
    """

    rank: int
    replica_ids: tuple[int, ...]
    rows_per_replica: tuple[int, ...]
    bytes_per_replica: tuple[int, ...]
    steps_per_epoch: int
    dropped_rows_per_epoch: int
    needed_bytes: int
    free_bytes: int | None
    usable_bytes: int | None
    host: int = 0
    staging_bytes: int = 0

    @property
    def rows(self) -> int:
        """Rows on all its devices together (copies counted once per device)."""
        return sum(self.rows_per_replica)

    @property
    def bytes_per_device(self) -> int:
        return max(self.bytes_per_replica)

    @property
    def fits(self) -> bool:
        return _memory.fits(self.needed_bytes, self.usable_bytes)


@dataclasses.dataclass(frozen=True)
class MemoryNumbers:
    """Per-rank rows, bytes, steps and memory fit of a sharded resident dataset.

    Attributes:
        shard_plan: The `ShardPlan` (training epoch) over all replicas.
        num_workers: Workers (ranks).
        replicas_per_worker: Devices per worker.
        columns: The arrays, in the order given.
        memory_fraction: Share of free memory the data may take.
        memory_source: Where the free bytes came from: "given", "nvml",
            "meminfo" or "unknown".
        ranks: One `RankMemory` per worker.
        workers_per_host: Workers on each host (the last host may have fewer).
    """

    shard_plan: ShardPlan
    num_workers: int
    replicas_per_worker: int
    columns: tuple[ColumnSpec, ...]
    memory_fraction: float
    memory_source: str
    ranks: tuple[RankMemory, ...]
    workers_per_host: int = 1
    shuffle: bool | Literal["local"] = True
    exchange_buffer_bytes: int = 256 * 2**20
    # When the global shuffle's staging is counted and the plan does not fit:
    # the changes re-planned with the same free memory (see `WayOut`).
    ways_out: tuple[WayOut, ...] = ()

    @property
    def num_hosts(self) -> int:
        return -(-self.num_workers // self.workers_per_host)

    @property
    def devices_per_host(self) -> int:
        """Devices of the largest host (all its workers' replicas)."""
        return min(self.workers_per_host, self.num_workers) * self.replicas_per_worker

    @property
    def row_bytes(self) -> int:
        return sum(c.row_bytes for c in self.columns)

    @property
    def shared_host(self) -> bool:
        """Whether a worker's devices share one host's RAM (logical CPU devices)."""
        return _memory.shares_host_ram(self.memory_source)

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.ranks)


@dataclasses.dataclass(frozen=True)
class WayOut:
    """One change to a plan that does not fit, planned again with the same
    free memory: what fits is computed, not guessed.

    Attributes:
        change: "workers", "hosts", "shuffle_local", "exchange_buffer_bytes"
            or "compact".
        value: The changed setting (the count of workers or hosts, the
            buffer's bytes); None where no value fits or none applies.
        plan: The plan with that change (for "workers"/"hosts"/
            "exchange_buffer_bytes" without a fitting value: the plan at the
            most that was tried), or None.
    """

    change: str
    value: int | None
    plan: MemoryNumbers | None
