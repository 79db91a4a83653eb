"""The model's own `train_step` / `test_step` / `predict_step`, inside the compiled loop.

Whether a model overrides Keras' steps, calling the override per replica with
the resident batch as Keras' `data`, Keras' per-replica reduction of what it
returns and its logs. Semantics are Keras': a partial last step's real rows,
the logs of a call's last step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

from shardfeed._tf import step_optimizers as _step_optimizers
from shardfeed._tf.epoch import ResidentEpoch
from shardfeed._tf.functions import compiled


@dataclasses.dataclass(frozen=True)
class ModelSteps:
    """Which of Keras' steps a model overrides."""

    train: bool
    test: bool
    predict: bool

    @classmethod
    def of(cls, model: keras.Model) -> ModelSteps:
        kind = type(model)
        return cls(
            train=kind.train_step is not TensorFlowTrainer.train_step,
            test=kind.test_step is not TensorFlowTrainer.test_step,
            predict=kind.predict_step is not TensorFlowTrainer.predict_step,
        )

    @property
    def any(self) -> bool:
        return self.train or self.test or self.predict

    def own(self, mode: str) -> bool:
        """Whether `mode`'s calls (train, test or predict) run the model's step."""
        return {"train": self.train, "test": self.test, "predict": self.predict}[mode]


def keras_data(x: Any, y: Any = None, sample_weight: Any = None) -> Any:
    """A batch as Keras hands it to a step: `x`, `(x, y)` or `(x, y, sample_weight)`."""
    return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)


class OwnSteps:
    """The model's own steps on one replica's rows, for the loop's compiled
    calls (`Loop._replica_step`), and Keras' reduction and logs of what they
    return.

    Args:
        loop: The `Loop` whose batches and engine the steps use (typed `Any`:
            the loop imports this module).
    """

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.engine = loop.engine
        self.steps = ModelSteps.of(loop.model)
        self._variables_created = False

    @property
    def model(self) -> keras.Model:
        return self.loop.model  # the loop's, held weakly

    def create_variables(self, order: ResidentEpoch) -> None:
        """Builds the optimizers the step applies before the loop is traced.

        The guide's GAN builds its two optimizers on their first `apply`,
        inside the step; a strategy cannot create variables inside the
        multi-step loop ("You must feed a value for placeholder tensor"). So
        one step on one row per replica is traced (never run) with each
        optimizer's `apply` only recording what it would update; the unbuilt
        ones are then built on those variables, as `model.fit` builds
        `model.optimizer` before its first step.
        """
        if self._variables_created:
            return
        self._variables_created = True
        loop, engine = self.loop, self.engine

        def step(handles, indices):
            def replica(handles, indices):
                batch = loop.train_batch(order, handles, indices)
                return self.model.train_step(keras_data(*batch))

            return engine.run(replica, (handles, indices))

        rows = engine.distribute([tf.constant([0])] * len(order.handles()))
        with _step_optimizers.recorded() as unbuilt:
            compiled(step).get_concrete_function(loop.handles(order), rows)
        with engine.scope():
            for optimizer, variables in unbuilt:
                optimizer.build(variables)

    # -- one step on a replica's rows (`Loop._replica_step`) ---------------------

    def train_on_rows(self, epoch, handles, rows, where, i, r):
        loop = self.loop
        x, y, sw = loop.train_batch(epoch, handles, rows, where, i, r)
        with _step_optimizers.synchronised(self.engine, loop.options.sparse_as_dense):
            return _averageable(self.model.train_step(keras_data(x, y, sw)))

    def test_on_rows(self, epoch, handles, rows):
        batch = epoch.gather(handles, rows)
        return _averageable(self.model.test_step(keras_data(*batch)))

    def predict_forward(self, x: Any) -> Any:
        return self.model.predict_step(keras_data(x))

    def reduced(self, outputs: Any) -> Any:
        """The mean over every replica of each numeric output (Keras'
        `reduce_per_replica(..., "auto")` off TPUs); a value that is not
        per-replica is returned as it is."""
        engine = self.engine
        n = engine.num_replicas_in_sync

        def mean(value: Any) -> Any:
            if n == 1:
                return value
            if engine.uses_strategy and not isinstance(
                value, tf.distribute.DistributedValues
            ):
                return value
            if not engine.local_results(value)[0].dtype.is_floating:
                return engine.local_results(value)[0]
            return engine.sum_across_replicas(value) / n

        return keras.tree.map_structure(mean, outputs)

    # -- on the host -----------------------------------------------------------

    def logs(self, outputs: Any) -> dict[str, Any]:
        """Keras' logs after a call: the model's metrics when the step returned
        exactly their names, else what it returned."""
        metrics = self.engine.metric_results(self.model)
        if isinstance(outputs, dict) and set(outputs) == set(metrics):
            return metrics
        if not isinstance(outputs, dict):
            return {}  # Keras shows no logs for a step that returns none.
        return pythonify(outputs)

    def padded(self, outputs: Any, rows: int) -> Any:
        """One replica's partial-step outputs padded to a full step of
        `rows` rows (`[1, rows, ...]`): prediction drops the padding."""

        def pad(value: Any) -> np.ndarray:
            array = np.asarray(value)
            out = np.zeros((rows, *array.shape[1:]), array.dtype)
            out[: array.shape[0]] = array
            return out[None]

        return keras.tree.map_structure(pad, outputs)


def _averageable(outputs: Any) -> Any:
    """A step's integer outputs as float32, inside the replica, so that
    their mean over replicas is not an integer division."""

    def cast(value: Any) -> Any:
        if isinstance(value, tf.Tensor | tf.Variable) and value.dtype.is_integer:
            return tf.cast(value, tf.float32)
        return value

    return keras.tree.map_structure(cast, outputs)


def pythonify(logs: dict[str, Any]) -> dict[str, Any]:
    """Flattens nested dicts and turns scalars into floats (Keras' `pythonify_logs`)."""
    out: dict[str, Any] = {}
    for name, value in logs.items():
        if isinstance(value, dict):
            out.update(pythonify(value))
            continue
        array = np.asarray(value)
        out[name] = float(array) if array.ndim == 0 else array
    return out
