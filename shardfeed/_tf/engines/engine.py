"""Engines: how replicas run and what crosses between them (`Engine`, `StrategyEngine`).

Placing per-replica values, running a function on every local replica, sums
across replicas, gradient reduction, global metrics, gathers and the all-to-all:
the compiled loop is written once against this interface. `StrategyEngine`
covers the default strategy, Mirrored and MultiWorkerMirrored; `HorovodEngine`
(`horovod.py`) is imported only when Horovod is in use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import keras
import numpy as np
import tensorflow as tf

from shardfeed._tf.engines import alltoall as _alltoall
from shardfeed._tf.engines.metrics import metric_results
from shardfeed._tf.world import World, is_default_strategy


class Engine(Protocol):
    """What the loop needs from a distribution engine."""

    name: str
    world: World
    # Whether a `tf.distribute` strategy runs the replicas: metric variables
    # are then sync-on-read sums, step outputs `PerReplica` values, and the
    # Keras optimizer's `apply` sums the gradients. Without one (Horovod) each
    # rank holds its own part of each, which the engine reduces.
    uses_strategy: bool

    @property
    def num_replicas_in_sync(self) -> int: ...
    @property
    def can_compile_whole_loop(self) -> bool: ...
    @property
    def loss_prescale(self) -> int: ...
    def scope(self) -> Any: ...
    def distribute(self, per_local_replica: Sequence[Any]) -> Any: ...
    def run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any: ...
    def local_results(self, value: Any) -> list[Any]: ...
    def sum_across_replicas(self, value: Any) -> Any: ...
    def read_sum(self, variable: tf.Variable) -> Any: ...
    def reduce_gradients(self, grads: list[Any], sparse_as_dense: bool = False) -> list[Any]: ...
    def metric_results(self, model: keras.Model, skip_loss: bool = False) -> dict[str, Any]: ...
    def all_gather(self, per_local_replica: Sequence[np.ndarray]) -> np.ndarray: ...
    def all_to_all(self, send: Sequence[tf.Tensor], counts: np.ndarray) -> list[tf.Tensor]: ...
    @property
    def exchange_tracing_count(self) -> int: ...
    def prepare_model(self, model: keras.Model) -> None: ...


def engine_for(world: World) -> Engine:
    """The engine for `world`: Horovod's when Horovod runs, else the strategy's."""
    if world.backend == "horovod":
        from shardfeed._tf.engines.horovod import HorovodEngine

        return HorovodEngine(world)
    return StrategyEngine(world)


class StrategyEngine:
    """Runs replicas through a `tf.distribute` strategy.

    Under a strategy the Keras optimizer's `apply` sums gradients across
    replicas (in the loop's step, with `gradients.summed`: one exchange,
    `IndexedSlices` kept sparse), so `reduce_gradients` adds nothing.
    Metric variables created in the strategy's scope are sync-on-read with
    SUM aggregation: read outside `strategy.run` they are reduced over every
    replica of every worker (a collective under MultiWorkerMirroredStrategy,
    which every worker reaches at the same point of the loop).

    Args:
        world: The process's place among workers and replicas.
    """

    name = "tf.distribute"
    uses_strategy = True

    def __init__(self, world: World) -> None:
        self.world = world
        self.strategy = world.strategy
        self._single = is_default_strategy(world.strategy)
        self._gathered: _alltoall.GatheredAllToAll | None = None

    @property
    def num_replicas_in_sync(self) -> int:
        return self.world.num_replicas_in_sync

    @property
    def can_compile_whole_loop(self) -> bool:
        """Whether the whole multi-step loop may go into one XLA cluster:
        only without cross-replica communication (XLA cannot compile a
        strategy's merge calls)."""
        return self._single

    @property
    def loss_prescale(self) -> int:
        """The factor Keras divides compiled losses by inside a replica."""
        return self.strategy.num_replicas_in_sync

    def scope(self) -> Any:
        return self.strategy.scope()

    def distribute(self, per_local_replica: Sequence[Any]) -> Any:
        """Places one value per local replica (a PerReplica when several)."""
        if self._single:
            return per_local_replica[0]
        first = self.world.global_replica_ids[0]
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: per_local_replica[ctx.replica_id_in_sync_group - first]
        )

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if self._single:
            return fn(*args)
        return self.strategy.run(fn, args=args)

    def local_results(self, value: Any) -> list[Any]:
        """The per-replica parts of `value` held by this process."""
        if self._single:
            return [value]
        return list(self.strategy.experimental_local_results(value))

    def sum_across_replicas(self, value: Any) -> Any:
        """Sums a per-replica value over every replica of every worker."""
        if self._single:
            return value
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

    def read_sum(self, variable: tf.Variable) -> Any:
        """Reads a sync-on-read SUM variable: the sum over every replica."""
        return variable.read_value()

    def reduce_gradients(self, grads: list[Any], sparse_as_dense: bool = False) -> list[Any]:
        del sparse_as_dense  # the optimizer's sum reads it (`step_optimizers.exchanged`)
        return grads

    def metric_results(self, model: keras.Model, skip_loss: bool = False) -> dict[str, Any]:
        return metric_results(model, skip_loss)

    def all_gather(self, per_local_replica: Sequence[np.ndarray]) -> np.ndarray:
        """Concatenates equally shaped per-replica arrays of every replica, in
        global replica order, on every worker."""
        if self._single:
            return per_local_replica[0]
        tensors = []
        for array, device in zip(per_local_replica, self.world.local_devices, strict=True):
            with tf.device(device):
                tensors.append(tf.constant(_alltoall.array_to_words(array)))
        words = _alltoall.gather_words(self.strategy, self.distribute(tensors))
        return _alltoall.array_from_words(words.numpy(), per_local_replica[0])

    def all_to_all(self, send: Sequence[tf.Tensor], counts: np.ndarray) -> list[tf.Tensor]:
        """Sends each local replica's int32 word rows (grouped by destination,
        `counts[s, d]` rows from replica s to d) and returns each local
        replica's arrivals (grouped by source); see `alltoall.py`. What it
        stages per row sent is counted by `_data.exchange.staged_rows_per_row`
        (the data layer sizes rounds and checks the fit before any engine
        exists)."""
        if self.world.world_size == 1:
            return _alltoall.local_all_to_all(send, counts, self.world.local_devices)
        if self._gathered is None:
            self._gathered = _alltoall.GatheredAllToAll(
                self.strategy, self.world.global_replica_ids, self.world.local_devices
            )
        return self._gathered(send, counts)

    @property
    def exchange_tracing_count(self) -> int:
        """Traces of `all_to_all`'s compiled functions so far (0 in one process)."""
        return 0 if self._gathered is None else self._gathered.tracing_count

    def prepare_model(self, model: keras.Model) -> None:
        # Variables created in a strategy's scope start identical on every
        # replica (MultiWorkerMirroredStrategy broadcasts worker 0's values).
        del model
