"""`shardfeed.init` on TensorFlow: the engine for how this script was started.

Turns the launcher's variables (`launch_env`) into a running `tf.distribute`
strategy or an initialised Horovod, after a bounded wait for peers, and
returns the `World`; one GPU per local worker.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Literal

from shardfeed._common import errors as _errors
from shardfeed._common.host import local_size as local_size
from shardfeed._distribute import credentials as _credentials
from shardfeed._distribute import launch_env as _launch_env
from shardfeed._distribute import progress as _progress
from shardfeed._distribute import startup as _startup
from shardfeed._distribute import tf_config as _tf_config
from shardfeed._distribute.startup import CPU_DEVICES_ENV as CPU_DEVICES_ENV
from shardfeed._distribute.startup import cpu_devices_wanted as cpu_devices_wanted
from shardfeed._tf.engines import resolver as _resolver

logger = logging.getLogger("shardfeed")

EngineName = Literal["auto", "single", "mirrored", "multiworker", "horovod"]
ENGINES = ("auto", "single", "mirrored", "multiworker", "horovod")


def resolve_engine(
    engine: str, launch_env: _launch_env.LaunchEnv, num_gpus: int, num_cpu_devices: int
) -> str:
    """Chooses the engine: pure, so every rule is tested with plain values.

    `"auto"`: Horovod when started by horovodrun; MultiWorkerMirroredStrategy
    when a launcher started several workers; MirroredStrategy when this
    process sees several GPUs (or CPU devices split on purpose); else a
    single device.
    """
    if engine not in ENGINES:
        raise ValueError(
            _errors.message(
                f"`engine` must be one of {ENGINES}.",
                f"engine={engine!r}",
                'Use "auto" to pick from how the script was started.',
            )
        )
    if engine != "auto":
        return engine
    if launch_env.launcher == "horovod":
        return "horovod"
    if launch_env.world_size > 1:
        return "multiworker"
    if num_gpus > 1 or (num_gpus == 0 and num_cpu_devices > 1):
        return "mirrored"
    return "single"


def gpu_for_worker(
    gpus: Sequence[str], local_rank: int | None, workers_on_host: int | None
) -> str | None:
    """The GPU a worker should keep when several workers share a host.

    Returns None (keep every visible GPU) for one worker per host, or when the
    launcher already pinned one GPU per process (`CUDA_VISIBLE_DEVICES`).
    """
    if local_rank is None or not workers_on_host or workers_on_host <= 1 or len(gpus) <= 1:
        return None
    if len(gpus) < workers_on_host:
        raise ValueError(
            _errors.message(
                "Each worker on a host needs its own GPU.",
                f"workers_on_host={workers_on_host}, visible GPUs={len(gpus)}",
                "Start one worker per GPU, or set CUDA_VISIBLE_DEVICES per worker.",
            )
        )
    return gpus[local_rank]


def init(
    engine: EngineName = "auto",
    cpu_devices: int | None = None,
    *,
    startup_timeout_s: float | None = None,
):
    """Starts the distribution context for how this script was launched.

    Args:
        engine: `"auto"` (default: decided by `resolve_engine`), or force one
            of `"single"`, `"mirrored"`, `"multiworker"`, `"horovod"`.
        cpu_devices: Split the CPU into this many logical devices first (on
            a machine without GPUs, one process): with more than one,
            `"auto"` picks MirroredStrategy over them, to try several
            replicas on a laptop or in CI. None (default): the variable
            `SHARDFEED_CPU_DEVICES`, else leave the CPU as it is. Must come
            before anything initialises TensorFlow's devices.
        startup_timeout_s: `multiworker` only: seconds to wait for every other
            task of the TF_CONFIG cluster to start before TensorFlow's own
            set-up (default: `SHARDFEED_STARTUP_TIMEOUT_S`, else 300;
            `math.inf` waits without a bound). SIGTERM ends the process while
            it waits.

    Returns:
        The `World`: rank, world size, local devices, and `world.scope()` to
        build the model and datasets in.

    Signals: creating MultiWorkerMirroredStrategy installs TensorFlow's own
    SIGTERM handler (its preemption watcher), after which SIGTERM no longer
    ends the process. `init` puts back the SIGTERM disposition it found (the
    default, which ends the process at once even while it waits in a
    collective, or your own Python handler), so a launcher or scheduler that
    stops workers with SIGTERM does not wait for its SIGKILL. Only when `init`
    runs in the main thread, where Python may set handlers. While the
    strategy's set-up waits for the other workers, TensorFlow's handler is in
    place (and the set-up holds the GIL): SIGTERM is ignored there. So `init`
    first waits for every peer's port to answer itself, bounded by
    `startup_timeout_s`, with SIGTERM as it found it; only a peer that answers
    and then dies before its own set-up leaves TensorFlow's wait (and
    `shardfeed launch` stops such workers with SIGKILL).

    Exposure: when the cluster names any non-loopback host, the chief logs
    once (logger "shardfeed", WARNING) that the workers' servers listen on
    every interface, unauthenticated, naming the ports; under `shardfeed
    launch --hosts` each host's launcher prints that line instead.

    Raises:
        ValueError: For an unknown engine or inconsistent launcher variables,
            or `cpu_devices` with GPUs, several workers or Horovod.
        RuntimeError: For `cpu_devices` after TensorFlow initialised its
            devices, naming the fix.
        ImportError: For `"horovod"` without Horovod installed, with the fix.
        OSError: If this worker's TF_CONFIG port is already in use (named in
            the message), instead of TensorFlow's failure a minute later.
        TimeoutError: If peers never answered within `startup_timeout_s`
            (named with their TF_CONFIG addresses, and why).

    Example:
        >>> world = shardfeed.init()
        >>> world.num_replicas_in_sync
        1
    """
    # Before TensorFlow's import (seconds): the launcher's start-up timeout
    # names the ranks that never get here, and it kills (SIGKILL) the workers
    # between the two announcements, which TensorFlow's set-up makes deaf to
    # SIGTERM.
    _launch_env.announce(_launch_env.ARRIVED)
    timeout_s = _startup.startup_timeout_s(startup_timeout_s, os.environ)
    world = _init(engine, cpu_devices_wanted(cpu_devices, os.environ), timeout_s)
    from shardfeed._tf import world as _world

    _world.remember_initialized(world)
    _launch_env.announce(_launch_env.INITIALIZED)
    _launch_env.record_exit_start()
    _progress.dump_stacks_on_request()
    return world


def _init(engine: str, split_cpu_into: int | None, startup_timeout_s: float):
    import tensorflow as tf

    from shardfeed._tf import world as _world

    launch_env = _launch_env.detect_launch_env(os.environ)
    physical_gpus = tf.config.list_physical_devices("GPU")
    # Listing logical devices initialises the runtime: only count CPU devices
    # already configured, without fixing the configuration.
    cpu_devices = tf.config.get_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0]
    )
    num_cpu_devices = len(cpu_devices or ()) if split_cpu_into is None else split_cpu_into
    chosen = resolve_engine(engine, launch_env, len(physical_gpus), num_cpu_devices)
    if split_cpu_into is not None:
        _split_cpu(tf, split_cpu_into, chosen, len(physical_gpus))
    pinned = gpu_for_worker(
        [g.name for g in physical_gpus], launch_env.local_rank, local_size(os.environ)
    )
    if pinned is not None and chosen != "horovod":
        tf.config.set_visible_devices([g for g in physical_gpus if g.name == pinned], "GPU")
    if chosen in ("horovod", "multiworker"):
        runtime = "Horovod" if chosen == "horovod" else "TensorFlow's gRPC runtime (MWMS)"
        _credentials.refuse_credentials_without_mtls(os.environ, runtime)
    if chosen == "horovod":
        return _init_horovod(tf, physical_gpus)
    if chosen == "multiworker":
        _resolver.ensure_tf_config()
        own = _tf_config.own_server_address()
        if own is not None:
            _tf_config.check_port_free(*own)
            tasks = _startup.cluster_tasks(os.environ)
            line = _startup.exposure_line(tasks)
            # Under `shardfeed launch` each host's launcher says it, once per host.
            if line is not None and own[0] == 0 and launch_env.launcher != "shardfeed":
                logger.warning(line)
            _startup.wait_for_peers(tasks, own[0], startup_timeout_s)
        with _startup.keeping_sigterm_disposition():
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
        return _world.current_world(strategy)
    if chosen == "mirrored":
        devices = [d.name for d in tf.config.list_logical_devices("GPU")] or [
            d.name for d in tf.config.list_logical_devices("CPU")
        ]
        return _world.current_world(tf.distribute.MirroredStrategy(devices))
    return _world.current_world()


def _split_cpu(tf, num_devices: int, engine: str, num_gpus: int) -> None:
    """Splits the CPU into `num_devices` logical devices (nothing to do when
    it is already split so, e.g. by a second `init`)."""
    received = f"cpu_devices={num_devices}"
    if num_devices > 1 and (num_gpus or engine in ("multiworker", "horovod")):
        where = f"{num_gpus} GPU(s)" if num_gpus else f"engine={engine!r}"
        raise ValueError(
            _errors.message(
                "`cpu_devices` splits the CPU of one process without GPUs (MirroredStrategy "
                "over logical CPUs); with GPUs or one worker per device it would be "
                "ignored.",
                f"{received} with {where}",
                "Drop `cpu_devices` (and unset SHARDFEED_CPU_DEVICES), or start one "
                'process on a machine without GPUs (`CUDA_VISIBLE_DEVICES=""`).',
            )
        )
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if len(current or [None]) == num_devices:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)]
        )
    except RuntimeError as err:  # TensorFlow's devices are already initialised
        have = len(tf.config.list_logical_devices("CPU"))
        raise RuntimeError(
            _errors.message(
                "The CPU can be split into logical devices only before TensorFlow "
                "initialises its devices (the first op, or listing logical devices).",
                f"{received}, TensorFlow already runs with {have} CPU device(s)",
                "Call `shardfeed.init(cpu_devices=N)` (or set SHARDFEED_CPU_DEVICES=N) "
                "before any other TensorFlow or Keras call, e.g. first thing in the script.",
            )
        ) from err


def _init_horovod(tf, physical_gpus):
    try:
        import horovod.tensorflow as hvd
    except ImportError as err:
        raise ImportError(
            _errors.message(
                "The Horovod engine needs Horovod built with TensorFlow support.",
                f"import horovod.tensorflow failed ({err})",
                "Install it with `HOROVOD_WITH_TENSORFLOW=1 pip install shardfeed[horovod]` "
                "(see docs/engines.md for the supported TensorFlow versions), or use the "
                "tf.distribute engines (`shardfeed launch --engine multiworker`).",
            )
        ) from err
    from shardfeed._tf import world as _world

    hvd.init()
    if physical_gpus:
        # One process per GPU: keep only this rank's GPU visible.
        tf.config.set_visible_devices(physical_gpus[hvd.local_rank() % len(physical_gpus)], "GPU")
    return _world.horovod_world()
