"""What the benchmark's numbers were measured on: CPU, cores, RAM, load, versions, date."""

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


def _devices(backend: str) -> tuple[list[str], str | None]:
    """The devices of the Keras backend in use, and the first accelerator's name
    (None on CPU): TensorFlow's logical devices, or `jax.devices()` (platform,
    id, device kind, e.g. "cuda:0 NVIDIA H200")."""
    if backend == "jax":
        import jax

        devices = jax.devices()
        names = [f"{d.platform}:{d.id} {d.device_kind}" for d in devices]
        accelerators = [d.device_kind for d in devices if d.platform != "cpu"]
    else:
        import tensorflow as tf

        names = [d.name for d in tf.config.list_logical_devices()]
        accelerators = [
            tf.config.experimental.get_device_details(d).get("device_name", d.name)
            for d in tf.config.list_physical_devices("GPU")
        ]
    return names, accelerators[0] if accelerators else None


def _tensorflow_version(backend: str) -> str | None:
    """TensorFlow's version: imported on its own backend, else read from the
    installed metadata (the CPU build's distribution is `tensorflow-cpu`)."""
    if backend != "jax":
        import tensorflow as tf

        return str(tf.__version__)
    return _version("tensorflow") or _version("tensorflow-cpu")


def machine_info(jax_python: str | None = None) -> dict[str, Any]:
    """What the numbers were measured on.

    TensorFlow is imported only when Keras runs on it: on the JAX backend its
    version is read from the installed metadata (None when absent), so the
    bench on JAX imports no TensorFlow.

    Args:
        jax_python: The Python where the `jax` variants run on the TensorFlow
            backend (their worker processes); None: this Python.

    Returns:
        CPU model, core counts, RAM, load average, OS, Python, the Keras
        backend, TensorFlow, Keras, NumPy and JAX versions (JAX: that of
        `jax_python` when given, else this Python's; None when not installed),
        the backend's devices, the accelerator's name (None on CPU) and the
        date (UTC).

    Example:
        >>> machine_info()["cpu_count"]
        2
    """
    import keras
    import numpy as np

    backend = keras.backend.backend()
    devices, accelerator = _devices(backend)
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
        "keras_backend": backend,
        "tensorflow": _tensorflow_version(backend),
        "keras": keras.__version__,
        "numpy": np.__version__,
        "jax": _version_in(jax_python, "jax") if jax_python else _version("jax"),
        "devices": devices,
        "accelerator": accelerator,
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def machine_line(machine: dict[str, Any]) -> str:
    """The report's one-line header: where and with what the numbers were measured.

    Example:
        >>> machine_line(machine_info())
        'Machine: AMD EPYC ..., 2 of 2 cores usable, ...; Keras 3.15.1 on jax, ...'
    """
    m = machine
    versions = [
        f"Python {m['python']}",
        f"Keras {m['keras']} on {m.get('keras_backend', 'tensorflow')}",
        f"TensorFlow {m['tensorflow']}" if m.get("tensorflow") else "no TensorFlow",
        f"JAX {m['jax']}" if m.get("jax") else "no JAX",
        f"NumPy {m['numpy']}",
    ]
    accelerator = f"{m['accelerator']}, " if m.get("accelerator") else ""
    return (
        f"Machine: {accelerator}{m['cpu']}, {m['cpus_usable']} of {m['cpu_count']} cores "
        f"usable, {m['ram_gib']} GiB RAM, load average {m['load_average_1_5_15_min_at_start']} "
        f"at start; {m['os']}; {', '.join(versions)}; devices {', '.join(m['devices'])}."
    )
