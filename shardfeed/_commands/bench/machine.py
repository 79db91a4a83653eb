"""What the benchmark's numbers were measured on: CPU, cores, RAM, load, versions, date.

Separation of concerns: this module only reads the machine and library
versions for the report's header; it times and trains nothing.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from shardfeed._common.units import GIB, KIB


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) * KIB / GIB, 1)  # kB -> GiB
    except OSError:
        pass
    return None


def _version(distribution: str) -> str | None:
    """An installed distribution's version, without importing it (None if absent)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _version_in(python: str, distribution: str) -> str | None:
    """`distribution`'s version in another Python (None if absent there)."""
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def machine_info(jax_python: str | None = None) -> dict[str, Any]:
    """What the numbers were measured on.

    Returns:
        CPU model, core counts, RAM, load average, OS, Python, TensorFlow,
        Keras, NumPy and JAX versions (JAX: that of `jax_python`, where the
        `jax` variants run, else this Python's; None when not installed),
        devices and the date (UTC).

    Example:
        >>> machine_info()["cpu_count"]
        2
    """
    import keras
    import numpy as np
    import tensorflow as tf

    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "ram_gib": _ram_gib(),
        "load_average_1_5_15_min_at_start": load,
        "os": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "jax": _version_in(jax_python, "jax") if jax_python else _version("jax"),
        "devices": [d.name for d in tf.config.list_logical_devices()],
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
