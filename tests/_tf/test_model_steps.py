"""A model's own `train_step` / `test_step` / `predict_step` under shardfeed.

The proof: the override is called once per step with Keras' `data`, trains
what it says (the weights and History of Keras' own `model.fit` on the same
rows in the same order, partial last batch included), its custom metrics
reach History, evaluate/predict run `test_step`/`predict_step` on the real
rows only, 2 replicas equal 1 with the global batch, 2 worker processes
equal 1 process, and a `compute_loss` override without `training` works.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from _helpers import mirrored_strategy
from _helpers_horovod import NO_HOROVOD, TWO_WORKER_ENGINES
from _helpers_model_steps import (
    ROWS,
    Counting,
    custom_train_step_model,
    gan_model,
    regression_data,
)
from _helpers_workers import ROOT, TIMEOUT_S, run_checked, two_workers, worker_env

import shardfeed
from shardfeed import FitOptions, ShardedResidentDataset

BATCH = 16
STEPS = -(-ROWS // BATCH)  # 7: the last of 4 rows


def _dataset(x, y=None, batch=BATCH, **kwargs):
    return ShardedResidentDataset(x, y, per_replica_batch_size=batch, shuffle=False, **kwargs)


def _assert_same_weights(a, b, rtol=1e-5, atol=1e-7):
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(wa, wb, rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def keras_train_step():
    """Keras' own `fit` of the custom-`train_step` model, its History and its
    predictions: made once (CI time), the reference of every case below."""
    x, y = regression_data()
    keras_model = custom_train_step_model()
    want = keras_model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return keras_model, want, keras_model.predict(x, verbose=0)


@pytest.mark.parametrize("steps_per_execution", [1, 3, 32])
def test_train_step_is_called_and_trains_what_keras_trains(
    steps_per_execution, keras_train_step
):
    x, y = regression_data()
    keras_model, want, keras_predictions = keras_train_step
    model = custom_train_step_model()
    options = FitOptions(steps_per_execution=steps_per_execution)
    got = shardfeed.fit(model, _dataset(x, y), epochs=2, verbose=0, options=options)
    assert int(model.step_calls.numpy()) == int(keras_model.step_calls.numpy()) == 2 * STEPS
    # The partial last step saw its 4 real rows, as Keras' last batch.
    assert int(model.rows_seen.numpy()) == 2 * ROWS
    _assert_same_weights(keras_model, model)
    assert set(got.history) == {"loss", "my_custom_metric"}
    for key in ("loss", "my_custom_metric"):
        np.testing.assert_allclose(got.history[key], want.history[key], rtol=1e-5)
    # Keras' own predict_step on x alone: the train_step (which needs y) is
    # not traced for prediction.
    np.testing.assert_allclose(
        shardfeed.predict(model, x), keras_predictions, rtol=1e-5, atol=1e-7
    )


def test_custom_metric_in_batch_logs_and_history():
    x, y = regression_data()
    seen = []
    log = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(logs))
    model = custom_train_step_model()
    history = shardfeed.fit(model, _dataset(x, y), epochs=1, verbose=0, callbacks=[log])
    assert seen and all("my_custom_metric" in logs for logs in seen)
    assert history.history["my_custom_metric"][0] == pytest.approx(
        float(model.my_metric.result()), rel=1e-6
    )


def test_gan_two_optimizers_on_x_alone_trains_as_keras():
    x, _ = regression_data()
    keras_gan = gan_model()
    want = keras_gan.fit(x, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    gan = gan_model()
    # Keras' "auto" is no XLA on CPUs; XLA draws other numbers from the same
    # seed (`AUTO_SELECT` picks another random algorithm).
    options = FitOptions(jit_compile=False)
    got = shardfeed.fit(gan, _dataset(x), epochs=2, verbose=0, options=options)
    assert int(gan.d_optimizer.iterations.numpy()) == 2 * STEPS
    assert int(gan.g_optimizer.iterations.numpy()) == 2 * STEPS
    _assert_same_weights(keras_gan, gan)
    for key in ("d_loss", "g_loss"):
        np.testing.assert_allclose(got.history[key], want.history[key], rtol=1e-5)


class OwnEvalSteps(Counting):
    """Its own `test_step` logs a value of its own; its `predict_step` returns
    a dict with the input beside the prediction."""

    def __init__(self):
        super().__init__()
        self.abs_error = keras.metrics.Mean(name="abs_error")

    def test_step(self, data):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        self._count(x)
        y_pred = self(x, training=False)
        self.abs_error.update_state(keras.losses.mean_absolute_error(y, y_pred))
        return {"abs_error": self.abs_error.result()}

    def predict_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        self._count(x)
        return {"y": self(x, training=False), "x": x}


def _eval_model():
    keras.utils.set_random_seed(2)
    model = OwnEvalSteps()
    model.compile(optimizer="sgd", loss="mse")
    model(np.zeros((1, 4), "float32"))
    return model


def test_test_step_runs_under_evaluate_on_the_real_rows():
    x, y = regression_data()
    keras_model = _eval_model()
    want = keras_model.evaluate(x, y, batch_size=BATCH, return_dict=True, verbose=0)
    model = _eval_model()
    model.set_weights(keras_model.get_weights())
    got = shardfeed.evaluate(model, _dataset(x, y), return_dict=True)
    assert int(model.step_calls.numpy()) == STEPS
    assert int(model.rows_seen.numpy()) == ROWS
    assert set(got) == set(want) == {"abs_error"}
    np.testing.assert_allclose(got["abs_error"], want["abs_error"], rtol=1e-6)


def test_predict_step_runs_under_predict_in_row_order():
    x, _ = regression_data()
    keras_model = _eval_model()
    want = keras_model.predict(x, batch_size=BATCH, verbose=0)
    model = _eval_model()
    model.set_weights(keras_model.get_weights())
    # Shuffled for training: prediction still returns the rows in their order.
    got = shardfeed.predict(
        model, ShardedResidentDataset(x, per_replica_batch_size=BATCH, seed=4)
    )
    assert int(model.step_calls.numpy()) == STEPS
    assert int(model.rows_seen.numpy()) == ROWS  # no padding row reached the step
    np.testing.assert_array_equal(got["x"], x)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-7)


@pytest.mark.multi_device
def test_two_replicas_equal_one_with_the_global_batch():
    x, y = regression_data()
    reference = custom_train_step_model()
    ref = shardfeed.fit(reference, _dataset(x, y, batch=2 * BATCH), epochs=2, verbose=0)
    with mirrored_strategy(2).scope():
        model = custom_train_step_model()
        ds = _dataset(x, y, placement="replicate")
    # The last step's 4 rows split 2 and 2: each replica's mean over its rows,
    # halved, sums to the global mean (Keras' per-replica semantics).
    assert ds.plan.last_step_rows == (2, 2)
    got = shardfeed.fit(model, ds, epochs=2, verbose=0, options=FitOptions(steps_per_execution=2))
    _assert_same_weights(reference, model)
    for key in ("loss", "my_custom_metric"):
        np.testing.assert_allclose(got.history[key], ref.history[key], rtol=1e-5)
    # Each replica ran every step once: 4 steps per epoch on both.
    assert int(model.step_calls.numpy()) == 2 * 2 * 4


@pytest.mark.multi_device
def test_test_step_on_an_empty_replica_batch():
    x, y = regression_data(33)
    keras_model = _eval_model()
    shard_means = [
        keras_model.evaluate(x[s], y[s], batch_size=BATCH, return_dict=True, verbose=0)
        for s in (slice(0, 17), slice(17, 33))
    ]
    with mirrored_strategy(2).scope():
        model = _eval_model()
        ds = _dataset(x, y)
    model.set_weights(keras_model.get_weights())
    # Shards of 17 and 16 rows: replica 1 has no row in the last step.
    assert ds.eval_plan.last_step_rows == (1, 0)
    got = shardfeed.evaluate(model, ds, return_dict=True)
    assert int(model.rows_seen.numpy()) == 33
    # The returned value is each replica's own metric result (read inside the
    # replica), averaged over replicas as Keras' `reduce_per_replica` does:
    # the mean of the two shards' means, not the mean over all 33 rows.
    want = np.mean([m["abs_error"] for m in shard_means])
    np.testing.assert_allclose(got["abs_error"], want, rtol=1e-5)


@pytest.mark.multi_device
def test_replica_outputs_are_averaged_as_keras_does():
    class Returns(Counting):
        def train_step(self, data):
            x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                loss = self.compute_loss(y=y, y_pred=self(x, training=True))
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                                 self.trainable_variables)
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            return {"replica": tf.cast(replica, tf.float32), "rows": tf.shape(x)[0]}

    x, y = regression_data(96)
    with mirrored_strategy(2).scope():
        keras.utils.set_random_seed(0)
        model = Returns()
        model.compile(optimizer="sgd", loss="mse")
        ds = _dataset(x, y, placement="replicate")
    history = shardfeed.fit(model, ds, epochs=1, verbose=0)
    # Not the model's metrics' names: the last step's values, mean over replicas.
    assert history.history == {"replica": [0.5], "rows": [float(BATCH)]}


class LegacyLoss(keras.Model):
    """`compute_loss` without `training` (before Keras 3.3), which Keras still calls."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        return keras.ops.mean(keras.ops.abs(y - y_pred))


def _legacy():
    keras.utils.set_random_seed(1)
    model = LegacyLoss()
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    model(np.zeros((1, 4), "float32"))
    return model


def test_compute_loss_without_training_argument():
    x, y = regression_data()
    keras_model = _legacy()
    want = keras_model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model = _legacy()
    got = shardfeed.fit(model, _dataset(x, y), epochs=2, verbose=0)
    _assert_same_weights(keras_model, model)
    np.testing.assert_allclose(got.history["loss"], want.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(
        shardfeed.evaluate(model, _dataset(x, y)),
        keras_model.evaluate(x, y, batch_size=BATCH, verbose=0),
        rtol=1e-5,
    )


class TensorAsBool(keras.Model):
    """A `train_step` that branches in Python on a tensor: Keras compiles
    its step without AutoGraph, so its `fit` refuses it while tracing."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, _ = data
        if tf.reduce_sum(x) > 0:  # needs AutoGraph: a Python `if` on a tensor
            return {"branch": tf.constant(1.0)}
        return {"branch": tf.constant(0.0)}


def test_own_train_step_runs_unconverted_as_under_keras():
    # Our compiled calls were AutoGraph-converted, and so was the model's
    # step they called: a step that Keras' own `fit` refuses trained.
    x, y = regression_data()
    for fit in (
        lambda m: m.fit(x, y, batch_size=BATCH, epochs=1, verbose=0),
        lambda m: shardfeed.fit(m, _dataset(x, y), epochs=1, verbose=0),
    ):
        model = TensorAsBool()
        model.compile(optimizer="sgd", loss="mse")
        with pytest.raises(tf.errors.OperatorNotAllowedInGraphError, match="as a Python `bool`"):
            fit(model)


WORKER = Path(__file__).resolve().parents[1] / "_model_steps_worker.py"


def _load(prefix, ranks):
    return [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(ranks)]


def _two_workers(engine, *args):
    return two_workers(engine, WORKER, *args)


@pytest.mark.multi_process
@pytest.mark.slow
@pytest.mark.parametrize("engine", TWO_WORKER_ENGINES)
def test_two_workers_equal_one_process(engine, tmp_path):
    single = tmp_path / "single"
    command = [sys.executable, str(WORKER), "--batch", str(2 * BATCH), "--out", str(single)]
    run_checked(command, ROOT)
    (want,) = _load(single, 1)
    out = tmp_path / "two"
    run_checked(_two_workers(engine, "--batch", str(BATCH), "--out", str(out)), ROOT)
    # 2 epochs of 4 steps on each replica; the strategy's counter sums the
    # replicas, Horovod's is each rank's own.
    calls = 2 * 2 * 4 if engine == "multiworker" else 2 * 4
    for got in _load(out, 2):
        np.testing.assert_allclose(got["weights"], want["weights"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got["my_custom_metric"], want["my_custom_metric"], rtol=1e-5)
        assert (int(want["step_calls"]), int(got["step_calls"])) == (2 * 4, calls)


@pytest.mark.multi_process
@pytest.mark.slow
@pytest.mark.horovod
@NO_HOROVOD
def test_horovod_refuses_a_train_step_that_bypasses_the_optimizer(tmp_path):
    cmd = _two_workers("horovod", "--batch", str(BATCH), "--out", str(tmp_path / "x"),
                       "--assign-updates")
    proc = subprocess.run(cmd, cwd=ROOT, env=worker_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode != 0
    assert "Under Horovod, a `train_step` must update the weights through a Keras " \
        "optimizer" in proc.stdout + proc.stderr
