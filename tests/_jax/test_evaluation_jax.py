"""`evaluate` and `predict` on the JAX backend against Keras' own on JAX."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
from _helpers_fit import mlp, regression_data, replicas

from shardfeed import FitOptions, ShardedResidentDataset, evaluate, fit, predict


def _two_output_model() -> keras.Model:
    keras.utils.set_random_seed(5)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = keras.Model(
        inputs,
        {"value": keras.layers.Dense(1, name="value")(hidden),
         "label": keras.layers.Dense(3, activation="softmax", name="label")(hidden)},
    )
    model.compile(
        optimizer="adam",
        loss={"value": "mse", "label": "sparse_categorical_crossentropy"},
        metrics={"label": ["accuracy"]},
    )
    return model


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("placement", ["shard", "replicate"])
def test_evaluate_and_predict_are_exact_over_uneven_rows(n, placement):
    x, y = regression_data(1003)  # 1003 rows: uneven over replicas, a partial step
    sw = np.linspace(0.5, 1.5, len(x)).astype("float32")
    model = mlp()
    expected = model.evaluate(x, y, sample_weight=sw, batch_size=64, verbose=0, return_dict=True)
    with replicas(n):
        ds = ShardedResidentDataset(x, y, sw, per_replica_batch_size=7, shuffle=False,
                                    placement=placement)
        logs = evaluate(model, ds, return_dict=True, options=FitOptions(steps_per_execution=6))
        outputs = predict(model, ds)
    assert sorted(logs) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(logs[name], expected[name], rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(outputs, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


def test_arrays_with_several_outputs_in_row_order_on_four_replicas():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(301, 8)).astype("float32")
    y = {"value": rng.normal(size=(301, 1)).astype("float32"),
         "label": rng.integers(0, 3, size=(301,)).astype("int32")}
    model = _two_output_model()
    expected = model.evaluate(x, y, verbose=0, return_dict=True)
    with replicas(4):
        logs = evaluate(model, x, y, per_replica_batch_size=16, return_dict=True)
        values = evaluate(model, x, y)
        outputs = predict(model, x, per_replica_batch_size=16)
    for name in expected:
        np.testing.assert_allclose(logs[name], expected[name], rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(values, list(logs.values()), rtol=1e-6)
    theirs = model.predict(x, verbose=0)
    assert sorted(outputs) == ["label", "value"]
    for name in theirs:
        np.testing.assert_allclose(outputs[name], theirs[name], rtol=1e-5, atol=1e-6)


def test_a_test_step_override_is_the_one_that_runs():
    class Doubled(keras.Model):
        def test_step(self, state, data):
            logs, state = super().test_step(state, data)
            return {"doubled_loss": 2 * logs["loss"]}, state

    keras.utils.set_random_seed(2)
    inputs = keras.Input((8,))
    model = Doubled(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    x, y = regression_data(90)
    with replicas(2):
        logs = evaluate(model, x, y, per_replica_batch_size=8, return_dict=True)
    expected = model.evaluate(x, y, verbose=0, return_dict=True)
    assert list(logs) == list(expected) == ["doubled_loss"]
    np.testing.assert_allclose(logs["doubled_loss"], expected["doubled_loss"], rtol=1e-5)


def test_evaluate_callbacks_see_test_hooks_once_per_call():
    seen: list[tuple[str, int]] = []

    class Hooks(keras.callbacks.Callback):
        def on_test_batch_begin(self, batch, logs=None):
            seen.append(("begin", batch))

        def on_test_batch_end(self, batch, logs=None):
            seen.append(("end", batch))

    x, y = regression_data(50)  # batch 2 x 4: 6 full steps + a partial step
    with replicas(2):
        evaluate(mlp(), x, y, per_replica_batch_size=4, callbacks=[Hooks()],
                 options=FitOptions(steps_per_execution=4))
    # Keras' numbering: the last call (steps 4, 5 and the partial step 6, run
    # as two compiled calls) begins at 4 and ends at 4 + k - 1 = 7.
    assert seen == [("begin", 0), ("end", 3), ("begin", 4), ("end", 7)]


def test_keras_arguments_are_refused_with_the_fix():
    x, y = regression_data(16)
    with pytest.raises(TypeError, match="there is no step count to choose"):
        evaluate(mlp(), x, y, steps=2)
    with pytest.raises(TypeError, match="Received: "):
        predict(mlp(), x, batch_size=4)


def _classifier() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


@pytest.mark.parametrize("where", ["dataset", "validation_data", "data"])
def test_out_of_range_sparse_labels_are_refused_before_the_first_step(where):
    x, _ = regression_data(80)
    good = (np.arange(80) % 3).astype("int32")
    bad = good.copy()
    bad[-1] = 7  # held by the last replica only
    with replicas(4):
        train = ShardedResidentDataset(x, bad if where == "dataset" else good,
                                       per_replica_batch_size=4, shuffle=False)
        model = _classifier()
        before = model.get_weights()
        with pytest.raises(ValueError) as raised:
            if where == "data":
                evaluate(model, x, bad)
            else:
                fit(model, train, verbose=0,
                    validation_data=(x, bad) if where == "validation_data" else None)
    # No step ran (bad validation labels were refused only after the first epoch).
    for now, then in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(now, then)
    assert str(raised.value) == (
        "Labels of a sparse categorical crossentropy must be class indices in the valid "
        "range of [0, 3): the model's output has 3 units. Received: a label value of 7 in "
        f"y of `{where}` (labels span 0 to 7). Number the classes from 0 to 2, or give the "
        "output layer one unit per class."
    )


def _batch_norm_model(compiled: bool) -> keras.Model:
    """Unbuilt metrics and a non-trainable state; no `fit`/`evaluate` ran."""
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    if compiled:
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def _saved_and_loaded(model: keras.Model, tmp_path: Any) -> keras.Model:
    """`model` trained by Keras (a saved optimizer loads without a warning),
    saved and loaded: a new model no shardfeed call has seen."""
    if model.compiled:
        model.fit(*regression_data(64), batch_size=16, verbose=0)
    model.save(tmp_path / "model.keras")
    return keras.models.load_model(tmp_path / "model.keras")


@pytest.mark.parametrize("source", ["fresh", "uncompiled", "loaded", "loaded uncompiled"])
def test_predict_as_the_first_call_on_any_model_equals_keras(source, tmp_path):
    # Used to fail: `_symbolic_build` built the compiled metrics without
    # targets (None is not a valid value for jnp.array), or read the
    # `optimizer` an uncompiled model does not have.
    x, _ = regression_data(203)
    model = _batch_norm_model(compiled=source in ("fresh", "loaded"))
    if source.startswith("loaded"):
        model = _saved_and_loaded(model, tmp_path)
    with replicas(4):
        outputs = predict(model, x, per_replica_batch_size=8)
    np.testing.assert_allclose(outputs, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


def test_evaluate_as_the_first_call_on_a_loaded_model_equals_keras(tmp_path):
    x, y = regression_data(203)
    model = _saved_and_loaded(_batch_norm_model(compiled=True), tmp_path)
    with replicas(4):
        logs = evaluate(model, x, y, per_replica_batch_size=8, return_dict=True)
        outputs = predict(model, x, per_replica_batch_size=8)
    expected = model.evaluate(x, y, verbose=0, return_dict=True)
    assert sorted(logs) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(logs[name], expected[name], rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(outputs, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
