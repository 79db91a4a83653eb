"""Device memory: how many bytes are free, how many a device will hold, and whether they fit.

Owns `device_bytes`, `usable_bytes`, `fits` and `memory_reports`: the one check
of both datasets (before anything is allocated) and `memory_plan`. GPUs are read
through NVML, CPU devices from the host's RAM, shared among the host's workers;
a backend may pass its own reader (`read_free`). `agree_on_fit` and
`fits_on_every_rank` turn each rank's check into one decision for all ranks.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from shardfeed._common import errors as _errors
from shardfeed._common import host as _host
from shardfeed._common.units import GIB, MIB
from shardfeed._data.plan import ShardPlan

if TYPE_CHECKING:
    from shardfeed._common.world import WorldLike

# `free_bytes`' source for the host's available RAM: every device read this way shares it.
HOST_RAM_SOURCE = "meminfo"

# What the host keeps per row to index an epoch: the order, the layout of
# moved rows and each row's slot (int32 or int64 arrays). Where the devices are
# the host's RAM (CPU devices) this is the same memory as the rows, so it is
# counted with them; on a GPU it is host RAM. With the positions below,
# measured beside 768 MiB of 260-byte rows: 9-23 bytes a row (both backends).
HOST_INDEX_BYTES_PER_ROW = 12
# Each replica's epoch on its device: one int32 position per slot (JAX's
# `positions`, TensorFlow's `[steps, batch]` index matrix), which the step
# gathers its batch by. Device memory on a GPU too.
POSITION_BYTES = 4


def position_bytes(plan: ShardPlan) -> int:
    """Bytes of one replica's positions for an epoch of `plan`: steps x batch,
    the steps that take every row (an evaluation's; whether training drops the
    remainder does not change what is allocated).

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> position_bytes(plan_shards(1001, 2, 10))
        2040
    """
    steps = -(-plan.num_rows // plan.global_batch_size)
    return steps * plan.per_replica_batch_size * POSITION_BYTES


def on_host(device: str) -> bool:
    """Whether a device name is a CPU device, whose memory is the host's RAM.

    Example:
        >>> on_host("/job:localhost/replica:0/task:0/device:CPU:0"), on_host("GPU:1")
        (True, False)
    """
    return "GPU:" not in device.upper()


def index_bytes_per_row(devices: Sequence[str], device_memory_bytes: int | None) -> int:
    """The host's index bytes per row to count with the rows on `devices`:
    `HOST_INDEX_BYTES_PER_ROW` where they are all CPU devices checked against
    the host's RAM, else 0 (GPUs, or devices whose memory the user gave, as
    `memory_plan` counts them).

    Example:
        >>> index_bytes_per_row(["CPU:0", "CPU:1"], None), index_bytes_per_row(["GPU:0"], None)
        (12, 0)
    """
    on_ram = devices and all(map(on_host, devices)) and device_memory_bytes is None
    return HOST_INDEX_BYTES_PER_ROW if on_ram else 0


def check_memory_fraction(memory_fraction: float) -> None:
    """Refuses a share of free memory outside (0, 1].

    Args:
        memory_fraction: Share of free memory the data may take.

    Raises:
        ValueError: If it is not in (0, 1].

    Example:
        >>> check_memory_fraction(0.8)
    """
    if not 0.0 < memory_fraction <= 1.0:
        raise ValueError(
            _errors.message(
                "`memory_fraction` must be in (0, 1].",
                f"memory_fraction={memory_fraction!r}",
                "Use e.g. 0.8 to leave 20% of free memory for the model.",
            )
        )


def shares_host_ram(source: str) -> bool:
    """Whether devices whose free bytes came from `source` share one host's RAM.

    Logical CPU devices, and all the workers on one host, read the same
    available RAM (`/proc/meminfo`), so their needs add up against it; a GPU
    (NVML) or a size the user gave (`device_memory_bytes`) is per device.

    Args:
        source: Where the free bytes came from, as `free_bytes` says.

    Returns:
        True for the host's available RAM.

    Example:
        >>> shares_host_ram("meminfo"), shares_host_ram("nvml")
        (True, False)
    """
    return source == HOST_RAM_SOURCE


def device_bytes(
    plan: ShardPlan,
    replica_ids: Sequence[int],
    devices: Sequence[str],
    row_bytes: int,
    staging_bytes: int = 0,
    index_bytes: int = 0,
) -> dict[str, int]:
    """Bytes each device will hold: its replicas' rows (replicas that hold the
    same rows on the same device share one copy) and each replica's staging
    buffer for the exchange of the global shuffle.

    Args:
        plan: Which rows each replica holds.
        replica_ids: Global ids of the replicas, in order.
        devices: The device of each replica.
        row_bytes: Bytes of one row, all columns.
        staging_bytes: Per replica, the most the exchange stages (0 without it).
        index_bytes: Per row held, the host's index bytes that share the
            device's memory (`index_bytes_per_row`).

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> device_bytes(plan_shards(1001, 2, 10), [0, 1], ["GPU:0", "GPU:1"], 8, 100)
        {'GPU:0': 4108, 'GPU:1': 4100}
    """
    needed: dict[str, int] = {}
    seen = set()
    for replica, device in zip(replica_ids, devices, strict=True):
        start, stop = plan.shards[replica]
        if (device, start, stop) not in seen:
            seen.add((device, start, stop))
            needed[device] = needed.get(device, 0) + (stop - start) * (row_bytes + index_bytes)
        needed[device] += staging_bytes
    return needed


# The most device bytes per replica a compiled call of one replica gathers
# at once: one gather per column for many steps, then contiguous rows per
# step, instead of one gather per column per step inside XLA (on CPU, XLA's
# gather cost W2 ~50 us of ~150 per step: shardfeed/_commands/bench/NOTES.md).
CALL_ROWS_BYTES = 32 * MIB


def call_rows_steps(per_replica_batch_size: int, row_bytes: int) -> int:
    """Steps whose rows one gather of a compiled call takes: as many as fit
    `CALL_ROWS_BYTES`, at least one.

    Example:
        >>> call_rows_steps(256, 132)  # W2's rows: 32 + 1 float32
        992
    """
    return max(1, CALL_ROWS_BYTES // max(1, per_replica_batch_size * row_bytes))


def call_rows_bytes(plan: ShardPlan, row_bytes: int) -> int:
    """Device bytes a single replica's compiled calls hold for rows gathered
    up front (`call_rows_steps` steps, at most an epoch's), counted in the
    resident fit; 0 with several replicas, whose calls gather step by step
    (as do streamed rows').

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> one, two = plan_shards(1000, 1, 100), plan_shards(1000, 2, 100)
        >>> call_rows_bytes(one, 8), call_rows_bytes(two, 8)
        (8000, 0)
    """
    if plan.num_replicas != 1:
        return 0
    b = plan.per_replica_batch_size
    steps = min(call_rows_steps(b, row_bytes), plan.steps_per_epoch)
    return steps * b * row_bytes


def usable_bytes(free_bytes: int | None, memory_fraction: float, sharing: int = 1) -> int | None:
    """The bytes data may take of `free_bytes`: `memory_fraction` of them, then
    split between the `sharing` workers that read the same free bytes.

    Example:
        >>> usable_bytes(1000, 0.8), usable_bytes(1000, 0.8, sharing=3), usable_bytes(None, 0.8)
        (800, 266, None)
    """
    return None if free_bytes is None else int(free_bytes * memory_fraction) // sharing


def fits(needed_bytes: int, usable_bytes: int | None) -> bool:
    """The fit check of the dataset (`MemoryReport`) and of `memory_plan`
    (`RankMemory`): the bytes are within the usable ones, or those are unknown
    (not checked, and said so).

    Example:
        >>> fits(900, 800), fits(900, None)
        (False, True)
    """
    return usable_bytes is None or needed_bytes <= usable_bytes


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Bytes wanted against bytes available on one device.

    Attributes:
        device: The device name.
        needed_bytes: Bytes the resident data will take there.
        free_bytes: Bytes free there (None when unknown).
        usable_bytes: The share of `free_bytes` data may use (None when unknown).
        source: Where `free_bytes` came from ("given", "nvml", "meminfo",
            "unknown").
        workers_on_host: Workers sharing `free_bytes` (the host's RAM);
            `usable_bytes` is this worker's share.
        rank: The rank whose device this is, when several ranks compared
            their reports (`agree_on_fit`); None: this rank's, alone.
    """

    device: str
    needed_bytes: int
    free_bytes: int | None
    usable_bytes: int | None
    source: str
    workers_on_host: int = 1
    rank: int | None = None

    @property
    def fits(self) -> bool:
        return fits(self.needed_bytes, self.usable_bytes)

    @property
    def where(self) -> str:
        """The device, with its rank when several ranks compared reports."""
        return self.device if self.rank is None else f"rank {self.rank}'s {self.device}"

    def numbers(self) -> str:
        """`needed_bytes=..., free_bytes=..., usable_bytes=...` for messages
        (after `rank R: ` when several ranks compared reports)."""
        text = "" if self.rank is None else f"rank {self.rank}: "
        text += (
            f"needed_bytes={self.needed_bytes:,} ({self.needed_bytes / GIB:.2f} GiB), "
            f"free_bytes={self.free_bytes:,} ({(self.free_bytes or 0) / GIB:.2f} GiB, "
            f"from {self.source}), usable_bytes={self.usable_bytes:,}"
        )
        if self.workers_on_host > 1:
            text += f" (this worker's share: {self.workers_on_host} workers share the host)"
        return text


@dataclasses.dataclass(frozen=True)
class AgreedFit:
    """The fit as every rank sees it (`agree_on_fit`).

    Attributes:
        misfit: The first report that does not fit, of the lowest rank that
            has one (its `rank` set when there are several ranks); None when
            every rank's rows fit.
        usable_per_replica: The fewest usable bytes per replica of any rank
            (None when no rank knows its free memory): what sizes a stream's
            chunks alike on every rank.
    """

    misfit: MemoryReport | None
    usable_per_replica: int | None


def agree_on_fit(
    world: WorldLike, reports: Sequence[MemoryReport], usable_per_replica: int | None
) -> AgreedFit:
    """Every rank's fit check, gathered: the same answer on every rank.

    Why: free memory differs per host, and a rank that streamed (or refused)
    while the others stayed resident ran other collectives and hung the job
    until its timeout. A collective (one `all_gather_bytes`) with several
    ranks: call it on every rank at the same point.

    Args:
        world: The workers.
        reports: This rank's `memory_reports`.
        usable_per_replica: This rank's usable bytes per local replica.

    Example:
        >>> class One:
        ...     rank, world_size, is_chief = 0, 1, True
        >>> agree_on_fit(One(), memory_reports({"GPU:0": 10}, 0.8, 100), 80)
        AgreedFit(misfit=None, usable_per_replica=80)
    """
    mine = next((r for r in reports if not r.fits), None)
    if world.world_size == 1:
        return AgreedFit(mine, usable_per_replica)
    payload = {
        "misfit": dataclasses.asdict(mine) if mine is not None else None,
        "usable": usable_per_replica,
    }
    gathered = [json.loads(p) for p in world.all_gather_bytes(json.dumps(payload).encode())]
    misfit = None
    for rank, theirs in enumerate(gathered):
        if theirs["misfit"] is not None:
            misfit = MemoryReport(**{**theirs["misfit"], "rank": rank})
            break
    usable = [theirs["usable"] for theirs in gathered if theirs["usable"] is not None]
    return AgreedFit(misfit, min(usable) if usable else None)


def fits_on_every_rank(world: WorldLike, fits_here: bool) -> bool:
    """Whether an optional use of memory fits on every rank (a collective
    with several ranks): a choice that changes the collectives an epoch runs
    must be one choice."""
    if world.world_size == 1:
        return fits_here
    return all(p == b"1" for p in world.all_gather_bytes(b"1" if fits_here else b"0"))


def host_available_bytes() -> int | None:
    """Returns `MemAvailable` from `/proc/meminfo`, or None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def gpu_free_bytes(gpu_index: int) -> int | None:
    """Free bytes on physical GPU `gpu_index` through NVML, or None.

    `gpu_index` counts the GPUs TensorFlow sees, so it is mapped through
    `CUDA_VISIBLE_DEVICES` to NVML's numbering.
    """
    try:
        import pynvml
    except ImportError:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if gpu_index >= len(ids) or not ids[gpu_index].isdigit():
            return None
        gpu_index = int(ids[gpu_index])
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu_index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free)
    except Exception:  # NVML missing its driver library, no such device, ...
        return None


def free_bytes(device: str) -> tuple[int | None, str]:
    """Free bytes on `device` and where the number came from."""
    name = device.upper()
    if "GPU:" in name:
        index = int(name.rsplit("GPU:", 1)[1])
        free = gpu_free_bytes(index)
        return free, ("nvml" if free is not None else "unknown")
    free = host_available_bytes()
    return free, (HOST_RAM_SOURCE if free is not None else "unknown")


def memory_reports(
    needed_by_device: dict[str, int],
    memory_fraction: float,
    device_memory_bytes: int | None = None,
    workers_on_host: int | None = None,
    read_free: Callable[[str], tuple[int | None, str]] | None = None,
) -> list[MemoryReport]:
    """Bytes needed against bytes usable on each device; allocates nothing.

    Logical CPU devices share one host, so their needs are added up and
    checked once against the host's available memory -- this worker's share
    of it when several workers share the host.

    Args:
        needed_by_device: Bytes each device will hold.
        memory_fraction: Share of free memory the data may take; the rest is
            headroom for the model, optimizer state and activations.
        device_memory_bytes: Free bytes per device, when given by the user
            (overrides what the device reports).
        workers_on_host: Workers sharing this host's RAM; None reads what the
            launcher set (`SHARDFEED_LOCAL_SIZE`, `HOROVOD_LOCAL_SIZE`, ...),
            else 1.
        read_free: Free bytes of a device name and their source (default
            `free_bytes`; JAX passes one that reads `Device.memory_stats()`).

    Returns:
        One `MemoryReport` per device (one for all CPU devices together).

    Example:
        >>> [r.fits for r in memory_reports({"/device:GPU:0": 2**30}, 0.8, 2**31)]
        [True]
    """
    if workers_on_host is None:
        workers_on_host = _host.local_size(os.environ) or 1
    grouped: dict[str, int] = {}
    for device, needed in needed_by_device.items():
        key = "host" if on_host(device) and not device_memory_bytes else device
        grouped[key] = grouped.get(key, 0) + needed
    reports = []
    for device, needed in grouped.items():
        sharing = 1
        free: int | None
        if device_memory_bytes is not None:
            free, source = device_memory_bytes, "given"
        else:
            free, source = (read_free or free_bytes)(device if device != "host" else "CPU:0")
            # Every local worker reads the same available RAM: each gets its share.
            sharing = (workers_on_host or 1) if shares_host_ram(source) else 1
        usable = usable_bytes(free, memory_fraction, sharing)
        reports.append(MemoryReport(device, needed, free, usable, source, sharing))
    return reports


def stream_chunk_steps(
    plan: ShardPlan, row_bytes: int, usable_bytes: int | None, slot_bytes: int | None = None
) -> int:
    """Whole steps per chunk of a streamed shard: two chunks (double buffering) fit.

    Both slots of a replica's ring must fit in `usable_bytes` together, each
    slot holds at most `slot_bytes`, and a chunk never has more steps than
    the epoch.

    Args:
        plan: The epoch's plan (its per-replica batch and steps per epoch).
        row_bytes: Bytes of one row, all columns together.
        usable_bytes: Bytes one replica may use (None when unknown).
        slot_bytes: Largest slot (`LoadOptions.stream_chunk_bytes`); None for
            no limit but the memory.

    Returns:
        Steps per chunk; 0 when not even one step fits twice.

    Example:
        >>> from shardfeed._data.plan import plan_shards
        >>> stream_chunk_steps(plan_shards(1000, 1, 10, "shard", False), 8, 1000)
        6
    """
    budget = slot_bytes
    if usable_bytes is not None:
        budget = usable_bytes // 2 if budget is None else min(budget, usable_bytes // 2)
    if budget is None:
        return plan.steps_per_epoch
    return min(budget // max(1, plan.per_replica_batch_size * row_bytes), plan.steps_per_epoch)


def fit_error(report: MemoryReport, memory_fraction: float, can_stream: bool = True) -> str:
    """The refusal of resident data that does not fit (`can_stream=False`:
    a backend without streaming, whose fix leaves it out)."""
    if not can_stream:
        return _errors.message(
            f"The resident data must fit in {memory_fraction:.0%} of the free memory "
            f"on {report.where} (the rest is headroom for the model).",
            report.numbers(),
            "Spread the rows over more replicas with placement='shard' (more devices or "
            "workers), store a compact dtype (e.g. uint8 images, float16 features) "
            "and cast in `transform`, or raise `LoadOptions.memory_fraction` if the "
            "model is small.",
        )
    return _errors.message(
        f"The resident data must fit in {memory_fraction:.0%} of the free memory "
        f"on {report.where} (the rest is headroom for the model).",
        report.numbers(),
        "Spread the rows over more replicas with placement='shard' (more GPUs or "
        "workers), store a compact dtype (e.g. uint8 images, float16 features) "
        "and cast in `transform`, stream the shard (`LoadOptions(streaming=True)`), "
        "or raise `LoadOptions.memory_fraction` if the model is small.",
    )
