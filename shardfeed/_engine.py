"""Engines: how replicas run and what crosses between them.

Separation of concerns: an engine owns the distribution mechanics -- placing
per-replica values, running a function on every local replica, summing values
across all replicas, and making gradients global before the optimizer
applies them. The compiled loop (`_loop.py`) is written once against this
small interface and runs unchanged under every engine.

`StrategyEngine` covers the default (single device) strategy,
`MirroredStrategy` and `MultiWorkerMirroredStrategy`: under a strategy the
Keras optimizer's `apply` already sums gradients across replicas
(`all_reduce(SUM)`), so the engine adds nothing there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from shardfeed._world import World


class StrategyEngine:
    """Runs replicas through a `tf.distribute` strategy.

    Args:
        world: The process's place among workers and replicas.
    """

    name = "tf.distribute"

    def __init__(self, world: World) -> None:
        self.world = world
        self.strategy = world.strategy
        self._single = (
            world.num_replicas_in_sync == 1
            and not tf.distribute.has_strategy()
            and world.strategy is tf.distribute.get_strategy()
        )

    @property
    def num_replicas_in_sync(self) -> int:
        return self.world.num_replicas_in_sync

    @property
    def can_compile_whole_loop(self) -> bool:
        """Whether the whole multi-step loop may go into one XLA cluster.

        Only without cross-replica communication: XLA cannot compile a
        strategy's merge calls (or Horovod's ops on CPU).
        """
        return self._single

    @property
    def loss_prescale(self) -> int:
        """The factor Keras divides compiled losses by inside a replica."""
        return self.strategy.num_replicas_in_sync

    def scope(self):
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

    def reduce_gradients(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        # The Keras optimizer's `apply` all-reduces (SUM) under a strategy.
        return grads

    def gather_rows(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Concatenates per-worker host arrays from all workers (rank order)."""
        if self.world.world_size == 1:
            return arrays
        raise NotImplementedError  # replaced by the multi-worker engines

    def prepare_model(self, model: Any) -> None:
        """Makes the model's initial state identical on every replica."""
        # Variables created under a strategy's scope are initialised
        # identically (MultiWorkerMirroredStrategy broadcasts from worker 0).
