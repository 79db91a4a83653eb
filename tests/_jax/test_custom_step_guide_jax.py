"""Keras' guide "Customizing what happens in fit() with JAX" (keras-io
`guides/custom_train_step_in_jax.py`) under `shardfeed.fit` / `evaluate`,
against Keras' own `model.fit` / `evaluate` on the same weights and rows.

The guide's first `train_step` and its `test_step` return `{metric.name:
metric.stateless_result(...) for metric in self.metrics}`: for the compiled
metrics that value is itself a dict (`{"mae": ...}`), which Keras' callbacks
flatten (`pythonify_logs`). Written here from the guide's stateless API (its
model, data shape, optimizer, loss and metric), with Keras' fit as the bar.
"""

from __future__ import annotations

import jax
import keras
import numpy as np
from _helpers_fit import assert_history_close, max_weight_diff, replicas

from shardfeed import ShardedResidentDataset, evaluate, fit


def _metric_logs(model, metrics_variables, loss, y, y_pred, sample_weight):
    """The guide's metric update: each of `model.metrics` (the loss tracker,
    then the compiled metrics) on its own slice of the metric variables;
    returns `(logs, new metric variables)`."""
    new_vars, logs = [], {}
    for metric in model.metrics:
        own = metrics_variables[len(new_vars) : len(new_vars) + len(metric.variables)]
        if metric.name == "loss":
            own = metric.stateless_update_state(own, loss, sample_weight=sample_weight)
        else:
            own = metric.stateless_update_state(own, y, y_pred, sample_weight=sample_weight)
        logs[metric.name] = metric.stateless_result(own)  # a dict for compile_metrics
        new_vars += own
    return logs, new_vars


class GuideModel(keras.Model):
    """The guide's first `CustomModel` and its custom `test_step`."""

    def compute_loss_and_updates(
        self, trainable, non_trainable, metrics_variables, x, y, sample_weight, training=False
    ):
        y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x, training=training)
        loss, (trainable, non_trainable, metrics_variables) = self.stateless_compute_loss(
            trainable, non_trainable, metrics_variables,
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training,
        )
        return loss, (y_pred, non_trainable, metrics_variables)

    def train_step(self, state, data):
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        grad_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)
        (loss, (y_pred, non_trainable, metrics_variables)), grads = grad_fn(
            trainable, non_trainable, metrics_variables, x, y, sample_weight, training=True
        )
        trainable, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, grads, trainable
        )
        logs, metrics_variables = _metric_logs(
            self, metrics_variables, loss, y, y_pred, sample_weight
        )
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)

    def test_step(self, state, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        trainable, non_trainable, metrics_variables = state
        y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x, training=False)
        loss, (trainable, non_trainable, metrics_variables) = self.stateless_compute_loss(
            trainable, non_trainable, metrics_variables,
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False,
        )
        logs, metrics_variables = _metric_logs(
            self, metrics_variables, loss, y, y_pred, sample_weight
        )
        return logs, (trainable, non_trainable, metrics_variables)


def _guide_model() -> keras.Model:
    keras.utils.set_random_seed(4)
    inputs = keras.Input(shape=(32,))
    model = GuideModel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def _guide_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    # 1,000 rows as in the guide; batch 32: 31 full steps and a partial one of 8.
    return rng.random((1000, 32), dtype=np.float32), rng.random((1000, 1), dtype=np.float32)


def test_the_guides_train_step_with_nested_metric_logs_fits_as_keras_fit():
    x, y = _guide_data()
    with replicas(1):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=32, shuffle=False)
        ours = _guide_model()
        history = fit(ours, ds, epochs=3, verbose=0)
    theirs = _guide_model()
    expected = theirs.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
    # Flattened as Keras' callbacks flatten them: `mae` beside `loss`, no dict.
    assert sorted(history.history) == sorted(expected.history) == ["loss", "mae"]
    assert_history_close(history.history, expected.history)
    assert max_weight_diff(ours, theirs) < 1e-5


def test_the_guides_test_step_evaluates_as_keras_evaluate():
    x, y = _guide_data()
    model = _guide_model()
    with replicas(1):
        ours = evaluate(model, x, y, per_replica_batch_size=32, return_dict=True)
    expected = model.evaluate(x, y, batch_size=32, return_dict=True, verbose=0)
    assert sorted(ours) == sorted(expected) == ["loss", "mae"]
    np.testing.assert_allclose([ours[k] for k in expected], list(expected.values()), rtol=1e-5)
