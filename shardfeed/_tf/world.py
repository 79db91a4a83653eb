"""The world on TensorFlow: who this process is and which devices its replicas live on.

Read from a strategy, the one in scope, or Horovod (`current_world`); global
replica `g = rank * replicas_in_process + i`, every worker holding as many;
`barrier` and `all_gather_bytes` are the two tiny collectives every layer may use;
`one_call_at_a_time` keeps threads from interleaving `fit`/`evaluate`/`predict`.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import numpy as np
import tensorflow as tf

from shardfeed._common.world import ReplicaNumbering


@dataclasses.dataclass(frozen=True)
class World(ReplicaNumbering):
    """Where this process sits among the workers and replicas.

    Attributes:
        rank: This worker's index among `world_size` workers (processes).
        world_size: Number of workers.
        local_rank: This worker's index among workers on the same host.
        local_devices: One device name per replica in this process.
        strategy: The `tf.distribute` strategy replicas run under (the default
            strategy when none is in use, and under Horovod).
        backend: `"tf.distribute"` or `"horovod"` (one process per device,
            Horovod's allreduce).
    """

    rank: int
    world_size: int
    local_rank: int
    local_devices: tuple[str, ...]
    strategy: tf.distribute.Strategy
    backend: Literal["tf.distribute", "horovod"] = "tf.distribute"

    def scope(self):
        """The strategy's scope: build the model and datasets inside it."""
        return self.strategy.scope()

    @property
    def replicas_in_process(self) -> int:
        return len(self.local_devices)

    @property
    def num_replicas_in_sync(self) -> int:
        return self.world_size * self.replicas_in_process

    def barrier(self) -> None:
        """Waits until every worker has reached its `barrier()` call.

        One tiny collective: a sum over every replica under a multi-worker
        strategy, an allreduce under Horovod; nothing with one worker. Every
        worker must call it the same number of times, like any collective.

        Example:
            >>> if world.is_chief:
            ...     write_summary(path)
            >>> world.barrier()  # now every worker may read `path`
        """
        if self.world_size == 1:
            return
        if self.backend == "horovod":
            import horovod.tensorflow as hvd  # only reached once Horovod runs

            hvd.allreduce(tf.constant(0, tf.int32), op=hvd.Sum, name="shardfeed_barrier")
            return
        ones = self.strategy.experimental_distribute_values_from_function(
            lambda _: tf.constant(1, tf.int32)
        )
        self.strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None).numpy()

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        """Every worker's `payload`, in rank order, on every worker.

        Two tiny collectives (the lengths, then the bytes padded to the
        longest): a gather over every replica under a multi-worker strategy
        (each worker's replicas send the same bytes), an allgather under
        Horovod; no traffic with one worker. Like `barrier()`, every worker
        must call it at the same point; it also waits for every worker.

        Example:
            >>> statuses = world.all_gather_bytes(b"ok")
            >>> statuses[0]  # the chief's
            b'ok'
        """
        if self.world_size == 1:
            return [payload]
        length = self._gather_row(np.array([len(payload)], np.int64))[:, 0]
        if not length.any():  # every rank knows: nothing more to send
            return [b""] * self.world_size
        # Collective gathers take no uint8: the bytes travel packed in int32s.
        row = np.zeros(-(-int(length.max()) // 4) * 4, np.uint8)
        row[: len(payload)] = np.frombuffer(payload, np.uint8)
        rows = self._gather_row(row.view(np.int32))
        return [rows[r].tobytes()[: int(length[r])] for r in range(self.world_size)]

    def _gather_row(self, row: np.ndarray) -> np.ndarray:
        """`[world_size, len(row)]`: each worker's `row` (equal lengths)."""
        if self.backend == "horovod":
            import horovod.tensorflow as hvd  # only reached once Horovod runs

            return hvd.allgather(tf.constant(row[None]), name="shardfeed_gather").numpy()
        # A sum of one-hot rows, as `barrier()` sums ones: `strategy.gather`
        # retraced per call across workers (~300 ms each, measured), a reduce
        # costs ~10 ms. Only each worker's first replica sends its row.
        table = np.zeros((self.world_size, len(row)), row.dtype)
        table[self.rank] = row
        first = self.global_replica_ids[0]
        devices = self.local_devices

        def value(context: tf.distribute.experimental.ValueContext) -> tf.Tensor:
            local = context.replica_id_in_sync_group - first
            with tf.device(devices[local]):
                return tf.constant(table if local == 0 else np.zeros_like(table))

        values = self.strategy.experimental_distribute_values_from_function(value)
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None).numpy()


def is_default_strategy(strategy: tf.distribute.Strategy) -> bool:
    """Whether `strategy` is TensorFlow's default (no-op, one device) strategy.

    TensorFlow exposes no public predicate; the default strategy's class is
    the only one named `_DefaultDistributionStrategy`.
    """
    return type(strategy).__name__ == "_DefaultDistributionStrategy"


def _default_device() -> str:
    gpus = tf.config.list_logical_devices("GPU")
    return (gpus or tf.config.list_logical_devices("CPU"))[0].name


def horovod_initialized() -> bool:
    """Whether `horovod.tensorflow` was imported and `hvd.init()` called.

    Looks only at modules already imported, so a missing Horovod never breaks
    anything.
    """
    hvd = sys.modules.get("horovod.tensorflow")
    return hvd is not None and bool(hvd.is_initialized())


def horovod_world() -> World:
    """The world of this Horovod process: one replica, on its local GPU or CPU."""
    import horovod.tensorflow as hvd  # only reached once Horovod is initialised

    gpus = tf.config.list_logical_devices("GPU")
    # Each process sees either only its own GPU (the usual pinning) or all
    # GPUs of the host, in which case it takes the one of its local rank.
    device = (
        gpus[hvd.local_rank() % len(gpus)] if gpus else tf.config.list_logical_devices("CPU")[0]
    ).name
    return World(
        rank=hvd.rank(),
        world_size=hvd.size(),
        local_rank=hvd.local_rank(),
        local_devices=(device,),
        strategy=tf.distribute.get_strategy(),
        backend="horovod",
    )


# The world `shardfeed.init` returned last, so that a model built outside its
# strategy's scope can be told apart from a script that never started one.
_initialized: list[World] = []


def remember_initialized(world: World) -> None:
    """Records the world `shardfeed.init` started."""
    _initialized[:] = [world]


def initialized_world() -> World | None:
    """The world `shardfeed.init` returned last, or None if it was never called."""
    return _initialized[0] if _initialized else None


def current_world(strategy: tf.distribute.Strategy | None = None) -> World:
    """Describes this process from `strategy`, the strategy in scope, or Horovod.

    Precedence: an explicit `strategy`; else a strategy whose scope is open;
    else Horovod, when initialised; else the default strategy on one device
    (the first GPU, or the CPU).

    Args:
        strategy: A `tf.distribute` strategy.

    Returns:
        The `World`.

    Example:
        >>> current_world().num_replicas_in_sync
        1
    """
    if strategy is None and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    if strategy is None or is_default_strategy(strategy):
        if horovod_initialized():
            return horovod_world()
        return World(0, 1, 0, (_default_device(),), tf.distribute.get_strategy())
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


F = TypeVar("F", bound=Callable[..., Any])
_CALLS = threading.RLock()


def one_call_at_a_time(function: F) -> F:
    """`function` (`fit`, `evaluate`, `predict`) run by one thread at a time
    in this process; another thread's call waits for it (a callback's own
    `evaluate`, on the same thread, runs inside it).

    A strategy's collectives from two threads interleave, and a dataset's
    rows move between devices each epoch: two `fit`s in threads on one
    dataset with 2 replicas failed ("This epoch is closed", a
    `CollectiveReduceV2` error) or diverged the replicas' weights."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _CALLS:
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
