"""The optimizers a model's own `train_step` applies, while the step is traced.

Patched only during a trace: which unbuilt optimizers the step updates (built
before the multi-step loop); under Horovod, gradients averaged over ranks
first; under a strategy with several replicas, one exchange per step
(`gradients.py`); with XLA on but no single XLA cluster, each update compiled.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from keras.src.backend.tensorflow.optimizer import TFOptimizer
from keras.src.optimizers.base_optimizer import BaseOptimizer

from shardfeed._common import errors as _errors
from shardfeed._tf.engines import gradients as _gradients
from shardfeed._tf.functions import compiled

_NO_OPTIMIZER_UPDATE = (
    "Under Horovod, a `train_step` must update the weights through a Keras "
    "optimizer (`self.optimizer.apply(grads, variables)` or `apply_gradients`): "
    "shardfeed allreduces the gradients there, and a step that updates weights "
    "another way would train each rank on its own gradients."
)


class _HorovodApply:
    """Makes `apply` of every Keras optimizer average its gradients over
    ranks first while a `train_step` is traced under Horovod (Keras' step
    calls `self.optimizer.apply`, which knows no Horovod). Only the outermost
    `apply` reduces: a `LossScaleOptimizer` calls its inner optimizer's."""

    def __init__(self, engine: Any, sparse_as_dense: bool) -> None:
        self.engine = engine
        self.sparse_as_dense = sparse_as_dense
        self.depth = 0
        self.reduced = 0

    def wrap(self, apply: Any) -> Any:
        def synchronised_apply(optimizer, grads, trainable_variables=None):
            self.depth += 1
            try:
                if self.depth == 1:
                    grads = self._averaged(list(grads))
                    self.reduced += 1
                return apply(optimizer, grads, trainable_variables)
            finally:
                self.depth -= 1

        return synchronised_apply

    def _averaged(self, grads: list[Any]) -> list[Any]:
        # The mean over ranks, as `hvd.DistributedOptimizer`: without a
        # strategy Keras does not divide a step's loss by the replica count.
        n = self.engine.num_replicas_in_sync
        summed = self.engine.reduce_gradients(grads, self.sparse_as_dense)
        return [
            None if g is None
            else tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
            if isinstance(g, tf.IndexedSlices)
            else g / n
            for g in summed
        ]


def _optimizer_classes() -> list[type]:
    """`BaseOptimizer` and every subclass defining its own `apply`."""
    found, todo = [], [BaseOptimizer]
    while todo:
        cls = todo.pop()
        if "apply" in vars(cls):
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


@contextlib.contextmanager
def _patched_apply(wrap: Any) -> Iterator[None]:
    """`apply` of every Keras optimizer class replaced by `wrap(original)`
    inside the block."""
    originals = {cls: vars(cls)["apply"] for cls in _optimizer_classes()}
    for cls, apply in originals.items():
        setattr(cls, "apply", wrap(apply))  # noqa: B010 (patched while tracing)
    try:
        yield
    finally:
        for cls, apply in originals.items():
            setattr(cls, "apply", apply)  # noqa: B010


@contextlib.contextmanager
def recorded() -> Iterator[list[tuple[Any, list[Any]]]]:
    """Inside the block every optimizer's `apply` does nothing but record
    `(optimizer, variables)` for each unbuilt optimizer, once (the block
    only traces a step that is never run)."""
    unbuilt: list[tuple[Any, list[Any]]] = []

    def wrap(apply: Any) -> Any:
        del apply

        def recording_apply(optimizer, grads, trainable_variables=None):
            del grads
            seen = any(o is optimizer for o, _ in unbuilt)
            if not optimizer.built and trainable_variables is not None and not seen:
                unbuilt.append((optimizer, list(trainable_variables)))

        return recording_apply

    with _patched_apply(wrap):
        yield unbuilt


class _Exchange:
    """Keras' `_all_reduce_sum_gradients` and `_distributed_tf_update_step`
    replaced while any block of `exchanged` is open. MirroredStrategy traces
    each replica in its own thread, and the blocks of two replicas overlap:
    the patch is counted, installed by the first and removed by the last;
    each thread's `sparse_as_dense` is its own. The update runs in the merge
    call, on the strategy's thread, so whether it is compiled is the first
    block's choice (the replicas of one step trace choose alike)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.keras_sum: Any = None
        self.keras_update: Any = None
        self.compile_updates = False
        self.local = threading.local()

    def summed(self, optimizer: Any, grads_and_vars: Any) -> list[Any]:
        pairs = list(grads_and_vars)
        if getattr(self.local, "sparse_as_dense", False):
            # Also with one replica: the optimizer sees what replicas sum.
            pairs = [(_gradients.dense(g), v) for g, v in pairs]
        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.num_replicas_in_sync == 1:
            return self.keras_sum(optimizer, pairs)
        variables = [v for _, v in pairs]
        grads = _gradients.summed(ctx, [g for g, _ in pairs], variables)
        return list(zip(grads, variables, strict=True))

    def update(
        self, optimizer: Any, distribution: Any, grads_and_vars: Any, learning_rate: Any
    ) -> None:
        """Keras' `_distributed_tf_update_step`, each variable's update on each
        device one XLA call. Measured on W5 (shardfeed/_commands/bench/NOTES.md): outside
        XLA, Keras' dense Adam over a 9,724 x 50 table runs as a dozen
        separate kernels per device and step, each a pass over the table;
        fused, one pass. The same `update_step`, so the same arithmetic."""
        if not self.compile_updates:
            self.keras_update(optimizer, distribution, grads_and_vars, learning_rate)
            return

        def update_on_device(variable: Any, grad: Any, learning_rate: Any) -> Any:
            def update(grad: Any, learning_rate: Any) -> Any:
                # `variable` is this device's copy; the optimizer's slots
                # read in this update context are this device's too.
                optimizer.update_step(grad, variable, learning_rate)
                return tf.zeros([])

            # A function per device and variable, traced once with the step.
            return compiled(update, jit_compile=True)(grad, tf.convert_to_tensor(learning_rate))

        for grad, variable in grads_and_vars:
            distribution.extended.update(
                variable, update_on_device, args=(grad, learning_rate), group=False
            )

    @contextlib.contextmanager
    def opened(self, sparse_as_dense: bool, compile_updates: bool) -> Iterator[None]:
        outer = getattr(self.local, "sparse_as_dense", None)
        self.local.sparse_as_dense = sparse_as_dense
        with self.lock:
            if self.depth == 0:
                self.keras_sum = vars(TFOptimizer)["_all_reduce_sum_gradients"]
                self.keras_update = vars(TFOptimizer)["_distributed_tf_update_step"]
                self.compile_updates = compile_updates
                exchange = self

                def exchanged_sum(optimizer, grads_and_vars):
                    return exchange.summed(optimizer, grads_and_vars)

                def update_step(optimizer, distribution, grads_and_vars, learning_rate):
                    exchange.update(optimizer, distribution, grads_and_vars, learning_rate)

                TFOptimizer._all_reduce_sum_gradients = exchanged_sum
                TFOptimizer._distributed_tf_update_step = update_step
            self.depth += 1
        try:
            yield
        finally:
            with self.lock:
                self.depth -= 1
                if self.depth == 0:
                    TFOptimizer._all_reduce_sum_gradients = self.keras_sum
                    TFOptimizer._distributed_tf_update_step = self.keras_update
            self.local.sparse_as_dense = outer


_EXCHANGE = _Exchange()


def exchanged(
    sparse_as_dense: bool, compile_updates: bool = False
) -> contextlib.AbstractContextManager[None]:
    """Inside the block a Keras optimizer's `apply` in the replica context
    of a strategy with several replicas sums its gradients with
    `gradients.summed` (one exchange per step, `IndexedSlices` kept sparse)
    instead of Keras' `all_reduce` of each; elsewhere (one replica,
    cross-replica context) Keras' own sum runs. `sparse_as_dense`: every
    `IndexedSlices` is densified first, with any number of replicas.
    `compile_updates`: each variable's update (Keras' `update_step`, on
    each device) is one XLA call, for steps that are not compiled whole."""
    return _EXCHANGE.opened(sparse_as_dense, compile_updates)


@contextlib.contextmanager
def synchronised(engine: Any, sparse_as_dense: bool = False) -> Iterator[None]:
    """Gradients applied by a Keras optimizer inside the block are summed
    over every replica in one exchange (`exchanged`); under Horovod they are
    averaged over ranks first, and a block that applies none raises."""
    if engine.uses_strategy:
        with exchanged(sparse_as_dense):
            yield
        return
    hook = _HorovodApply(engine, sparse_as_dense)
    with _patched_apply(hook.wrap):
        yield
    if hook.reduced == 0:
        raise RuntimeError(
            _errors.message(
                _NO_OPTIMIZER_UPDATE,
                "a `train_step` that called no Keras optimizer's `apply`",
                "Apply the gradients with `self.optimizer.apply(grads, "
                "self.trainable_variables)`, or train this model with "
                "MultiWorkerMirroredStrategy (`shardfeed launch`), where every "
                "update is synchronised by the strategy.",
            )
        )
