"""`shardfeed.init`: pick the engine for how this script was started.

Separation of concerns: the launcher (shardfeed launch, horovodrun, mpirun,
srun) starts processes and sets variables; `_cluster` reads them; this module
turns that into a running distribution context -- a `tf.distribute` strategy
or an initialised Horovod -- and returns the `World`. After it, the dataset
and the engine read the world; nothing else looks at the environment.

One script runs unchanged everywhere:

    world = shardfeed.init()
    with world.scope():
        model = build_and_compile()
        train = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=256, seed=0)
    shardfeed.fit(model, train, epochs=10)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

from shardfeed._common import errors as _errors
from shardfeed._common.host import local_size as local_size
from shardfeed._distribute import tf_config as _cluster  # LaunchEnv, detect_launch_env too

EngineName = Literal["auto", "single", "mirrored", "multiworker", "horovod"]
ENGINES = ("auto", "single", "mirrored", "multiworker", "horovod")


def resolve_engine(
    engine: str, launch_env: _cluster.LaunchEnv, num_gpus: int, num_cpu_devices: int
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


def init(engine: EngineName = "auto"):
    """Starts the distribution context for how this script was launched.

    Args:
        engine: `"auto"` (default: decided by `resolve_engine`), or force one
            of `"single"`, `"mirrored"`, `"multiworker"`, `"horovod"`.

    Returns:
        The `World`: rank, world size, local devices, and `world.scope()` to
        build the model and datasets in.

    Raises:
        ValueError: For an unknown engine or inconsistent launcher variables.
        ImportError: For `"horovod"` without Horovod installed, with the fix.

    Example:
        >>> world = shardfeed.init()
        >>> world.num_replicas_in_sync
        1
    """
    import tensorflow as tf

    from shardfeed._distribute import world as _world

    launch_env = _cluster.detect_launch_env(os.environ)
    physical_gpus = tf.config.list_physical_devices("GPU")
    # Listing logical devices initialises the runtime: only count CPU devices
    # already configured, without fixing the configuration.
    cpu_devices = tf.config.get_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0]
    )
    chosen = resolve_engine(engine, launch_env, len(physical_gpus), len(cpu_devices or ()))
    pinned = gpu_for_worker(
        [g.name for g in physical_gpus], launch_env.local_rank, local_size(os.environ)
    )
    if pinned is not None and chosen != "horovod":
        tf.config.set_visible_devices([g for g in physical_gpus if g.name == pinned], "GPU")
    if chosen == "horovod":
        return _init_horovod(tf, physical_gpus)
    if chosen == "multiworker":
        _cluster.ensure_tf_config()
        return _world.current_world(tf.distribute.MultiWorkerMirroredStrategy())
    if chosen == "mirrored":
        devices = [d.name for d in tf.config.list_logical_devices("GPU")] or [
            d.name for d in tf.config.list_logical_devices("CPU")
        ]
        return _world.current_world(tf.distribute.MirroredStrategy(devices))
    return _world.current_world()


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
    from shardfeed._distribute import world as _world

    hvd.init()
    if physical_gpus:
        # One process per GPU: keep only this rank's GPU visible.
        tf.config.set_visible_devices(physical_gpus[hvd.local_rank() % len(physical_gpus)], "GPU")
    return _world.horovod_world()
