"""`fit` on the JAX backend against Keras' own `model.fit` on JAX."""

from __future__ import annotations

import gc

import jax
import keras
import numpy as np
import pytest
from _helpers_fit import (
    assert_history_close,
    max_weight_diff,
    mlp,
    regression_data,
    replicas,
)

from shardfeed import FitOptions, LoadOptions, ShardedResidentDataset, evaluate, fit, predict


def _two_input_model(seed: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    a, b = keras.Input((5,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Concatenate()([keras.layers.Dense(8, activation="tanh")(a), b])
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(h))
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse", metrics=["mae"])
    return model


def test_one_device_equals_keras_fit_with_dict_inputs_sample_weights_and_a_partial_batch():
    rng = np.random.default_rng(0)
    rows = 203  # batch 16: 12 full steps and a partial step of 11 rows
    x = {"a": rng.normal(size=(rows, 5)).astype("float32"),
         "b": rng.normal(size=(rows, 3)).astype("float32")}
    y = rng.normal(size=(rows, 1)).astype("float32")
    sw = rng.uniform(0.5, 2.0, size=(rows,)).astype("float32")
    val = ({"a": x["a"][:50], "b": x["b"][:50]}, y[:50])
    with replicas(1):
        ds = ShardedResidentDataset(x, y, sw, per_replica_batch_size=16, shuffle=False)
        ours = _two_input_model()
        history = fit(ours, ds, epochs=3, verbose=0, validation_data=val,
                      options=FitOptions(steps_per_execution=5))
    theirs = _two_input_model()
    expected = theirs.fit(x, y, sample_weight=sw, batch_size=16, epochs=3, shuffle=False,
                          verbose=0, validation_data=val)
    assert max_weight_diff(ours, theirs) < 1e-5
    assert_history_close(history.history, expected.history)
    assert history.params["steps"] == 13 and history.params["samples"] == 203
    assert history.params["steps_per_execution"] == 5


@pytest.mark.parametrize("n", [2, 4])
def test_n_replicas_of_b_equal_keras_with_one_batch_of_n_b(n):
    x, y = regression_data(1003)  # uneven: a partial last step
    with replicas(n):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=12, shuffle=False,
                                    placement="replicate")
        ours = mlp()
        history = fit(ours, ds, epochs=2, verbose=0)
    theirs = mlp()
    expected = theirs.fit(x, y, batch_size=12 * n, epochs=2, shuffle=False, verbose=0)
    assert max_weight_diff(ours, theirs) < 1e-5
    assert_history_close(history.history, expected.history)
    assert history.params["num_replicas_in_sync"] == n
    assert history.params["global_batch_size"] == 12 * n


@pytest.mark.parametrize("n", [2, 4])
def test_sharded_global_shuffle_on_n_replicas_equals_one_replica_with_n_b(n):
    x, y = regression_data(960)
    with replicas(1):
        one = ShardedResidentDataset(x, y, per_replica_batch_size=8 * n, seed=7)
        expected = fit(theirs := mlp(), one, epochs=3, verbose=0)
    with replicas(n):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, seed=7)
        history = fit(ours := mlp(), ds, epochs=3, verbose=0)
    assert max_weight_diff(ours, theirs) < 1e-5
    assert_history_close(history.history, expected.history)


@pytest.mark.parametrize("epoch_copy", [True, False])
@pytest.mark.parametrize("n", [2, 4])
def test_sharded_rows_in_order_on_n_replicas_equal_one_replica_with_n_b(n, epoch_copy):
    """`shuffle=False`: global batch k is one replica's batch k of N*b (rows
    moved once to their replica), with a partial last step; `predict` keeps
    the rows' order."""
    x, y = regression_data(1003)
    options = LoadOptions(epoch_copy=epoch_copy)
    with replicas(1):
        one = ShardedResidentDataset(x, y, per_replica_batch_size=8 * n, shuffle=False)
        expected = fit(theirs := mlp(), one, epochs=3, verbose=0)
    with replicas(n):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False,
                                    load_options=options)
        history = fit(ours := mlp(), ds, epochs=3, verbose=0)
        assert max_weight_diff(ours, theirs) < 1e-5
        assert_history_close(history.history, expected.history)
        assert ds.order_is_global and ds.epoch_copy == epoch_copy
        np.testing.assert_allclose(predict(ours, ds), ours.predict(x, verbose=0),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"steps_per_epoch": 5, "validation_split": 0.2, "validation_freq": [2, 4]},
        {"initial_epoch": 2, "validation_data": "arrays", "validation_freq": 2},
    ],
)
def test_validation_split_freq_initial_epoch_and_steps_per_epoch_as_keras(kwargs):
    x, y = regression_data(400)
    if kwargs.get("validation_data") == "arrays":
        kwargs = {**kwargs, "validation_data": (x[:64], y[:64])}
    with replicas(1):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=32, shuffle=False)
        history = fit(ours := mlp(), ds, epochs=5, verbose=0, **kwargs)
    expected = mlp().fit(x, y, batch_size=32, epochs=5, shuffle=False, verbose=0, **kwargs)
    assert_history_close(history.history, expected.history)
    assert max_weight_diff(ours, expected.model) < 1e-5
    assert history.epoch == expected.epoch


def test_an_overridden_train_step_is_the_one_that_runs():
    class OnX(keras.Model):
        """Trains on `x` alone: pulls its output towards the mean of `x`."""

        def train_step(self, state, data):
            trainable, non_trainable, optimizer_vars, metrics_vars = state
            x = data  # no targets: the dataset has none

            def loss_fn(trainable):
                y_pred, _ = self.stateless_call(trainable, non_trainable, x)
                return keras.ops.mean((y_pred - keras.ops.mean(x, axis=1, keepdims=True)) ** 2)

            loss, grads = jax.value_and_grad(loss_fn)(trainable)
            trainable, optimizer_vars = self.optimizer.stateless_apply(
                optimizer_vars, grads, trainable
            )
            return {"own_loss": loss}, (trainable, non_trainable, optimizer_vars, metrics_vars)

    def build():
        keras.utils.set_random_seed(4)
        inputs = keras.Input((8,))
        model = OnX(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer=keras.optimizers.SGD(0.1))
        return model

    x, _ = regression_data(256)
    with replicas(2):
        ds = ShardedResidentDataset(x, per_replica_batch_size=16, shuffle=False,
                                    placement="replicate")
        history = fit(ours := build(), ds, epochs=2, verbose=0)
    expected = build().fit(x, batch_size=32, epochs=2, shuffle=False, verbose=0)
    assert list(history.history) == ["own_loss"]
    np.testing.assert_allclose(history.history["own_loss"], expected.history["own_loss"], rtol=1e-5)
    assert max_weight_diff(ours, expected.model) < 1e-5


class _Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, int]] = []
        self.kernels: list[np.ndarray] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(("epoch_begin", epoch))

    def on_train_batch_begin(self, batch, logs=None):
        self.events.append(("batch_begin", batch))

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("batch_end", batch))
        self.kernels.append(self.model.layers[0].kernel.numpy())

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch_end", epoch))


def test_callbacks_see_one_batch_hook_per_call_and_the_weights_after_it():
    x, y = regression_data(100)  # batch 10: 10 steps, 4 per call -> calls of 4, 4, 2
    recorder = _Recorder()
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=5, shuffle=False,
                                    placement="replicate")
        fit(model := mlp(), ds, epochs=1, verbose=0, callbacks=[recorder],
            options=FitOptions(steps_per_execution=4))
    assert recorder.events == [
        ("epoch_begin", 0),
        ("batch_begin", 0), ("batch_end", 3),
        ("batch_begin", 4), ("batch_end", 7),
        ("batch_begin", 8), ("batch_end", 11),  # Keras' numbering: 8 + k - 1
        ("epoch_end", 0),
    ]
    # Each hook saw that call's weights: the three differ, the last is the model's.
    assert not np.array_equal(recorder.kernels[0], recorder.kernels[1])
    np.testing.assert_array_equal(recorder.kernels[-1], model.layers[0].kernel.numpy())


def test_a_callback_that_sets_weights_is_honoured():
    class Zero(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                self.model.set_weights([np.zeros_like(w) for w in self.model.get_weights()])

    x, y = regression_data(64)
    with replicas(1):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=64, shuffle=False)
        fit(ours := mlp(optimizer="sgd"), ds, epochs=2, verbose=0, callbacks=[Zero()])
    theirs = mlp(optimizer="sgd")
    theirs.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0, callbacks=[Zero()])
    assert max_weight_diff(ours, theirs) < 1e-6


@pytest.mark.parametrize("n", [1, 2])
def test_no_recompiles_across_calls_and_epochs(n):
    traces: list[int] = []

    class Counted(keras.layers.Dense):
        def call(self, inputs):
            traces.append(1)
            return super().call(inputs)

    class PerEpoch(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.counts: list[int] = []

        def on_train_batch_end(self, batch, logs=None):
            self.counts.append(len(traces))

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), Counted(4), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", steps_per_execution=3)
    x, y = regression_data(115)  # batch 10: 11 full steps (calls of 3, 3, 3, 2) + partial
    per_epoch = PerEpoch()
    with replicas(n):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=10 // n, seed=0)
        history = fit(model, ds, epochs=3, verbose=0, callbacks=[per_epoch])
    assert history.params["steps_per_execution"] == 3
    # 4 batch-end hooks per epoch: as Keras numbers them, the partial step's
    # call fires its hooks with the call of 2 before it.
    counts = np.array(per_epoch.counts).reshape(3, 4)
    # Traced once per call length (3, then 2 and the partial step) in the first epoch only.
    assert counts[0, 0] == counts[0, 2] and counts[0, 2] < counts[0, 3]
    assert (counts[1:] == counts[0, -1]).all()


def test_memory_stays_flat_over_repeated_fits():
    x, y = regression_data(2000)

    def cycle():
        with replicas(4):
            ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, seed=0)
            fit(mlp(), ds, epochs=1, verbose=0, validation_data=(x[:100], y[:100]))
        del ds
        gc.collect()
        return len(jax.live_arrays()), sum(a.nbytes for a in jax.live_arrays())

    cycle()
    after_two = cycle()
    assert cycle() == after_two


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 32}, "The batch belongs to the dataset"),
        ({"shuffle": True}, "The dataset shuffles"),
    ],
)
def test_what_jax_fit_refuses_names_the_fix(kwargs, message):
    x, y = regression_data(32)
    with replicas(1):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False)
        with pytest.raises((TypeError, ValueError)) as raised:
            fit(mlp(), ds, **kwargs)
    assert str(raised.value).startswith(message)
    assert "Received:" in str(raised.value)


def test_the_datasets_augment_applies_to_training_batches_only():
    x, y = regression_data(96)
    seen_keys = []

    def augment(x, key):
        seen_keys.append(key)
        return x * 0.0  # what the model then sees

    with replicas(2):
        augmented = ShardedResidentDataset(x, y, per_replica_batch_size=8, seed=0,
                                           augment=augment)
        history = fit(ours := mlp(), augmented, epochs=2, verbose=0, validation_data=(x, y))
        zeros = ShardedResidentDataset(np.zeros_like(x), y, per_replica_batch_size=8, seed=0)
        expected = fit(theirs := mlp(), zeros, epochs=2, verbose=0, validation_data=(x, y))
    assert seen_keys  # traced inside the training call
    assert max_weight_diff(ours, theirs) < 1e-6
    # Validation sees the rows as they are.
    np.testing.assert_allclose(history.history["val_loss"], expected.history["val_loss"], rtol=1e-5)


@pytest.fixture
def keras_caps():
    yield keras.config
    keras.config.set_max_epochs(None)
    keras.config.set_max_steps_per_epoch(None)


def test_keras_debugging_caps_limit_fit_evaluate_and_predict_as_keras(keras_caps):
    from shardfeed import evaluate, predict

    x, y = regression_data(200)
    keras_caps.set_max_epochs(2)
    keras_caps.set_max_steps_per_epoch(3)
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False,
                                    placement="replicate")
        with pytest.warns(UserWarning) as caught:
            history = fit(ours := mlp(), ds, epochs=5, verbose=0)
        with pytest.warns(UserWarning, match="Limiting steps_per_epoch to 3"):
            logs = evaluate(ours, x, y, per_replica_batch_size=8)
        with pytest.warns(UserWarning, match="Limiting steps_per_epoch to 3"):
            outputs = predict(ours, x, per_replica_batch_size=8)
    with pytest.warns(UserWarning):
        expected = (theirs := mlp()).fit(x, y, batch_size=16, epochs=5, shuffle=False, verbose=0)
    assert {str(w.message) for w in caught} == {
        "Limiting epochs to 2", "Limiting steps_per_epoch to 3",
    }
    assert_history_close(history.history, expected.history)
    assert max_weight_diff(ours, theirs) < 1e-5
    with pytest.warns(UserWarning, match="Limiting steps_per_epoch to 3"):
        np.testing.assert_allclose(logs, theirs.evaluate(x, y, batch_size=16, verbose=0),
                                   rtol=1e-5)
    with pytest.warns(UserWarning, match="Limiting steps_per_epoch to 3"):
        theirs_out = theirs.predict(x, batch_size=16, verbose=0)
    assert outputs.shape == theirs_out.shape == (48, 1)
    np.testing.assert_allclose(outputs, theirs_out, rtol=1e-5, atol=1e-6)


def test_callbacks_that_change_the_learning_rate_or_stop_act_as_under_keras():
    def callbacks():
        return [
            keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.1 if epoch else lr),
            keras.callbacks.EarlyStopping("loss", patience=0, min_delta=10.0,
                                          restore_best_weights=True),
        ]

    x, y = regression_data(128)
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False,
                                    placement="replicate")
        history = fit(ours := mlp(), ds, epochs=5, verbose=0, callbacks=callbacks())
    expected = (theirs := mlp()).fit(x, y, batch_size=16, epochs=5, shuffle=False, verbose=0,
                                     callbacks=callbacks())
    assert history.epoch == expected.epoch == [0, 1]  # stopped after epoch 1
    assert_history_close(history.history, expected.history)
    assert max_weight_diff(ours, theirs) < 1e-5


def test_resuming_inside_an_epoch_with_initial_step_equals_an_uninterrupted_fit():
    class StopAfter(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = True  # after the first call: steps 0-3

    x, y = regression_data(160)
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, seed=5)
        options = FitOptions(steps_per_execution=4)
        fit(whole := mlp(), ds, epochs=2, verbose=0, options=options)
        fit(resumed := mlp(), ds, epochs=1, verbose=0, options=options, callbacks=[StopAfter()])
        history = fit(resumed, ds, epochs=2, initial_step=4, verbose=0, options=options)
    assert history.epoch == [0, 1]
    assert max_weight_diff(whole, resumed) < 1e-6


def test_batch_norm_statistics_and_dropout_masks_are_the_global_batchs():
    def build():
        keras.utils.set_random_seed(6)
        model = keras.Sequential([
            keras.Input((8,)),
            # No bias before the normalisation: its true gradient is 0, and Adam
            # would scale the rounding noise up to a visible difference.
            keras.layers.Dense(16, use_bias=False),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(1),
        ])
        model.compile(optimizer="adam", loss="mse")
        return model

    x, y = regression_data(200)
    with replicas(4):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False,
                                    placement="replicate")
        history = fit(ours := build(), ds, epochs=2, verbose=0)
    expected = (theirs := build()).fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    assert_history_close(history.history, expected.history)
    assert max_weight_diff(ours, theirs) < 1e-5  # moving mean/variance and the seed state too


def test_a_convolution_model_one_step_per_call_equals_keras_fit_evaluate_and_predict():
    # keras-io's timeseries FCN in small: one step per call runs the step
    # outside any loop (its own code path), on 2 replicas.
    def build():
        keras.utils.set_random_seed(2)
        inputs = keras.Input((12, 1))
        h = keras.layers.Conv1D(4, 3, padding="same", use_bias=False)(inputs)
        h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
        outputs = keras.layers.Dense(2, activation="softmax")(
            keras.layers.GlobalAveragePooling1D()(h)
        )
        model = keras.Model(inputs, outputs)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["sparse_categorical_accuracy"])
        return model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(70, 12, 1)).astype("float32")  # batch 2 * 8: 4 full steps, 6 rows
    y = (x.mean(axis=(1, 2)) > 0).astype("int32")
    one = FitOptions(steps_per_execution=1)
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False,
                                    placement="replicate")
        history = fit(ours := build(), ds, epochs=2, verbose=0, options=one)
        scores = evaluate(ours, x, y, per_replica_batch_size=8, return_dict=True, options=one)
        outputs = predict(ours, x, per_replica_batch_size=8, options=one)
    expected = (theirs := build()).fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert history.params["steps_per_execution"] == 1
    assert_history_close(history.history, expected.history)
    assert max_weight_diff(ours, theirs) < 1e-5
    keras_scores = theirs.evaluate(x, y, batch_size=16, return_dict=True, verbose=0)
    for name, value in keras_scores.items():
        np.testing.assert_allclose(scores[name], value, rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(outputs, theirs.predict(x, batch_size=16, verbose=0), atol=1e-6)


def test_fit_warns_as_keras_when_the_data_runs_out_at_the_users_call():
    x, y = regression_data(64)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, shuffle=False)
    with pytest.warns(UserWarning, match="Your input ran out of data") as caught:
        fit(mlp(), ds, epochs=2, steps_per_epoch=10, verbose=0)
    # As Keras: once per epoch, each at this call (was at `_distribute/progress.py`,
    # the wrapper `fit` runs in).
    assert [w.filename for w in caught] == [__file__, __file__]
