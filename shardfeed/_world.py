"""The world: who this process is and which devices its replicas live on.

Separation of concerns: this is the only module that looks at the
distribution context (the current `tf.distribute` strategy, and in later
layers Horovod). Everything else -- the plan, the storage, the engine -- asks
a `World` instead of reading the context or the environment behind each
other's backs.

Replica numbering: global replica `g = rank * replicas_in_process + i` for
the i-th local device of worker `rank`. Every worker holds the same number of
local replicas (as MultiWorkerMirroredStrategy and Horovod require).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class World:
    """Where this process sits among the workers and replicas.

    Attributes:
        rank: This worker's index among `world_size` workers (processes).
        world_size: Number of workers.
        local_rank: This worker's index among workers on the same host.
        local_devices: One device name per replica in this process.
        strategy: The `tf.distribute` strategy replicas run under (the default
            strategy when none is in use).
    """

    rank: int
    world_size: int
    local_rank: int
    local_devices: tuple[str, ...]
    strategy: tf.distribute.Strategy

    @property
    def replicas_in_process(self) -> int:
        return len(self.local_devices)

    @property
    def num_replicas_in_sync(self) -> int:
        return self.world_size * self.replicas_in_process

    @property
    def global_replica_ids(self) -> tuple[int, ...]:
        first = self.rank * self.replicas_in_process
        return tuple(range(first, first + self.replicas_in_process))

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


def _default_device() -> str:
    gpus = tf.config.list_logical_devices("GPU")
    return (gpus or tf.config.list_logical_devices("CPU"))[0].name


def current_world(strategy: tf.distribute.Strategy | None = None) -> World:
    """Describes this process from `strategy`, or the strategy in scope.

    Args:
        strategy: A `tf.distribute` strategy; defaults to
            `tf.distribute.get_strategy()` (the default strategy outside any
            `strategy.scope()`).

    Returns:
        The `World`.

    Example:
        >>> world = current_world()
        >>> world.num_replicas_in_sync
        1
    """
    strategy = strategy or tf.distribute.get_strategy()
    if not tf.distribute.has_strategy() and strategy is tf.distribute.get_strategy():
        return World(0, 1, 0, (_default_device(),), strategy)
    resolver = getattr(strategy, "cluster_resolver", None)
    rank, world_size = 0, 1
    if resolver is not None and resolver.task_type is not None:
        spec = resolver.cluster_spec().as_dict()
        world_size = sum(len(spec.get(job, ())) for job in ("chief", "worker"))
        rank = resolver.task_id + (
            len(spec.get("chief", ())) if resolver.task_type == "worker" else 0
        )
    devices = tuple(strategy.extended.worker_devices)
    return World(rank, world_size, 0, devices, strategy)
