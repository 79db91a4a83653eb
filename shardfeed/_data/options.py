"""`LoadOptions`: how a dataset is loaded and held, frozen and validated when built."""

from __future__ import annotations

import dataclasses
from typing import Literal

from shardfeed._common import errors as _errors
from shardfeed._common.units import MIB
from shardfeed._data.memory import check_memory_fraction


def _as_int(options: object, name: str) -> None:
    """Stores a validated NumPy integer field as a Python int (options are
    hashed and compared as cache keys, and printed in errors)."""
    value = getattr(options, name)
    if _errors.is_integer(value):
        object.__setattr__(options, name, int(value))


@dataclasses.dataclass(frozen=True)
class LoadOptions:
    """How a `ShardedResidentDataset` uploads its rows.

    Attributes:
        chunk_bytes: Largest host-to-device transfer, per column. Bounds the
            host memory a load needs beyond the source itself.
        memory_fraction: Share of a device's free memory the data may take;
            the rest is headroom for the model and its activations.
        device_memory_bytes: Free bytes per device, to use instead of what the
            device reports (for planning, or devices that report nothing).
        check_finite: Refuse float rows holding NaN or inf (checked per chunk
            while uploading).
        streaming: `"auto"` (default): hold each shard resident when it fits,
            else stream it through a two-slot ring (logged); True: always
            stream; False: never (a shard that does not fit is an error).
        stream_chunk_bytes: Rows per ring slot, in bytes per replica (rounded
            down to whole steps; shrunk so two slots fit).
        exchange_buffer_bytes: Most device bytes per replica the per-epoch
            exchange of a globally shuffled sharded dataset stages at once
            (counted in the memory check and `memory_plan`). `"auto"`
            (default): an eighth of the largest shard, at least 16 MiB and
            at most 256 MiB (`_data/exchange.buffer_bytes`); a number: that.
        exchange_fraction: Share of each replica's rows that the per-epoch
            exchange mixes across replicas, in (0, 1]. 1 (default): the exact
            global order; below 1: a partial mix, then a local shuffle
            (see docs/data.md).
        epoch_copy: Keras on JAX only (TensorFlow always gathers). Whether each
            epoch keeps a copy of each replica's rows in step order, so a step
            slices contiguous rows instead of gathering them: `"auto"`
            (default) copies only on CPU devices, where it was measured
            faster (shardfeed/_commands/bench/NOTES.md), and only when the copy and its
            exchange fit in `epoch_copy_bytes` and the memory check; True
            always copies (counted in the memory check); False never (device
            memory stays near one copy of the rows).
        epoch_copy_bytes: Most device bytes per replica that `"auto"` gives an
            epoch copy (with its exchange's staging).
        check_agreement: With several workers, check before loading that every
            worker passed the same rows (row count, columns, and a hash of a
            few seeded rows; docs/data.md "Several workers"): a mismatch
            raises on every rank. Costs two tiny all-gathers and a few row
            reads; False skips it (e.g. when each host holds only its own
            files).

    Example:
        >>> LoadOptions(chunk_bytes=16 * 1024**2, check_finite=True)
    """

    chunk_bytes: int = 64 * MIB
    memory_fraction: float = 0.8
    device_memory_bytes: int | None = None
    check_finite: bool = False
    streaming: bool | Literal["auto"] = "auto"
    stream_chunk_bytes: int = 256 * MIB
    exchange_buffer_bytes: int | Literal["auto"] = "auto"
    exchange_fraction: float = 1.0
    check_agreement: bool = True
    epoch_copy: bool | Literal["auto"] = "auto"
    epoch_copy_bytes: int = 256 * MIB

    def __post_init__(self) -> None:
        _errors.require(
            _errors.is_integer(self.chunk_bytes) and self.chunk_bytes >= 1,
            "`chunk_bytes` must be a positive integer.",
            f"chunk_bytes={self.chunk_bytes!r}",
            "Use e.g. 64 * 1024**2 (64 MiB).",
        )
        check_memory_fraction(self.memory_fraction)
        _errors.require(
            self.device_memory_bytes is None
            or (_errors.is_integer(self.device_memory_bytes) and self.device_memory_bytes > 0),
            "`device_memory_bytes` must be None or a positive integer.",
            f"device_memory_bytes={self.device_memory_bytes!r}",
            "Pass the free bytes per device, e.g. 80 * 1024**3.",
        )
        _errors.require(
            _errors.is_switch(self.streaming),
            '`streaming` must be True, False or "auto".',
            f"streaming={self.streaming!r}",
            'Use "auto" to stream only shards that do not fit.',
        )
        _errors.require(
            _errors.is_integer(self.stream_chunk_bytes) and self.stream_chunk_bytes >= 1,
            "`stream_chunk_bytes` must be a positive integer.",
            f"stream_chunk_bytes={self.stream_chunk_bytes!r}",
            "Use e.g. 256 * 1024**2 (256 MiB per slot).",
        )
        _errors.require(
            (isinstance(self.exchange_buffer_bytes, str) and self.exchange_buffer_bytes == "auto")
            or (_errors.is_integer(self.exchange_buffer_bytes) and self.exchange_buffer_bytes >= 1),
            '`exchange_buffer_bytes` must be "auto" or a positive integer.',
            f"exchange_buffer_bytes={self.exchange_buffer_bytes!r}",
            'Use "auto" (sized to the shard) or e.g. 256 * 1024**2 (256 MiB of staging '
            "per replica).",
        )
        _errors.require(
            isinstance(self.exchange_fraction, int | float)
            and not isinstance(self.exchange_fraction, bool)
            and 0 < self.exchange_fraction <= 1,
            "`exchange_fraction` must be a number in (0, 1].",
            f"exchange_fraction={self.exchange_fraction!r}",
            "Use 1 for the exact global order, or e.g. 0.25 to mix a quarter of the rows.",
        )
        _errors.require(
            isinstance(self.check_agreement, bool),
            "`check_agreement` must be True or False.",
            f"check_agreement={self.check_agreement!r}",
            "Leave it True (the default) to check that every worker passed the same "
            "rows, or pass False to skip the check.",
        )
        _errors.require(
            _errors.is_switch(self.epoch_copy),
            '`epoch_copy` must be True, False or "auto".',
            f"epoch_copy={self.epoch_copy!r}",
            'Use "auto" to copy an epoch\'s rows only where it is faster and fits.',
        )
        _errors.require(
            _errors.is_integer(self.epoch_copy_bytes) and self.epoch_copy_bytes >= 0,
            "`epoch_copy_bytes` must be a non-negative integer.",
            f"epoch_copy_bytes={self.epoch_copy_bytes!r}",
            "Use e.g. 256 * 1024**2 (256 MiB per replica), or 0 to never copy under \"auto\".",
        )
        object.__setattr__(self, "exchange_fraction", float(self.exchange_fraction))
        for name in ("chunk_bytes", "device_memory_bytes", "stream_chunk_bytes",
                     "exchange_buffer_bytes", "epoch_copy_bytes"):
            _as_int(self, name)
