"""The Horovod engine (`HorovodEngine`): one process per device, our own step, Horovod's allreduce.

Imported only when Horovod is initialised. Why not `horovod.tensorflow.keras`:
on Keras 3 its broadcast callback fails and its `DistributedOptimizer` does not
average gradients (docs/engines.md). So it broadcasts through the underlying
`tf.Variable`s (horovod #4290) and allreduces the gradients outside XLA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from shardfeed._tf.engines import gradients as _gradients
from shardfeed._tf.engines.metrics import metric_results, reported_metrics
from shardfeed._tf.world import World


class HorovodEngine:
    """Runs this process's single replica and allreduces with Horovod.

    Args:
        world: A Horovod world (`World.backend == "horovod"`).
    """

    name = "horovod"
    uses_strategy = False  # each rank's metrics and outputs are its own part

    def __init__(self, world: World) -> None:
        self.world = world

    @property
    def num_replicas_in_sync(self) -> int:
        return self.world.num_replicas_in_sync

    @property
    def can_compile_whole_loop(self) -> bool:
        return False

    @property
    def loss_prescale(self) -> int:
        return 1  # No strategy: Keras does not pre-scale losses.

    def scope(self) -> Any:
        return contextlib.nullcontext()

    def distribute(self, per_local_replica: Sequence[Any]) -> Any:
        (value,) = per_local_replica
        return value

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        return fn(*args)

    def local_results(self, value: Any) -> list[Any]:
        return [value]

    def sum_across_replicas(self, value: Any) -> Any:
        return hvd.allreduce(value, op=hvd.Sum)

    def read_sum(self, variable: tf.Variable) -> Any:
        return hvd.allreduce(variable.read_value(), op=hvd.Sum)

    def reduce_gradients(self, grads: list[Any], sparse_as_dense: bool = False) -> list[Any]:
        """Sums over ranks; an `IndexedSlices` is all-gathered (Horovod's
        sparse allreduce) unless `sparse_as_dense` densifies it first, as
        `hvd.DistributedOptimizer(sparse_as_dense=True)` does."""
        if sparse_as_dense:
            grads = [_gradients.dense(g) for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        reduced = hvd.grouped_allreduce([grads[i] for i in present], op=hvd.Sum)
        out = list(grads)
        for i, g in zip(present, reduced, strict=True):
            out[i] = g
        return out

    def metric_results(self, model: keras.Model, skip_loss: bool = False) -> dict[str, Any]:
        """Results over all ranks: sum (or average) each metric variable across
        ranks, read the results, then restore this rank's own state so the
        next call keeps accumulating locally."""
        variables = [v for m in reported_metrics(model, skip_loss) for v in m.variables]
        if not variables:
            return metric_results(model, skip_loss)
        local = [tf.identity(v.value) for v in variables]
        for v, value in zip(variables, local, strict=True):
            aggregation = getattr(v, "aggregation", "sum")
            if aggregation == "mean":
                v.assign(hvd.allreduce(value, op=hvd.Average))
            elif aggregation in ("none", "only_first_replica"):
                v.assign(hvd.broadcast(value, root_rank=0))
            else:
                v.assign(hvd.allreduce(value, op=hvd.Sum))
        try:
            return metric_results(model, skip_loss)
        finally:
            for v, value in zip(variables, local, strict=True):
                v.assign(value)

    def all_gather(self, per_local_replica: Sequence[np.ndarray]) -> np.ndarray:
        (array,) = per_local_replica
        return hvd.allgather(tf.constant(array)).numpy()

    def all_to_all(self, send: Sequence[tf.Tensor], counts: np.ndarray) -> list[tf.Tensor]:
        """`hvd.alltoall` with splits: this rank's row of `counts` says how
        many int32 word rows go to each rank."""
        (words,) = send
        splits = tf.constant(counts[self.world.rank], tf.int32)
        received, _ = hvd.alltoall(words, splits=splits)
        return [received]

    # Horovod's ops run eagerly: nothing is traced.
    exchange_tracing_count = 0

    def prepare_model(self, model: keras.Model) -> None:
        """Makes every rank start from rank 0's weights and optimizer state."""
        variables = [v.value for v in model.variables]
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and optimizer.built:
            variables += [v.value for v in optimizer.variables]
        hvd.broadcast_variables(variables, root_rank=0)
