"""`MemoryPlan`'s words: its per-rank table, its verdict and the advice when it does not fit."""

from __future__ import annotations

import math

import numpy as np

from shardfeed._common.units import format_bytes
from shardfeed._data.memnumbers import MemoryNumbers, RankMemory
from shardfeed._data.memory import HOST_RAM_SOURCE, stream_chunk_steps

# The compact dtype advised for each float dtype (cast back in `transform`).
COMPACT: dict[np.dtype, np.dtype] = {
    np.dtype("float64"): np.dtype("float32"),
    np.dtype("float32"): np.dtype("float16"),
}
_SOURCE_WORDS = {
    "given": "given",
    "nvml": "GPU:0 via NVML",
    HOST_RAM_SOURCE: "this host's available RAM, /proc/meminfo",
}


def table(mem: MemoryNumbers) -> str:
    """`MemoryPlan.table()`: a summary, one aligned row per rank, the verdict."""
    plan, n_rep = mem.shard_plan, mem.shard_plan.num_replicas
    described = ", ".join(f"{c.name}: {c.dtype.name}{list(c.row_shape)}" for c in mem.columns)
    lines = [
        f"data: {plan.num_rows:,} rows x {mem.row_bytes:,} B/row ({described}) = "
        f"{format_bytes(plan.num_rows * mem.row_bytes)}",
        f"plan: {mem.num_workers} worker(s) x {mem.replicas_per_worker} replica(s) = "
        f"{n_rep} replica(s){_hosts_words(mem)}; "
        f"per_replica_batch_size={plan.per_replica_batch_size} "
        f"(global batch {plan.global_batch_size:,}); placement={plan.placement!r}; "
        f"drop_remainder={plan.drop_remainder}",
        *(
            [f"shuffle={mem.shuffle}: the "
             f"{'per-epoch exchange' if mem.shuffle is True else 'exchange (once)'} stages up to "
             f"{format_bytes(mem.ranks[0].staging_bytes)} per device (counted in fits)"]
            if mem.ranks[0].staging_bytes
            else []
        ),
        "",
    ]
    header: tuple[str, ...] = (
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
    rows: list[tuple[str, ...]] = [header]
    for r in mem.ranks:
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
    if mem.workers_per_host > 1:
        # Which host each rank is on: its needs count with its host-mates'.
        rows = [
            (row[0], "host" if i == 0 else str(mem.ranks[i - 1].host), *row[1:])
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
    lines += ["", _verdict(mem)]
    return "\n".join(lines)


def _hosts_words(mem: MemoryNumbers) -> str:
    if mem.workers_per_host == 1:
        return ""
    return f" on {mem.num_hosts} host(s) of {mem.workers_per_host} worker(s)"


def _verdict(mem: MemoryNumbers) -> str:
    worst = max(mem.ranks, key=lambda r: r.needed_bytes)
    if worst.usable_bytes is None:
        return (
            "not checked: the free device memory is unknown (no GPU through NVML, no "
            "/proc/meminfo); pass device_memory_bytes (--device-memory)."
        )
    per = "" if mem.shared_host else " per device"
    memory = (
        f"{format_bytes(worst.usable_bytes)} usable ({mem.memory_fraction:.0%} of "
        f"{format_bytes(worst.free_bytes or 0)} free{per}, "
        f"{_SOURCE_WORDS.get(mem.memory_source, mem.memory_source)})"
    )
    what = "each device needs at most"
    if mem.shared_host and mem.workers_per_host > 1:
        what = (
            f"the {mem.workers_per_host} workers on each host ({mem.devices_per_host} "
            "devices) share its RAM and need"
        )
    elif mem.shared_host and mem.replicas_per_worker > 1:
        what = f"each worker's {mem.replicas_per_worker} devices share the host and need"
    assumed = ""
    if mem.shared_host and mem.workers_per_host == 1 and mem.num_workers > 1:
        # The plan cannot know where workers run: say what it assumed.
        assumed = (
            " Assumed one worker per host; pass workers_per_host (--workers-per-host) "
            "when several share one."
        )
    if mem.fits:
        return f"fits: {what} {format_bytes(worst.needed_bytes)} of {memory}.{assumed}"
    misfits = ", ".join(str(r.rank) for r in mem.ranks if not r.fits)
    return (
        f"does NOT fit on rank(s) {misfits}: {what} {format_bytes(worst.needed_bytes)}, "
        f"over {memory}.{assumed}"
    )


def advice(mem: MemoryNumbers) -> list[str]:
    """`MemoryPlan.advice()`: what would make the data fit, one sentence per way out."""
    if mem.fits:
        return []
    worst = max(mem.ranks, key=lambda r: r.needed_bytes)
    usable = worst.usable_bytes or 0  # known: unknown memory always "fits"
    if mem.ways_out:
        return _staged_advice(mem, usable)
    return [_more_replicas(mem, usable), *_compact(mem, worst), _streaming(mem, usable)]


def _where(mem: MemoryNumbers) -> str:
    if not mem.shared_host:
        return "per device"
    return "per host" if mem.workers_per_host > 1 else "per worker"


def _needed(mem: MemoryNumbers) -> int:
    return max(r.needed_bytes for r in mem.ranks)


def _outcome(mem: MemoryNumbers, usable: int) -> str:
    verdict = "fits in" if mem.fits else "is still over"
    needed = format_bytes(_needed(mem))
    return f"{needed} {_where(mem)}, which {verdict} {format_bytes(usable)} usable"


def _staged_advice(mem: MemoryNumbers, usable: int) -> list[str]:
    """Advice when the global shuffle's exchange staging is counted: every way
    out was planned again (`WayOut`), so each sentence says what would fit."""
    staged = format_bytes(mem.ranks[0].staging_bytes)
    lines = []
    local_fits = False
    for way in mem.ways_out:
        if way.change in ("workers", "hosts"):
            unit = "host" if way.change == "hosts" else "worker"
            now = mem.num_hosts if way.change == "hosts" else mem.num_workers
            if way.value is not None and way.plan is not None:
                lines.append(
                    f"Use more {unit}s: with shuffle={mem.shuffle} (its exchange stages up to "
                    f"{format_bytes(way.plan.ranks[0].staging_bytes)} per device then), "
                    f"{way.value:,} {unit}(s) are the fewest that fit: "
                    f"{_outcome(way.plan, usable)} (now {now})."
                )
            else:
                lines.append(
                    f"More {unit}s do not make it fit with shuffle={mem.shuffle}: each device also "
                    f"stages the exchange's buffer (now {staged}, at most "
                    f"exchange_buffer_bytes={mem.exchange_buffer_bytes:,}), which more "
                    f"{unit}s do not shrink enough."
                )
        elif way.change == "shuffle_local" and way.plan is not None:
            local_fits = way.plan.fits
            lines.append(
                'Pass shuffle="local" (each replica shuffles its own rows; no exchange, '
                f"no staging): {_outcome(way.plan, usable)}."
            )
        elif way.change == "exchange_buffer_bytes":
            if way.value is not None and way.plan is not None:
                lines.append(
                    f"Lower `LoadOptions.exchange_buffer_bytes` to {way.value:,} "
                    f"({format_bytes(way.value)}; now {mem.exchange_buffer_bytes:,}): "
                    f"{_outcome(way.plan, usable)}; a smaller buffer means more exchange "
                    f"rounds{' per epoch' if mem.shuffle is True else ''}."
                )
            elif way.plan is not None:
                lines.append(
                    "No `LoadOptions.exchange_buffer_bytes` makes it fit: even staging one "
                    f"row per round needs {_outcome(way.plan, usable)}."
                )
        elif way.change == "compact" and way.plan is not None:
            casts = [c for c in mem.columns if c.dtype in COMPACT]
            listed = ", ".join(f"{c.name} {c.dtype.name}->{COMPACT[c.dtype].name}" for c in casts)
            lines.append(
                f"Store a compact dtype and cast in `transform` ({listed}): "
                f"{_outcome(way.plan, usable)} (now {format_bytes(_needed(mem))})."
            )
    if not local_fits:
        # The global shuffle refuses to stream (a streamed shard has no global order).
        stream = _streaming(mem, usable)
        if stream.startswith("Stream the shard") and mem.shuffle is True:
            stream = 'With shuffle="local" (the global shuffle cannot stream), s' + stream[1:]
        elif stream.startswith("Stream the shard"):
            # Rows in order stream too; on TensorFlow they then stay on their shards.
            stream += (
                " Streamed on TensorFlow, each replica takes its own shard's rows in order "
                "(not one replica's batches; it warns)."
            )
        lines.append(stream)
    return lines


def _more_replicas(mem: MemoryNumbers, usable: int) -> str:
    plan, r_per_w = mem.shard_plan, mem.replicas_per_worker
    max_rows = usable // mem.row_bytes
    limit = format_bytes(usable)
    if mem.shared_host and mem.workers_per_host > 1:
        # All devices of all workers on a host share its RAM: only more hosts help.
        per_host = mem.workers_per_host * r_per_w
        if max_rows < per_host:
            return (
                f"Even one row per device ({per_host} devices on a host x "
                f"{format_bytes(mem.row_bytes)}) does not fit in {limit} usable: use "
                "fewer workers per host, fewer replicas per worker or a compact dtype."
            )
        hosts = _fewest_groups(plan.num_rows, max_rows, per_host)
        return (
            f"Use more hosts: the {mem.workers_per_host} workers on a host "
            f"({per_host} device(s)) share its RAM, so with placement='shard' at least "
            f"{hosts} host(s) of {mem.workers_per_host} worker(s) keep every host within "
            f"{limit} usable (now {mem.num_hosts})."
        )
    if mem.shared_host:
        # A worker's devices share the host's RAM, so only more workers help.
        if max_rows < r_per_w:
            return (
                f"Even one row per device ({r_per_w} devices x "
                f"{format_bytes(mem.row_bytes)}) does not fit in {limit} usable: use "
                "fewer replicas per worker or a compact dtype."
            )
        workers = _fewest_groups(plan.num_rows, max_rows, r_per_w)
        return (
            f"Use more workers: each worker's {r_per_w} device(s) share one host's RAM, so "
            f"with placement='shard' at least {workers} worker(s) keep every worker within "
            f"{limit} usable (now {mem.num_workers})."
        )
    if max_rows == 0:
        return (
            f"One row ({format_bytes(mem.row_bytes)}) is larger than {limit} usable per "
            "device: no number of replicas helps; store a compact dtype."
        )
    replicas = -(-plan.num_rows // max_rows)
    workers = -(-replicas // r_per_w)
    if replicas <= plan.num_replicas:  # only when replicating now
        rows = -(-plan.num_rows // plan.num_replicas)
        return (
            f"Shard instead of replicating: with placement='shard', the current "
            f"{plan.num_replicas} replicas hold at most {rows:,} rows "
            f"({format_bytes(rows * mem.row_bytes)}) per device, within {limit} usable "
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
    if replicas > plan.num_rows:
        # A training step needs a real row on every replica (`plan_shards`).
        text += f" A training epoch needs a row per replica: {plan.num_rows:,} rows is too few."
    return text


def _compact(mem: MemoryNumbers, worst: RankMemory) -> list[str]:
    casts = [c for c in mem.columns if c.dtype in COMPACT]
    if not casts:
        return []
    compact_row_bytes = sum(
        math.prod(c.row_shape) * COMPACT.get(c.dtype, c.dtype).itemsize for c in mem.columns
    )
    needed = worst.needed_bytes // mem.row_bytes * compact_row_bytes
    usable = worst.usable_bytes or 0
    listed = ", ".join(f"{c.name} {c.dtype.name}->{COMPACT[c.dtype].name}" for c in casts)
    verdict = "fits in" if needed <= usable else "is still over"
    where = "per device"
    if mem.shared_host:
        where = "per host" if mem.workers_per_host > 1 else "per worker"
    return [
        f"Store a compact dtype and cast in `transform` ({listed}): "
        f"{format_bytes(needed)} {where} instead of {format_bytes(worst.needed_bytes)}, "
        f"which {verdict} {format_bytes(usable)} usable."
    ]


def _streaming(mem: MemoryNumbers, usable: int) -> str:
    plan = mem.shard_plan
    if plan.placement != "shard":
        return (
            "Streaming (`LoadOptions(streaming=True)`) needs placement='shard': each "
            "replica streams its own rows."
        )
    # Replicas on one host share its RAM, as in `ShardedResidentDataset`.
    per_device = usable // (mem.devices_per_host if mem.shared_host else 1)
    b = plan.per_replica_batch_size
    step_bytes = b * mem.row_bytes
    # Two slots (double buffering) of whole steps, as `_streaming.stream_layout` cuts them.
    steps = stream_chunk_steps(plan, mem.row_bytes, per_device)
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


def _fewest_groups(num_rows: int, max_rows: int, replicas_per_group: int) -> int:
    """The fewest workers (or hosts) of `replicas_per_group` devices whose
    largest group holds at most `max_rows` rows with placement='shard'."""
    groups = max(1, -(-num_rows // max_rows))
    while _largest_rank_rows(num_rows, groups, replicas_per_group) > max_rows:
        groups += 1
    return groups


def _largest_rank_rows(num_rows: int, num_groups: int, replicas_per_group: int) -> int:
    # The first worker (or host) holds the largest shards: `split_rows` gives
    # the first ones a row more.
    base, extra = divmod(num_rows, num_groups * replicas_per_group)
    return replicas_per_group * base + min(replicas_per_group, extra)
