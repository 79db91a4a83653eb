"""Frozen option objects, validated when they are built.

Separation of concerns: options are plain values. Each layer reads the
options it owns (`LoadOptions` -> storage; `FitOptions` -> engine and loop)
and no layer threads long keyword lists through another.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from shardfeed import _errors
from shardfeed._memory import MIB


def _require(ok: bool, constraint: str, received: str, fix: str) -> None:
    if not ok:
        raise ValueError(_errors.message(constraint, received, fix))


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

    Example:
        >>> LoadOptions(chunk_bytes=16 * 1024**2, check_finite=True)
    """

    chunk_bytes: int = 64 * MIB
    memory_fraction: float = 0.8
    device_memory_bytes: int | None = None
    check_finite: bool = False
    streaming: bool | Literal["auto"] = "auto"
    stream_chunk_bytes: int = 256 * MIB

    def __post_init__(self) -> None:
        _require(
            isinstance(self.chunk_bytes, int) and self.chunk_bytes >= 1,
            "`chunk_bytes` must be a positive integer.",
            f"chunk_bytes={self.chunk_bytes!r}",
            "Use e.g. 64 * 1024**2 (64 MiB).",
        )
        _require(
            0.0 < self.memory_fraction <= 1.0,
            "`memory_fraction` must be in (0, 1].",
            f"memory_fraction={self.memory_fraction!r}",
            "Use e.g. 0.8 to leave 20% of free memory for the model.",
        )
        _require(
            self.device_memory_bytes is None
            or (isinstance(self.device_memory_bytes, int) and self.device_memory_bytes > 0),
            "`device_memory_bytes` must be None or a positive integer.",
            f"device_memory_bytes={self.device_memory_bytes!r}",
            "Pass the free bytes per device, e.g. 80 * 1024**3.",
        )
        _require(
            self.streaming in (True, False, "auto"),
            '`streaming` must be True, False or "auto".',
            f"streaming={self.streaming!r}",
            'Use "auto" to stream only shards that do not fit.',
        )
        _require(
            isinstance(self.stream_chunk_bytes, int) and self.stream_chunk_bytes >= 1,
            "`stream_chunk_bytes` must be a positive integer.",
            f"stream_chunk_bytes={self.stream_chunk_bytes!r}",
            "Use e.g. 256 * 1024**2 (256 MiB per slot).",
        )


@dataclasses.dataclass(frozen=True)
class FitOptions:
    """How the compiled training loop runs.

    Attributes:
        steps_per_execution: Steps per compiled call, or "auto" (about 10
            calls per epoch, at most 512 steps each). Only each call's logs
            come back to Python, so callbacks' `on_*_batch_end` hooks and the
            progress bar see one update per call.
        jit_compile: XLA for the step: True, False, or "auto" (on for GPUs;
            on CPUs only for models without convolutions, which XLA's CPU
            backend runs far slower inside loops).

    Example:
        >>> FitOptions(steps_per_execution=64, jit_compile=False)
    """

    steps_per_execution: int | Literal["auto"] = "auto"
    jit_compile: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        spe = self.steps_per_execution
        _require(
            spe == "auto" or (isinstance(spe, int) and not isinstance(spe, bool) and spe >= 1),
            '`steps_per_execution` must be "auto" or an integer >= 1.',
            f"steps_per_execution={spe!r}",
            'Use "auto" or e.g. 64.',
        )
        _require(
            self.jit_compile in (True, False, "auto"),
            '`jit_compile` must be True, False or "auto".',
            f"jit_compile={self.jit_compile!r}",
            'Use "auto" unless you measured otherwise.',
        )
