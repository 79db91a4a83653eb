"""Device memory: how much a device has free, and whether a shard fits.

Separation of concerns: this module only answers "how many bytes are free on
this device" and "do these bytes fit with headroom"; it never allocates. The
dataset reads `memory_reports` before it creates a single variable, so a
shard that cannot fit streams (or fails, with `fit_error`'s numbers) instead
of crashing out of memory halfway through the upload.

TensorFlow has no public query for a GPU's *free* memory, so GPUs are read
through NVML (`pip install nvidia-ml-py`) when it is installed; CPU devices
(including logical CPU devices used in tests) share the host's RAM and are
read from `/proc/meminfo`. When nothing can be read the check is skipped and
says so in `MemoryReport.source`.

Several workers on one host (e.g. `shardfeed launch --num-workers 2` on CPU)
each read the same available RAM, so each may use only its share: the usable
bytes of the host are divided by the number of workers the launcher says
share it (`_host.local_size`). Workers that already loaded have lowered the
available RAM by then, which only makes the check stricter.
"""

from __future__ import annotations

import dataclasses
import os

from shardfeed._common import errors as _errors
from shardfeed._common import host as _host

GIB = 1024**3
MIB = 1024**2


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
    """

    device: str
    needed_bytes: int
    free_bytes: int | None
    usable_bytes: int | None
    source: str
    workers_on_host: int = 1

    @property
    def fits(self) -> bool:
        return self.usable_bytes is None or self.needed_bytes <= self.usable_bytes

    def numbers(self) -> str:
        """`needed_bytes=..., free_bytes=..., usable_bytes=...` for messages."""
        text = (
            f"needed_bytes={self.needed_bytes:,} ({self.needed_bytes / GIB:.2f} GiB), "
            f"free_bytes={self.free_bytes:,} ({(self.free_bytes or 0) / GIB:.2f} GiB, "
            f"from {self.source}), usable_bytes={self.usable_bytes:,}"
        )
        if self.workers_on_host > 1:
            text += f" (this worker's share: {self.workers_on_host} workers share the host)"
        return text


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
        import pynvml  # type: ignore[import-not-found]
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
    return free, ("meminfo" if free is not None else "unknown")


def memory_reports(
    needed_by_device: dict[str, int],
    memory_fraction: float,
    device_memory_bytes: int | None = None,
    workers_on_host: int | None = None,
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
        key = device if "GPU:" in device.upper() or device_memory_bytes else "host"
        grouped[key] = grouped.get(key, 0) + needed
    reports = []
    for device, needed in grouped.items():
        sharing = 1
        if device_memory_bytes is not None:
            free, source = device_memory_bytes, "given"
        else:
            free, source = free_bytes(device if device != "host" else "CPU:0")
            # Every local worker reads the same available RAM: each gets its share.
            sharing = workers_on_host if device == "host" and source == "meminfo" else 1
        usable = None if free is None else int(free * memory_fraction) // sharing
        reports.append(MemoryReport(device, needed, free, usable, source, sharing))
    return reports


def fit_error(report: MemoryReport, memory_fraction: float) -> str:
    return _errors.message(
        f"The resident data must fit in {memory_fraction:.0%} of the free memory "
        f"on {report.device} (the rest is headroom for the model).",
        report.numbers(),
        "Spread the rows over more replicas with placement='shard' (more GPUs or "
        "workers), store a compact dtype (e.g. uint8 images, float16 features) "
        "and cast in `transform`, stream the shard (`LoadOptions(streaming=True)`), "
        "or raise `LoadOptions.memory_fraction` if the model is small.",
    )
