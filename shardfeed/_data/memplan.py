"""`shardfeed plan`: per-rank rows, bytes, steps and memory fit, before anything loads.

Separation of concerns: this module only does arithmetic. The shard plan
(`_plan.plan_shards`) says which rows each replica holds and how an epoch is
cut into steps; this module multiplies that by the bytes per row, compares it
with the free memory of one device, and says what to change when it does not
fit. It reads no rows, allocates nothing and never imports TensorFlow, so it
runs on a login node or a laptop where only NumPy is installed: GPUs are read
through NVML (`_memory.gpu_free_bytes`), anything else through the host's
`/proc/meminfo`.

The free memory of every device in the plan is taken to be that of this
machine's first GPU (or the host, or the number given): the plan is for a
cluster of like devices. Workers are placed on hosts in rank order,
`workers_per_host` to a host; when the devices are the host's RAM (read from
`/proc/meminfo`), every device of every worker on a host counts against that
one host's memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._common import host as _host
from shardfeed._data import memory as _memory
from shardfeed._data import split as _split
from shardfeed._data.plan import Placement, ShardPlan, _check_positive, plan_shards
from shardfeed._data.sources import Column, check_lengths, make_column

# The compact dtype advised for each float dtype (cast back in `transform`).
_COMPACT = {np.dtype("float64"): np.dtype("float32"), np.dtype("float32"): np.dtype("float16")}
_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")
_SHAPE_SPEC_RE = re.compile(r"(\d+(?:x\d+)*):(\w+)")
_SOURCE_WORDS = {
    "given": "given",
    "nvml": "GPU:0 via NVML",
    "meminfo": "this host's available RAM, /proc/meminfo",
}


class ColumnSpec(NamedTuple):
    """One array of the plan: its name, the shape of one row and its dtype."""

    name: str
    row_shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class _Described:
    """An array described by shape and dtype only; nothing ever reads its rows."""

    shape: tuple[int, ...]
    dtype: np.dtype


@dataclasses.dataclass(frozen=True)
class RankPlan:
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

    @property
    def rows(self) -> int:
        """Rows on all its devices together (copies counted once per device)."""
        return sum(self.rows_per_replica)

    @property
    def bytes_per_device(self) -> int:
        return max(self.bytes_per_replica)

    @property
    def fits(self) -> bool:
        # Same rule as `_memory.MemoryReport.fits`: unknown memory is not checked.
        return self.usable_bytes is None or self.needed_bytes <= self.usable_bytes


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-rank rows, bytes, steps and memory fit of a sharded resident dataset.

    Attributes:
        shard_plan: The `ShardPlan` (training epoch) over all replicas.
        num_workers: Workers (ranks).
        replicas_per_worker: Devices per worker.
        columns: The arrays, in the order given.
        memory_fraction: Share of free memory the data may take.
        memory_source: Where the free bytes came from: "given", "nvml",
            "meminfo" or "unknown".
        ranks: One `RankPlan` per worker.
        workers_per_host: Workers on each host (the last host may have fewer).
    """

    shard_plan: ShardPlan
    num_workers: int
    replicas_per_worker: int
    columns: tuple[ColumnSpec, ...]
    memory_fraction: float
    memory_source: str
    ranks: tuple[RankPlan, ...]
    workers_per_host: int = 1

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
        return self.memory_source == "meminfo"

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.ranks)

    def table(self) -> str:
        """The plan as plain text: a summary, one aligned row per rank, the verdict.

        Returns:
            Lines joined by newlines, without a trailing newline.

        Example:
            >>> print(memory_plan({"x": ((1001, 32), "float32")}, num_workers=3,
            ...                   per_replica_batch_size=100,
            ...                   device_memory_bytes=2**30).table())
        """
        plan, n_rep = self.shard_plan, self.shard_plan.num_replicas
        described = ", ".join(f"{c.name}: {c.dtype.name}{list(c.row_shape)}" for c in self.columns)
        lines = [
            f"data: {plan.num_rows:,} rows x {self.row_bytes:,} B/row ({described}) = "
            f"{format_bytes(plan.num_rows * self.row_bytes)}",
            f"plan: {self.num_workers} worker(s) x {self.replicas_per_worker} replica(s) = "
            f"{n_rep} replica(s){self._hosts_words()}; "
            f"per_replica_batch_size={plan.per_replica_batch_size} "
            f"(global batch {plan.global_batch_size:,}); placement={plan.placement!r}; "
            f"drop_remainder={plan.drop_remainder}",
            "",
        ]
        header = (
            "rank",
            "replicas",
            "rows/device",
            "bytes/device",
            "steps/epoch",
            "dropped rows",
            "free",
            "usable",
            "fits",
        )
        rows = [header]
        for r in self.ranks:
            lo, hi = min(r.rows_per_replica), max(r.rows_per_replica)
            first, last = r.replica_ids[0], r.replica_ids[-1]
            rows.append(
                (
                    str(r.rank),
                    str(first) if first == last else f"{first}-{last}",
                    f"{hi:,}" if lo == hi else f"{lo:,}-{hi:,}",
                    format_bytes(r.bytes_per_device),
                    f"{r.steps_per_epoch:,}",
                    f"{r.dropped_rows_per_epoch:,}",
                    "unknown" if r.free_bytes is None else format_bytes(r.free_bytes),
                    "unknown" if r.usable_bytes is None else format_bytes(r.usable_bytes),
                    "unchecked" if r.usable_bytes is None else ("yes" if r.fits else "NO"),
                )
            )
        left = {0, 1, 8}
        if self.workers_per_host > 1:
            # Which host each rank is on: its needs count with its host-mates'.
            rows = [
                (row[0], "host" if i == 0 else str(self.ranks[i - 1].host), *row[1:])
                for i, row in enumerate(rows)
            ]
            header, left = rows[0], {0, 1, 2, 9}
        # Numbers right-aligned, words left-aligned, as in `nvidia-smi`.
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for row in rows:
            cells = [
                cell.ljust(w) if i in left else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells).rstrip())
        lines += ["", self._verdict()]
        return "\n".join(lines)

    def _hosts_words(self) -> str:
        if self.workers_per_host == 1:
            return ""
        return f" on {self.num_hosts} host(s) of {self.workers_per_host} worker(s)"

    def _verdict(self) -> str:
        worst = max(self.ranks, key=lambda r: r.needed_bytes)
        if worst.usable_bytes is None:
            return (
                "not checked: the free device memory is unknown (no GPU through NVML, no "
                "/proc/meminfo); pass device_memory_bytes (--device-memory)."
            )
        per = "" if self.shared_host else " per device"
        memory = (
            f"{format_bytes(worst.usable_bytes)} usable ({self.memory_fraction:.0%} of "
            f"{format_bytes(worst.free_bytes or 0)} free{per}, "
            f"{_SOURCE_WORDS.get(self.memory_source, self.memory_source)})"
        )
        what = "each device needs at most"
        if self.shared_host and self.workers_per_host > 1:
            what = (
                f"the {self.workers_per_host} workers on each host ({self.devices_per_host} "
                "devices) share its RAM and need"
            )
        elif self.shared_host and self.replicas_per_worker > 1:
            what = f"each worker's {self.replicas_per_worker} devices share the host and need"
        assumed = ""
        if self.shared_host and self.workers_per_host == 1 and self.num_workers > 1:
            # The plan cannot know where workers run: say what it assumed.
            assumed = (
                " Assumed one worker per host; pass workers_per_host (--workers-per-host) "
                "when several share one."
            )
        if self.fits:
            return f"fits: {what} {format_bytes(worst.needed_bytes)} of {memory}.{assumed}"
        misfits = ", ".join(str(r.rank) for r in self.ranks if not r.fits)
        return (
            f"does NOT fit on rank(s) {misfits}: {what} {format_bytes(worst.needed_bytes)}, "
            f"over {memory}.{assumed}"
        )

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
        if self.fits:
            return []
        worst = max(self.ranks, key=lambda r: r.needed_bytes)
        usable = worst.usable_bytes or 0  # known: unknown memory always "fits"
        return [self._more_replicas(usable), *self._compact(worst), self._streaming(usable)]

    def _more_replicas(self, usable: int) -> str:
        plan, r_per_w = self.shard_plan, self.replicas_per_worker
        max_rows = usable // self.row_bytes
        limit = format_bytes(usable)
        if self.shared_host and self.workers_per_host > 1:
            # All devices of all workers on a host share its RAM: only more hosts help.
            per_host = self.workers_per_host * r_per_w
            if max_rows < per_host:
                return (
                    f"Even one row per device ({per_host} devices on a host x "
                    f"{format_bytes(self.row_bytes)}) does not fit in {limit} usable: use "
                    "fewer workers per host, fewer replicas per worker or a compact dtype."
                )
            hosts = max(1, -(-plan.num_rows // max_rows))
            while _largest_rank_rows(plan.num_rows, hosts, per_host) > max_rows:
                hosts += 1
            return (
                f"Use more hosts: the {self.workers_per_host} workers on a host "
                f"({per_host} device(s)) share its RAM, so with placement='shard' at least "
                f"{hosts} host(s) of {self.workers_per_host} worker(s) keep every host within "
                f"{limit} usable (now {self.num_hosts})."
            )
        if self.shared_host:
            # A worker's devices share the host's RAM, so only more workers help.
            if max_rows < r_per_w:
                return (
                    f"Even one row per device ({r_per_w} devices x "
                    f"{format_bytes(self.row_bytes)}) does not fit in {limit} usable: use "
                    "fewer replicas per worker or a compact dtype."
                )
            workers = max(1, -(-plan.num_rows // max_rows))
            while _largest_rank_rows(plan.num_rows, workers, r_per_w) > max_rows:
                workers += 1
            return (
                f"Use more workers: each worker's {r_per_w} device(s) share one host's RAM, so "
                f"with placement='shard' at least {workers} worker(s) keep every worker within "
                f"{limit} usable (now {self.num_workers})."
            )
        if max_rows == 0:
            return (
                f"One row ({format_bytes(self.row_bytes)}) is larger than {limit} usable per "
                "device: no number of replicas helps; store a compact dtype."
            )
        replicas = -(-plan.num_rows // max_rows)
        workers = -(-replicas // r_per_w)
        if replicas <= plan.num_replicas:  # only when replicating now
            rows = -(-plan.num_rows // plan.num_replicas)
            return (
                f"Shard instead of replicating: with placement='shard', the current "
                f"{plan.num_replicas} replicas hold at most {rows:,} rows "
                f"({format_bytes(rows * self.row_bytes)}) per device, within {limit} usable "
                f"({replicas:,} replica(s) would do)."
            )
        change = (
            "Shard instead of replicating" if plan.placement == "replicate" else "Use more replicas"
        )
        text = (
            f"{change}: with placement='shard', at least {replicas:,} replicas in total keep "
            f"every device within {limit} usable, e.g. {workers:,} worker(s) x {r_per_w} "
            f"replica(s) (now {plan.num_replicas})."
        )
        if replicas * plan.per_replica_batch_size > plan.num_rows:
            # The dataset refuses a global batch larger than the data.
            text += (
                f" With that many replicas, per_replica_batch_size must be at most "
                f"{plan.num_rows // replicas:,}."
            )
        return text

    def _compact(self, worst: RankPlan) -> list[str]:
        casts = [c for c in self.columns if c.dtype in _COMPACT]
        if not casts:
            return []
        compact_row_bytes = sum(
            math.prod(c.row_shape) * _COMPACT.get(c.dtype, c.dtype).itemsize for c in self.columns
        )
        needed = worst.needed_bytes // self.row_bytes * compact_row_bytes
        usable = worst.usable_bytes or 0
        listed = ", ".join(f"{c.name} {c.dtype.name}->{_COMPACT[c.dtype].name}" for c in casts)
        verdict = "fits in" if needed <= usable else "is still over"
        where = "per device"
        if self.shared_host:
            where = "per host" if self.workers_per_host > 1 else "per worker"
        return [
            f"Store a compact dtype and cast in `transform` ({listed}): "
            f"{format_bytes(needed)} {where} instead of {format_bytes(worst.needed_bytes)}, "
            f"which {verdict} {format_bytes(usable)} usable."
        ]

    def _streaming(self, usable: int) -> str:
        plan = self.shard_plan
        if plan.placement != "shard":
            return (
                "Streaming (`LoadOptions(streaming=True)`) needs placement='shard': each "
                "replica streams its own rows."
            )
        # Replicas on one host share its RAM, as in `ShardedResidentDataset`.
        per_device = usable // (self.devices_per_host if self.shared_host else 1)
        b = plan.per_replica_batch_size
        step_bytes = b * self.row_bytes
        # Two slots (double buffering) of whole steps, as `_streaming.plan_stream` cuts them.
        steps = min(per_device // 2 // step_bytes, plan.steps_per_epoch)
        if steps < 1:
            return (
                f"Streaming (`LoadOptions(streaming=True)`) needs two chunks of at least one "
                f"step ({b:,} rows, {format_bytes(step_bytes)} each), more than "
                f"{format_bytes(per_device)} usable per device: lower per_replica_batch_size."
            )
        return (
            "Stream the shard with `LoadOptions(streaming=True)`: it keeps two "
            f"double-buffered chunks per device, and chunks of up to {steps * b:,} rows "
            f"({steps:,} steps of {b:,}, {format_bytes(steps * step_bytes)} each) fit in "
            f"{format_bytes(per_device)} usable per device."
        )


def _largest_rank_rows(num_rows: int, num_groups: int, replicas_per_group: int) -> int:
    # The first worker (or host) holds the largest shards: `split_rows` gives
    # the first ones a row more.
    base, extra = divmod(num_rows, num_groups * replicas_per_group)
    return replicas_per_group * base + min(replicas_per_group, extra)


def format_bytes(num_bytes: int) -> str:
    """`1536` -> `"1.50 KiB"`: bytes in the largest binary unit below the number."""
    if num_bytes < 1024:
        return f"{num_bytes} B"
    value = float(num_bytes)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    return f"{value:.2f} {unit}"


def parse_size(text: str, name: str = "device_memory") -> int:
    """Parses a memory size: plain bytes, or a number with a unit.

    Args:
        text: E.g. `"17179869184"`, `"16GiB"`, `"1.5 TiB"` or `"80GB"`. Units
            KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB powers of
            1000 (case-insensitive); a fraction of a byte is dropped.
        name: The argument's name, for the error message.

    Returns:
        The size in bytes (>= 1).

    Raises:
        ValueError: For anything else, or a size below one byte.

    Example:
        >>> parse_size("16GiB")
        17179869184
    """
    match = _SIZE_RE.fullmatch(text)
    unit = match and _UNITS.get(match[2].lower())
    # A plain number is bytes, so it must be whole; Fraction keeps "1.1GiB" exact.
    size = 0
    if match and unit and (match[2] or "." not in match[1]):
        size = int(Fraction(match[1]) * unit)
    if size < 1:
        raise ValueError(
            _errors.message(
                "A memory size must be a positive whole number of bytes, or a number with a "
                "unit: KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000).",
                f"{name}={text!r}",
                "Write e.g. `16GiB`, `80GB` or `17179869184`.",
            )
        )
    return size


# -- what the data is -----------------------------------------------------------------------


def _is_description(value: Any) -> bool:
    """Whether `value` is a `(shape, dtype)` pair rather than data."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        return False
    shape, dtype = value
    return isinstance(shape, (int, tuple, list)) and isinstance(dtype, (str, np.dtype, type))


def _describe(name: str, value: Any) -> _Described:
    shape, dtype = value
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(
            _errors.message(
                "A described array must be `(shape, dtype)` with a shape of whole numbers.",
                f"{name}={value!r}",
                "Write e.g. `{'x': ((1000000, 32), 'float32'), 'y': ((1000000,), 'int64')}`.",
            )
        )
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as err:
        raise TypeError(
            _errors.message(
                "A described array's dtype must be a NumPy dtype.",
                f"{name}.dtype={dtype!r}",
                "Use e.g. 'float32', 'float16', 'int64', 'uint8' or 'bool'.",
            )
        ) from err
    return _Described(shape, np_dtype)


def _flatten(value: Any, name: str) -> list[tuple[str, Any]]:
    # Mappings and lists nest as in `keras.tree`; a `(shape, dtype)` pair is a leaf.
    if isinstance(value, Mapping):
        return [
            leaf
            for key, item in value.items()
            for leaf in _flatten(item, f"{name}[{key!r}]" if name else str(key))
        ]
    if isinstance(value, (list, tuple)) and not _is_description(value):
        return [leaf for i, item in enumerate(value) for leaf in _flatten(item, f"{name}[{i}]")]
    return [(name, _describe(name, value) if _is_description(value) else value)]


def _column(name: str, leaf: Any) -> Column:
    if isinstance(leaf, _Described):
        # A described array has no rows to slice; validate its shape and dtype
        # through a zero-row stand-in, then put the described rows back.
        column = make_column(
            name,
            np.empty((0, *leaf.shape[1:]), leaf.dtype) if leaf.shape else np.empty((), leaf.dtype),
        )
        return dataclasses.replace(column, shape=leaf.shape)
    return make_column(name, leaf)


def _columns(data: Any) -> tuple[tuple[ColumnSpec, ...], int]:
    if data is None:
        raise ValueError(
            _errors.message(
                "A dataset needs inputs.",
                "x=None",
                "Pass `x` as an array or a list/dict of arrays.",
            )
        )
    # Top-level dict keys name the arrays as given (`image`, not `x['image']`).
    leaves = _flatten(data, "" if isinstance(data, Mapping) else "x")
    if not leaves:
        raise ValueError(
            _errors.message(
                "`x` must hold at least one array.",
                f"x={data!r}",
                "Pass arrays in `x` or leave it as None.",
            )
        )
    columns = [_column(name, leaf) for name, leaf in leaves]
    num_rows = check_lengths(columns)
    return tuple(ColumnSpec(c.name, c.row_shape, c.dtype) for c in columns), num_rows


# -- the plan -------------------------------------------------------------------------------


def _free_device_bytes(device_memory_bytes: int | None) -> tuple[int | None, str]:
    if device_memory_bytes is not None:
        return device_memory_bytes, "given"
    free = _memory.gpu_free_bytes(0)
    if free is not None:
        return free, "nvml"
    free = _memory.host_available_bytes()
    return free, ("meminfo" if free is not None else "unknown")


def _dropped_per_replica(plan: ShardPlan) -> list[int]:
    if plan.placement == "replicate":
        # Every replica holds every row; a dropped last global batch would
        # have been dealt out round-robin, as `plan_shards` counts it.
        dropped = plan.dropped_rows_per_epoch
        return [len(range(r, dropped, plan.num_replicas)) for r in range(plan.num_replicas)]
    used_full = (plan.steps_per_epoch - 1) * plan.per_replica_batch_size
    return [
        plan.shard_rows(r) - used_full - plan.last_step_rows[r] for r in range(plan.num_replicas)
    ]


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

    Returns:
        The `MemoryPlan`; `.table()` prints it and `.advice()` says what to
        change when it does not fit.

    Raises:
        ValueError: For non-positive counts or sizes, more workers per host
            than workers, a `memory_fraction`
            outside (0, 1], an unknown placement, arrays of different
            lengths, a global batch larger than the data, or an epoch with
            no step.
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
    if not 0.0 < memory_fraction <= 1.0:
        raise ValueError(
            _errors.message(
                "`memory_fraction` must be in (0, 1].",
                f"memory_fraction={memory_fraction!r}",
                "Use e.g. 0.8 to leave 20% of free memory for the model.",
            )
        )
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
    columns, num_rows = _columns(data)
    num_replicas = num_workers * replicas_per_worker
    if per_replica_batch_size * num_replicas > num_rows:
        # The same refusal as `ShardedResidentDataset`'s.
        raise ValueError(
            _errors.message(
                "The global batch (per_replica_batch_size x num_replicas_in_sync) "
                "must not be larger than the dataset.",
                f"per_replica_batch_size={per_replica_batch_size}, "
                f"num_replicas_in_sync={num_replicas}, num_rows={num_rows}",
                "Lower `per_replica_batch_size` or use fewer replicas.",
            )
        )
    plan = plan_shards(
        num_rows, num_replicas, per_replica_batch_size, placement, drop_remainder, training=True
    )
    row_bytes = sum(c.row_bytes for c in columns)
    free, source = _free_device_bytes(device_memory_bytes)
    usable = None if free is None else int(free * memory_fraction)
    dropped = _dropped_per_replica(plan)
    shared_host = source == "meminfo"
    host_bytes: dict[int, int] = {}
    for replica in range(num_replicas):
        host = replica // replicas_per_worker // workers_per_host
        host_bytes[host] = host_bytes.get(host, 0) + plan.shard_rows(replica) * row_bytes
    ranks = []
    for rank in range(num_workers):
        ids = tuple(range(rank * replicas_per_worker, (rank + 1) * replicas_per_worker))
        held = tuple(plan.shard_rows(r) for r in ids)
        held_bytes = tuple(n * row_bytes for n in held)
        host = rank // workers_per_host
        ranks.append(
            RankPlan(
                rank=rank,
                replica_ids=ids,
                rows_per_replica=held,
                bytes_per_replica=held_bytes,
                steps_per_epoch=plan.steps_per_epoch,
                dropped_rows_per_epoch=sum(dropped[r] for r in ids),
                # Logical CPU devices share the host's RAM (as `_memory.memory_reports` adds
                # them), and so do all the workers on one host.
                needed_bytes=host_bytes[host] if shared_host else max(held_bytes),
                free_bytes=free,
                usable_bytes=usable,
                host=host,
            )
        )
    return MemoryPlan(
        shard_plan=plan,
        num_workers=num_workers,
        replicas_per_worker=replicas_per_worker,
        columns=columns,
        memory_fraction=memory_fraction,
        memory_source=source,
        ranks=tuple(ranks),
        workers_per_host=workers_per_host,
    )


# -- command line ---------------------------------------------------------------------------


def _open_spec(spec: str) -> tuple[str, Any]:
    """`name=SHAPE:DTYPE` -> a described array; `name=file...` -> a lazy file leaf."""
    name, sep, location = spec.partition("=")
    if not sep or not name or not location:
        raise ValueError(
            _errors.message(
                "Each input must be written `name=path` or `name=SHAPE:DTYPE`.",
                f"input={spec!r}",
                "Write e.g. `x=train_x.npy` or `x=1000000x32:float32 y=1000000:int64`.",
            )
        )
    # Files always have a suffix (.npy, .npz, .h5, .parquet); shapes never have a dot.
    if "." in location:
        return _split._open_input(spec)  # opens file headers only; reads no rows
    match = _SHAPE_SPEC_RE.fullmatch(location)
    if not match:
        raise ValueError(
            _errors.message(
                "A shape input must be `name=ROWSxD1x...:DTYPE` with whole numbers.",
                f"input={spec!r}",
                "Write e.g. `x=1000000x32:float32` or `y=1000000:int64`.",
            )
        )
    shape = tuple(int(d) for d in match[1].split("x"))
    return name, _describe(name, (shape, match[2]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `shardfeed plan`'s arguments to `parser`."""
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="SPEC",
        help="arrays: name=file.npy, name=file.npz:key, name=file.h5:dataset, "
        "name=file.parquet:column, or name=SHAPE:DTYPE such as x=1000000x32:float32",
    )
    parser.add_argument(
        "--num-workers", metavar="N", type=int, required=True, help="workers (ranks)"
    )
    parser.add_argument(
        "--replicas-per-worker",
        metavar="R",
        type=int,
        default=1,
        help="devices per worker (default 1)",
    )
    parser.add_argument(
        "--workers-per-host",
        metavar="W",
        type=int,
        default=None,
        help="workers started on each host (default: what the launcher set, e.g. "
        "SHARDFEED_LOCAL_SIZE, else 1); with host RAM as the device memory, all their "
        "shards must fit in one host together",
    )
    parser.add_argument(
        "--per-replica-batch-size",
        metavar="B",
        type=int,
        required=True,
        help="rows per replica per step",
    )
    parser.add_argument(
        "--placement",
        choices=("shard", "replicate"),
        default="shard",
        help="shard: each device holds its slice of rows (default); replicate: every row",
    )
    parser.add_argument("--drop-remainder", action="store_true", help="drop a partial last step")
    parser.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="free memory per device, e.g. 16GiB or 80GB (default: GPU 0 via NVML, else "
        "this host's available RAM)",
    )
    parser.add_argument(
        "--memory-fraction",
        metavar="F",
        type=float,
        default=0.8,
        help="share of free memory the data may take (default 0.8)",
    )


def run(args: argparse.Namespace) -> int:
    """Runs `shardfeed plan`: 0 when every rank fits, 1 when one does not, 2 on bad input."""
    try:
        arrays = _split.open_inputs(args.inputs, _open_spec)
        device_memory = (
            None
            if args.device_memory is None
            else parse_size(args.device_memory, "--device-memory")
        )
        plan = memory_plan(
            arrays,
            num_workers=args.num_workers,
            replicas_per_worker=args.replicas_per_worker,
            per_replica_batch_size=args.per_replica_batch_size,
            placement=args.placement,
            drop_remainder=args.drop_remainder,
            device_memory_bytes=device_memory,
            memory_fraction=args.memory_fraction,
            workers_per_host=(
                args.workers_per_host
                if args.workers_per_host is not None
                else min(_host.local_size(os.environ) or 1, max(1, args.num_workers))
            ),
        )
    except (ValueError, TypeError, OSError, ImportError) as err:
        print(f"shardfeed plan: error: {err}", file=sys.stderr)
        return 2
    print(plan.table())
    advice = plan.advice()
    if advice:
        print("\nto make it fit:")
        print("\n".join(f"- {line}" for line in advice))
    return 0 if plan.fits else 1
