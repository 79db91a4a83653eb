"""Keras' contract under `shardfeed.fit` / `evaluate` / `predict` (issue 15).

Each case either matches what Keras' own `model.fit` / `evaluate` /
`predict` does on the same model and rows, or is refused with a message
that names the fix (pinned here, listed in docs/keras.md):

- metrics with an array result (`F1Score`, `FBetaScore(average=None)`) in
  the logs, the `History` and `evaluate`'s result, as in Keras;
- a tuple given to `evaluate`/`predict` is the model's inputs, as in Keras;
- None for an optional model input (`keras.Input(..., optional=True)`);
- Keras' argument names (`x=`, `y=`, `batch_size`, `steps`, `verbose`,
  `callbacks`) and `fit(model, x, y)`;
- models and datasets built outside `world.scope()`, on 2 logical devices
  and in a fresh process split by `shardfeed.init(cpu_devices=2)`;
- no TensorFlow retracing warning on repeated `evaluate`/`predict`, nor in
  a 2-worker run.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from _helpers import mirrored_strategy
from _helpers_keras_workers import classifier_script, run_two_workers

import shardfeed
from shardfeed import ShardedResidentDataset
from shardfeed._tf import initialize
from shardfeed._tf import world as _world

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300


def _data(rows=64, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype("float32")
    y = keras.utils.to_categorical((x @ rng.normal(size=(4,))).argsort().argsort() % classes)
    return x, y.astype("float32")


def _f1_model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(
        "sgd",
        "categorical_crossentropy",
        metrics=[keras.metrics.F1Score(), keras.metrics.FBetaScore(average=None)],
    )
    return model


def _regression(rows=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype("float32")
    return x, (x @ rng.normal(size=(4, 1))).astype("float32")


def _dense(inputs=4):
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"])
    return model


# -- 1. array-valued metric results ----------------------------------------


def test_array_metric_results_are_arrays_in_logs_history_and_evaluate(capsys):
    x, y = _data()
    expected_model = _f1_model()
    expected = expected_model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    model = _f1_model()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, shuffle=False)
    seen = []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: seen.append(logs))
    history = shardfeed.fit(model, ds, epochs=2, verbose=1, callbacks=[record])
    assert "f1_score" in capsys.readouterr().out  # the progress bar shows its mean
    for name in ("f1_score", "fbeta_score"):
        got = history.history[name]
        assert [type(v) for v in got] == [np.ndarray, np.ndarray]
        np.testing.assert_allclose(got, expected.history[name], rtol=1e-5)
        assert isinstance(seen[-1][name], np.ndarray) and seen[-1][name].shape == (3,)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-5)
    got = shardfeed.evaluate(model, ds, return_dict=True)
    want = expected_model.evaluate(x, y, verbose=0, return_dict=True)
    assert isinstance(got["f1_score"], np.ndarray) and isinstance(got["loss"], float)
    np.testing.assert_allclose(got["f1_score"], want["f1_score"], rtol=1e-5)
    values = shardfeed.evaluate(model, x, y)  # in model.metrics_names order
    np.testing.assert_allclose(values[2], want["fbeta_score"], rtol=1e-5)


# -- 2. tuples are inputs in evaluate / predict ------------------------------


def _two_inputs():
    keras.utils.set_random_seed(5)
    a, b = keras.Input((4,)), keras.Input((2,))
    model = keras.Model((a, b), keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))
    model.compile("sgd", "mse")
    return model


def test_a_tuple_is_the_model_inputs_in_predict_and_evaluate_as_in_keras():
    x, y = _regression()
    x2 = np.random.default_rng(1).normal(size=(64, 2)).astype("float32")
    model = _two_inputs()
    np.testing.assert_allclose(
        shardfeed.predict(model, (x, x2)), model.predict((x, x2), verbose=0), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        shardfeed.evaluate(model, (x, x2), y), model.evaluate((x, x2), y, verbose=0), rtol=1e-5
    )
    # Keras reads `evaluate((x, y))` as inputs too, then fails on the missing
    # targets ("None values not supported"); ours says what to write.
    with pytest.raises(ValueError) as err:
        shardfeed.evaluate(_dense(), (x, y))
    assert str(err.value) == (
        "Evaluating arrays needs their targets `y`. A tuple is the model's inputs, as in "
        "Keras' `model.evaluate`, not `(x, y)`. Received: type(x)=tuple, y=None. Call "
        "`shardfeed.evaluate(model, x, y)`."
    )
    # `fit`'s `validation_data=(x, y)` stays `(x, y)`, as in Keras.
    model = _dense()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, shuffle=False)
    history = shardfeed.fit(model, ds, validation_data=(x, y), verbose=0)
    np.testing.assert_allclose(
        history.history["val_loss"][0], model.evaluate(x, y, verbose=0)[0], rtol=1e-5
    )


# -- 8. None for an optional model input --------------------------------------


class _AddOptional(keras.layers.Layer):
    def call(self, a, b=None):
        return a if b is None else a + keras.ops.sum(b, axis=-1, keepdims=True)


def _optional_input_model():
    keras.utils.set_random_seed(5)
    a = keras.Input((4,), name="a")
    b = keras.Input((2,), name="b", optional=True)
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(_AddOptional()(a, b)))
    model.compile("sgd", "mse")
    return model


def test_none_for_an_optional_input_trains_evaluates_and_predicts_as_keras():
    x, y = _regression()
    inputs = {"a": x, "b": None}
    expected = _optional_input_model()
    want = expected.fit(inputs, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    model = _optional_input_model()
    ds = ShardedResidentDataset(inputs, y, per_replica_batch_size=16, shuffle=False)
    assert ds.num_rows == 64 and len(ds.columns.columns) == 2  # x["a"] and y: no column for b
    history = shardfeed.fit(model, ds, epochs=2, verbose=0)
    np.testing.assert_allclose(history.history["loss"], want.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(
        shardfeed.evaluate(model, inputs, y), expected.evaluate(inputs, y, verbose=0), rtol=1e-5
    )
    np.testing.assert_allclose(
        shardfeed.predict(model, inputs),
        expected.predict(inputs, verbose=0),
        rtol=1e-5,
        atol=1e-6,
    )


def test_none_alone_is_still_refused():
    x, y = _regression()
    with pytest.raises(TypeError, match=r"type\(y\['b'\]\)=NoneType"):
        ShardedResidentDataset(x, {"a": y, "b": None}, per_replica_batch_size=8, shuffle=False)


# -- 11. Keras' argument names -------------------------------------------------


def test_keras_keywords_x_and_y_work_in_evaluate_and_predict():
    x, y = _regression()
    model = _dense()
    np.testing.assert_allclose(
        shardfeed.evaluate(model, x=x, y=y), model.evaluate(x=x, y=y, verbose=0), rtol=1e-5
    )
    np.testing.assert_allclose(
        shardfeed.predict(model, x=x, verbose=0),
        model.predict(x=x, verbose=0),
        rtol=1e-5,
        atol=1e-6,
    )


def test_evaluate_progress_bar_is_keras_own(capsys):
    x, y = _regression()
    shardfeed.evaluate(_dense(), x, y, verbose=1)
    out = capsys.readouterr().out
    assert "step - loss:" in out and "mae:" in out
    shardfeed.evaluate(_dense(), x, y, verbose=2)  # one line at the end
    assert [line for line in capsys.readouterr().out.splitlines() if "loss:" in line] != []
    shardfeed.evaluate(_dense(), x, y, verbose=0)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("call", "text"),
    [
        (
            lambda m, x, y: shardfeed.evaluate(m, x, y, batch_size=32),
            "`shardfeed.evaluate` takes the batch per replica, `per_replica_batch_size` (the "
            "global batch is `per_replica_batch_size x num_replicas_in_sync`; the results do "
            "not depend on it). Received: batch_size=32. Pass `per_replica_batch_size="
            "batch_size // world.num_replicas_in_sync` (for arrays; a `ShardedResidentDataset` "
            "has its own batch).",
        ),
        (
            lambda m, x, y: shardfeed.evaluate(m, x, y, steps=2),
            "`shardfeed.evaluate` covers every row exactly once (a partial last batch on its "
            "real rows only), so there is no step count to choose. Received: steps=2. Pass "
            "fewer rows instead, e.g. `x[:n]`.",
        ),
        (
            lambda m, x, y: shardfeed.predict(m, x, steps=2),
            "`shardfeed.predict` covers every row exactly once (a partial last batch on its "
            "real rows only), so there is no step count to choose. Received: steps=2. Pass "
            "fewer rows instead, e.g. `x[:n]`.",
        ),
        (
            lambda m, x, y: shardfeed.predict(m, x, batch_size=32),
            "`shardfeed.predict` takes the batch per replica, `per_replica_batch_size` (the "
            "global batch is `per_replica_batch_size x num_replicas_in_sync`; the results do "
            "not depend on it). Received: batch_size=32. Pass `per_replica_batch_size="
            "batch_size // world.num_replicas_in_sync` (for arrays; a `ShardedResidentDataset` "
            "has its own batch).",
        ),
        (
            lambda m, x, y: shardfeed.predict(m, x, verbose=1),
            "`shardfeed.predict` runs no callbacks and prints no progress bar: the predictions "
            "of every row come back together at the end. Received: verbose=1. Drop the "
            "argument, and act on the returned predictions instead (`verbose=0` is accepted).",
        ),
        (
            lambda m, x, y: shardfeed.predict(m, x, callbacks=[]),
            "`shardfeed.predict` runs no callbacks and prints no progress bar: the predictions "
            "of every row come back together at the end. Received: callbacks=[]. Drop the "
            "argument, and act on the returned predictions instead.",
        ),
        (
            lambda m, x, y: shardfeed.evaluate(m, x, y, workers=4),
            "`shardfeed.evaluate` has no input pipeline to tune: batches are gathered on the "
            "device inside the compiled step. Received: workers=4. Drop the argument.",
        ),
        (
            lambda m, x, y: shardfeed.predict(m, x, y),
            "`shardfeed.predict` takes `model, x` by position and the rest by keyword (Keras' "
            "`batch_size`, `verbose`, `steps`, ... come after `x` in `model.predict`; here "
            "they are keywords or refused). Received: 1 more positional argument(s): "
            "<ndarray of shape (64, 1)>. Pass them by name, e.g. `verbose=0`, "
            "`per_replica_batch_size=...`; docs/keras.md has the table.",
        ),
        (
            lambda m, x, y: shardfeed.evaluate(m, x, y, 128),  # Keras' third is batch_size
            "`shardfeed.evaluate`'s fourth positional argument is `sample_weight` (Keras' "
            "`model.evaluate` has `batch_size` there). Received: sample_weight=128. Pass the "
            "batch by name: `per_replica_batch_size=...`.",
        ),
        (
            lambda m, x, y: shardfeed.evaluate(m, x, y, x=x),
            "`x` is Keras' name for `shardfeed.evaluate`'s `data`: pass one of the two. "
            "Received: data=<ndarray of shape (64, 4)> and x=<ndarray of shape (64, 4)>. "
            "Keep one.",
        ),
        (
            lambda m, x, y: shardfeed.evaluate(m, y=y),
            "`shardfeed.evaluate` needs data: a `ShardedResidentDataset` or arrays. Received: "
            "data=None. Call `shardfeed.evaluate(model, x, y)` or "
            "`shardfeed.evaluate(model, dataset)`.",
        ),
        (
            lambda m, x, y: shardfeed.predict(m, x, use_cached_eval_dataset=True),
            "`shardfeed.predict` got an unexpected keyword argument `use_cached_eval_dataset`. "
            "Received: use_cached_eval_dataset=True. See docs/keras.md for each "
            "`model.predict` argument and what to use instead.",
        ),
    ],
)
def test_keras_arguments_of_evaluate_and_predict_are_refused_with_the_fix(call, text):
    x, y = _regression()
    with pytest.raises(TypeError) as err:
        call(_dense(), x, y)
    assert str(err.value) == text


ARRAYS_TEXT = (
    "`shardfeed.fit` trains on a `ShardedResidentDataset` (the rows live on the devices). "
    "Received: {received}. Build one and pass it: `shardfeed.fit(model, "
    "ShardedResidentDataset(x, y, per_replica_batch_size=..., seed=0))`."
)


@pytest.mark.parametrize(
    ("call", "received"),
    [
        (
            lambda m, x, y: shardfeed.fit(m, x, y),
            "positional arguments <ndarray of shape (64, 4)>, <ndarray of shape (64, 1)>",
        ),
        (lambda m, x, y: shardfeed.fit(m, x=x, y=y), "x=<ndarray of shape (64, 4)>"),
        (lambda m, x, y: shardfeed.fit(m, y=y), "y=<ndarray of shape (64, 1)>"),
    ],
)
def test_fit_on_arrays_is_refused_with_the_dataset_to_build(call, received):
    x, y = _regression()
    with pytest.raises(TypeError) as err:
        call(_dense(), x, y)
    assert str(err.value) == ARRAYS_TEXT.format(received=received)


def test_fit_positional_after_the_dataset_and_no_dataset():
    x, y = _regression()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, shuffle=False)
    with pytest.raises(TypeError) as err:
        shardfeed.fit(_dense(), ds, 5)
    assert str(err.value) == (
        "`shardfeed.fit` takes the model and the dataset by position, the rest by keyword. "
        "Received: positional arguments 5. Pass the rest by name, e.g. `epochs=5`."
    )
    with pytest.raises(TypeError) as err:
        shardfeed.fit(_dense())
    assert str(err.value) == (
        "`shardfeed.fit` needs a dataset. Received: dataset=None. Build one and pass it: "
        "`shardfeed.fit(model, ShardedResidentDataset(x, y, per_replica_batch_size=..., "
        "seed=0))`."
    )


# -- 12. scope mistakes, on 2 logical devices ----------------------------------


@pytest.mark.multi_device
def test_dataset_built_outside_the_scope_names_the_dataset():
    x, y = _regression()
    with mirrored_strategy(2).scope():
        model = _dense()
    outside = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False)
    for call in (
        lambda: shardfeed.fit(model, outside, verbose=0),
        lambda: shardfeed.evaluate(model, outside),
        lambda: shardfeed.predict(model, outside),
    ):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == (
            "The model and the dataset must use the same `tf.distribute` strategy. The "
            "dataset was built outside the strategy's scope. Received: "
            "model.distribute_strategy=MirroredStrategy, dataset "
            "strategy=_DefaultDistributionStrategy. Build the dataset inside the scope the "
            "model was built in: `with world.scope(): dataset = "
            "shardfeed.ShardedResidentDataset(...)` (or pass `ShardedResidentDataset(..., "
            "strategy=model.distribute_strategy)`)."
        )


def _new_collective_keys():
    # `shardfeed.init` builds a MirroredStrategy in this process too: move its
    # collective keys as `_helpers.mirrored_strategy` does.
    tf.distribute.MirroredStrategy._collective_key_base += 100_000


MODEL_OUTSIDE_TEXT = (
    "The model must be built, compiled or loaded inside the scope of the strategy "
    "`shardfeed.init()` started. Received: model.distribute_strategy="
    "_DefaultDistributionStrategy, shardfeed.init() strategy=MirroredStrategy. Build or "
    "load it inside that scope: `with world.scope(): model = keras.models.load_model(path)`."
)


@pytest.mark.multi_device
def test_arrays_with_a_model_outside_the_init_scope_are_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(_world, "_initialized", [])  # this test's init only
    _new_collective_keys()
    world = shardfeed.init("mirrored")  # over the session's logical CPUs
    x, y = _regression()
    with world.scope():
        inside = _dense()
    shardfeed.save_model(inside, tmp_path / "m.keras")
    loaded_outside = keras.models.load_model(tmp_path / "m.keras")
    for model in (_dense(), loaded_outside):
        with pytest.raises(ValueError) as err:
            shardfeed.evaluate(model, x, y)
        assert str(err.value) == MODEL_OUTSIDE_TEXT
        with pytest.raises(ValueError) as err:
            shardfeed.predict(model, x)
        assert str(err.value) == MODEL_OUTSIDE_TEXT
    with world.scope():
        loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(
        shardfeed.evaluate(loaded, x, y), inside.evaluate(x, y, verbose=0), rtol=1e-5
    )


# -- 14. shardfeed.init(cpu_devices=N) / SHARDFEED_CPU_DEVICES -------------------


@pytest.mark.parametrize(
    ("argument", "environ", "expected"),
    [
        (None, {}, None),  # leave TensorFlow's configuration
        (None, {"SHARDFEED_CPU_DEVICES": "2"}, 2),
        (None, {"SHARDFEED_CPU_DEVICES": " "}, None),  # blank: unset
        (3, {"SHARDFEED_CPU_DEVICES": "2"}, 3),  # the argument wins
        (np.int64(1), {}, 1),
    ],
)
def test_cpu_devices_from_the_argument_or_the_variable(argument, environ, expected):
    assert initialize.cpu_devices_wanted(argument, environ) == expected


@pytest.mark.parametrize(
    ("argument", "environ", "received"),
    [
        (0, {}, "cpu_devices=0"),
        (2.0, {}, "cpu_devices=2.0"),
        (None, {"SHARDFEED_CPU_DEVICES": "two"}, "SHARDFEED_CPU_DEVICES='two'"),
        (None, {"SHARDFEED_CPU_DEVICES": "-1"}, "SHARDFEED_CPU_DEVICES='-1'"),
    ],
)
def test_cpu_devices_must_be_a_count(argument, environ, received):
    with pytest.raises(ValueError) as err:
        initialize.cpu_devices_wanted(argument, environ)
    assert str(err.value) == (
        "`cpu_devices` must be an integer >= 1: the number of logical devices to split the "
        f"CPU into (several replicas in one process). Received: {received}. Pass e.g. "
        "`shardfeed.init(cpu_devices=2)` or set SHARDFEED_CPU_DEVICES=2."
    )


def test_cpu_devices_with_one_worker_per_device_is_refused(monkeypatch):
    monkeypatch.setattr(_world, "_initialized", [])
    with pytest.raises(ValueError) as err:
        shardfeed.init("multiworker", cpu_devices=2)
    assert str(err.value) == (
        "`cpu_devices` splits the CPU of one process without GPUs (MirroredStrategy over "
        "logical CPUs); with GPUs or one worker per device it would be ignored. Received: "
        "cpu_devices=2 with engine='multiworker'. Drop `cpu_devices` (and unset "
        'SHARDFEED_CPU_DEVICES), or start one process on a machine without GPUs '
        '(`CUDA_VISIBLE_DEVICES=""`).'
    )


def test_cpu_devices_after_tensorflow_started_names_the_fix(monkeypatch):
    # This session split the CPU into 4 in conftest, and TensorFlow is running.
    monkeypatch.setattr(_world, "_initialized", [])
    assert len(tf.config.list_logical_devices("CPU")) == 4
    _new_collective_keys()
    assert shardfeed.init("mirrored", cpu_devices=4).num_replicas_in_sync == 4  # as it is
    with pytest.raises(RuntimeError) as err:
        shardfeed.init(cpu_devices=2)
    assert str(err.value) == (
        "The CPU can be split into logical devices only before TensorFlow initialises its "
        "devices (the first op, or listing logical devices). Received: cpu_devices=2, "
        "TensorFlow already runs with 4 CPU device(s). Call `shardfeed.init(cpu_devices=N)` "
        "(or set SHARDFEED_CPU_DEVICES=N) before any other TensorFlow or Keras call, e.g. "
        "first thing in the script."
    )


FRESH = r"""
import json, sys
import keras, numpy as np, shardfeed
world = shardfeed.init(**json.loads(sys.argv[1]))
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x @ rng.normal(size=(4, 1))).astype("float32")
def model():
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    m.compile("sgd", "mse")
    return m
errors = {}
def attempt(name, call):
    try:
        call()
    except ValueError as err:
        errors[name] = str(err)
with world.scope():
    inside = model()
outside = model()
dataset_outside = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False)
attempt("dataset_outside", lambda: shardfeed.fit(inside, dataset_outside, verbose=0))
attempt("model_outside", lambda: shardfeed.evaluate(outside, x, y))
shardfeed.evaluate(inside, x, y)
print(json.dumps({"replicas": world.num_replicas_in_sync,
                  "strategy": type(world.strategy).__name__, "errors": errors}))
"""


def _fresh_process(tmp_path, init_kwargs, **environ):
    script = tmp_path / "fresh.py"
    script.write_text(FRESH)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "SHARDFEED_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT), **environ)
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(init_kwargs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.multi_device
@pytest.mark.parametrize(
    ("init_kwargs", "environ"),
    [({"cpu_devices": 2}, {}), ({}, {"SHARDFEED_CPU_DEVICES": "2"})],
    ids=["argument", "variable"],
)
def test_init_splits_the_cpu_and_scope_mistakes_name_what_to_move(
    tmp_path, init_kwargs, environ
):
    result = _fresh_process(tmp_path, init_kwargs, **environ)
    assert (result["replicas"], result["strategy"]) == (2, "MirroredStrategy")
    errors = result["errors"]
    assert "The dataset was built outside the strategy's scope." in errors["dataset_outside"]
    assert "Build the dataset inside the scope" in errors["dataset_outside"]
    assert errors["model_outside"] == MODEL_OUTSIDE_TEXT


@pytest.mark.slow
def test_one_device_scope_is_a_no_op(tmp_path):
    # The same script on one device: the default strategy, nothing to move.
    result = _fresh_process(tmp_path, {})
    assert result == {"replicas": 1, "strategy": "_DefaultDistributionStrategy", "errors": {}}


# -- 13. no retracing ------------------------------------------------------------


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def tf_warnings():
    handler = _Messages()
    tf.get_logger().addHandler(handler)
    yield handler.messages
    tf.get_logger().removeHandler(handler)


def test_repeated_evaluate_predict_and_validation_do_not_retrace(tf_warnings):
    x, y = _regression(300)
    model = _dense()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
    for _ in range(3):  # validation arrays: a new dataset per fit
        shardfeed.fit(model, ds, verbose=0, validation_data=(x[:100], y[:100]))
    results = []
    for _ in range(7):  # arrays: a new dataset per call
        results.append(shardfeed.evaluate(model, x, y, per_replica_batch_size=64))
        shardfeed.predict(model, x[:50])
    assert [m for m in tf_warnings if "retracing" in m] == []
    np.testing.assert_allclose(results[-1], model.evaluate(x, y, verbose=0), rtol=1e-5)


def test_a_search_of_new_models_does_not_warn_of_retracing(tf_warnings):
    # A search's trials: a new model each, traced once. TensorFlow counted
    # every model's first trace as a retrace of the last (its count is per
    # function code), and the 5th trial's validation warned.
    x, y = _regression(300)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
    val = ShardedResidentDataset(x[:100], y[:100], per_replica_batch_size=32, shuffle=False)
    for _ in range(6):
        shardfeed.fit(_dense(), ds, verbose=0, validation_data=val)
    assert [m for m in tf_warnings if "retracing" in m] == []


@pytest.mark.multi_device
def test_repeated_evaluate_on_two_devices_does_not_retrace(tf_warnings):
    x, y = _regression(301)
    with mirrored_strategy(2).scope():
        model = _dense()
    for _ in range(6):
        got = shardfeed.evaluate(model, x, y, per_replica_batch_size=32)
        shardfeed.predict(model, x[:51])
    assert [m for m in tf_warnings if "retracing" in m] == []
    plain = _dense()
    plain.set_weights(model.get_weights())
    np.testing.assert_allclose(got, plain.evaluate(x, y, verbose=0), rtol=1e-5)


TWO_WORKERS = classifier_script(
    '["accuracy", keras.metrics.F1Score(threshold=0.5)]',
    r"""
history = shardfeed.fit(model, ds, epochs=2, verbose=0, validation_data=(x[:100], y[:100]))
scores = [shardfeed.evaluate(model, x[:300], y[:300], return_dict=True) for _ in range(6)]
predictions = shardfeed.predict(model, x[:300])
result = {"f1": np.asarray(history.history["f1_score"]).tolist(),
          "loss": scores[-1]["loss"], "predictions": predictions[:5].tolist()}
(out / f"result{world.rank}.json").write_text(json.dumps(result))
""",
)


@pytest.mark.slow
@pytest.mark.multi_process
def test_two_workers_do_not_retrace(tmp_path):
    output = run_two_workers(TWO_WORKERS, tmp_path, TIMEOUT_S)
    assert "retracing" not in output, [line for line in output.splitlines() if "retrac" in line]
    results = [json.loads((tmp_path / f"result{r}.json").read_text()) for r in (0, 1)]
    assert results[0] == results[1]  # the same global numbers on both ranks
    assert len(results[0]["f1"]) == 2 and len(results[0]["f1"][0]) == 1  # one class


# -- XLA under jit_compile="auto" on a CPU ------------------------------------


class _PyFunctionLayer(keras.layers.Layer):
    """An op with no XLA kernel inside `call` (as a `tf.summary` write is)."""

    def call(self, x):
        return tf.ensure_shape(tf.py_function(lambda t: t, [x], tf.float32), x.shape)


def test_an_op_without_an_xla_kernel_is_refused_with_the_fix_under_auto():
    # "auto" turns XLA on for this convolution-free model on a CPU (Keras' "auto"
    # does not); TensorFlow's "Detected unsupported operations" named no fix.
    model = keras.Sequential([keras.Input((4,)), _PyFunctionLayer(), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.ones((32, 4), "float32"), np.ones((32, 1), "float32")
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False)
    with pytest.raises(ValueError) as info:
        shardfeed.fit(model, ds, epochs=1, verbose=0)
    assert str(info.value) == (
        "With XLA every op of the model needs an XLA kernel (`FitOptions(jit_compile="
        '"auto")` turns XLA on for models without convolutions, also on CPUs, where '
        "Keras' \"auto\" is off). Received: jit_compile='auto', ops without an XLA "
        "kernel: ['EagerPyFunc']. Pass `options=shardfeed.FitOptions(jit_compile=False)`."
    )
    # The fix it names works, and trains as Keras does.
    history = shardfeed.fit(
        model, ds, epochs=1, verbose=0, options=shardfeed.FitOptions(jit_compile=False)
    )
    assert np.isfinite(history.history["loss"][0])


class _ExecutionProbe(keras.layers.Layer):
    """Records whether each forward pass ran eagerly (an identity)."""

    def __init__(self, seen, **kwargs):
        super().__init__(**kwargs)
        self._record = seen.append  # Keras would copy a list attribute

    def call(self, x):
        self._record(tf.executing_eagerly())
        return x


def _probed_model(seen, run_eagerly):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            _ExecutionProbe(seen),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile("adam", "mse", metrics=["mae"], run_eagerly=run_eagerly)
    return model


def test_run_eagerly_runs_every_step_eagerly_with_the_compiled_results():
    # Was refused ("`run_eagerly=True` is not supported"). 100 rows at batch 16:
    # a partial last step, validation and steps_per_execution=3 (calls of 3 steps).
    x, y = _regression(rows=100)
    results = {}
    for eager in (False, True):
        seen = []
        model = _probed_model(seen, eager)
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, shuffle=True, seed=3)
        options = shardfeed.FitOptions(steps_per_execution=3)
        history = shardfeed.fit(
            model, ds, epochs=2, verbose=0, validation_data=(x[:40], y[:40]), options=options
        )
        seen.clear()
        evaluated = shardfeed.evaluate(model, x, y, per_replica_batch_size=16, options=options)
        predicted = shardfeed.predict(model, x, per_replica_batch_size=16, options=options)
        results[eager] = (history.history, evaluated, predicted, model.get_weights(), seen)
    compiled, eager = results[False], results[True]
    # Every forward pass eager: 7 evaluation and 7 prediction steps, plus the
    # builds that both runs make eagerly. The compiled run's steps are traced
    # but for evaluate's partial last step, eager in a loop's first epochs
    # (`Traces._eager_first`).
    builds = sum(compiled[4]) - 1
    assert eager[4] == [True] * (14 + builds)
    assert len(compiled[4]) > builds
    assert eager[0].keys() == compiled[0].keys()
    for key in compiled[0]:
        np.testing.assert_allclose(eager[0][key], compiled[0][key], rtol=1e-5)
    np.testing.assert_allclose(eager[1], compiled[1], rtol=1e-5)
    np.testing.assert_allclose(eager[2], compiled[2], rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(eager[3], compiled[3], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_run_eagerly_with_fit_options_jit_compile_warns_as_keras():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", run_eagerly=True)
    x, y = _regression(rows=32)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False)
    with pytest.warns(UserWarning, match="If `run_eagerly` is True, then `jit_compile` cannot"):
        shardfeed.fit(model, ds, verbose=0, options=shardfeed.FitOptions(jit_compile=True))


# -- Keras' logs and return values -------------------------------------------


def _two_outputs(run_eagerly=False):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    outputs = [keras.layers.Dense(1, name="a")(inputs), keras.layers.Dense(1, name="b")(inputs)]
    model = keras.Model(inputs, outputs)
    model.compile("sgd", loss={"a": "mse", "b": "mse"}, run_eagerly=run_eagerly)
    return model


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_per_output_losses_with_sample_weights_are_keras_own(run_eagerly):
    # Keras' TensorFlow trainer weighs each batch's per-output loss once (its
    # traced batch size is unknown); shardfeed weighed it by rows: `a_loss`
    # 1.1782 where Keras logs 1.3743 (the total `loss` was right). Keras' eager
    # steps know the batch size and weigh by rows: so do shardfeed's.
    x, y1 = _regression(rows=20)
    y2 = np.random.default_rng(1).normal(size=(20, 1)).astype("float32")
    weights = np.random.default_rng(2).uniform(size=(20,)).astype("float32")
    expected_model = _two_outputs(run_eagerly)
    expected = expected_model.fit(
        x, (y1, y2), sample_weight=weights, batch_size=8, epochs=2, shuffle=False, verbose=0
    )
    model = _two_outputs(run_eagerly)
    ds = ShardedResidentDataset(x, (y1, y2), weights, per_replica_batch_size=8, shuffle=False)
    options = shardfeed.FitOptions(steps_per_execution=1)
    history = shardfeed.fit(model, ds, epochs=2, verbose=0, options=options)
    assert history.history.keys() == expected.history.keys()
    for key in expected.history:
        np.testing.assert_allclose(history.history[key], expected.history[key], rtol=1e-5)
    ours = shardfeed.evaluate(
        model, x, (y1, y2), weights, per_replica_batch_size=8, return_dict=True
    )
    theirs = expected_model.evaluate(
        x, (y1, y2), sample_weight=weights, batch_size=8, verbose=0, return_dict=True
    )
    assert ours.keys() == theirs.keys()
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5)


def test_per_output_losses_on_replicas_with_a_partial_step_follow_each_batchs_rows():
    # docs/keras.md: each batch's per-output loss counts once (as Keras), so
    # with a partial step the rows in each replica's batches matter. Sharded
    # rows give each replica its shard in order, where Keras slices each
    # global batch: `a_loss` differs; `placement="replicate"` takes Keras'
    # slices and equals it. The total `loss` weighs rows and is equal both ways.
    strategy = mirrored_strategy(2)
    x, y1 = _regression(rows=20)
    y2 = np.random.default_rng(1).normal(size=(20, 1)).astype("float32")
    weights = np.random.default_rng(2).uniform(size=(20,)).astype("float32")
    with strategy.scope():
        model = _two_outputs()
        replicated = ShardedResidentDataset(
            x, (y1, y2), weights, per_replica_batch_size=4, shuffle=False, placement="replicate"
        )
    theirs = model.evaluate(
        x, (y1, y2), sample_weight=weights, batch_size=8, verbose=0, return_dict=True
    )
    ours = shardfeed.evaluate(model, replicated, return_dict=True)
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5)
    sharded = shardfeed.evaluate(
        model, x, (y1, y2), weights, per_replica_batch_size=4, return_dict=True
    )
    np.testing.assert_allclose(sharded["loss"], theirs["loss"], rtol=1e-5)
    assert not np.isclose(sharded["a_loss"], theirs["a_loss"], rtol=1e-3)


def test_evaluate_returns_a_value_per_metric_when_names_are_shared_as_keras():
    # `mae` and the weighted `mae` are one log each but Keras returns a value
    # per metric of `model.metrics` (4); shardfeed returned the 3 log values.
    x, y = _regression()
    weights = np.random.default_rng(3).uniform(size=(64,)).astype("float32")
    model = _dense()
    model.compile("sgd", "mse", metrics=["mae"], weighted_metrics=["mae"])
    ours = shardfeed.evaluate(model, x, y, weights, per_replica_batch_size=16)
    theirs = model.evaluate(x, y, sample_weight=weights, batch_size=16, verbose=0)
    assert len(theirs) == 4
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def _tracing_model(strategy, steps_per_execution):
    traced = []

    class TracingModel(keras.Model):
        def train_step(self, *args):
            traced.append(1)
            return super().train_step(*args)

    with strategy.scope():
        inputs = keras.Input((4,))
        model = TracingModel(inputs, keras.layers.Dense(1)(inputs))
        model.compile(loss="mse", optimizer="adam", steps_per_execution=steps_per_execution)
    return model, traced


@pytest.mark.parametrize(
    "replicas, rows, batch, steps_per_execution, traces",
    [
        (1, 200, 20, 5, 2),  # equal calls: optimizers + calls, as Keras' test allows
        (1, 210, 20, 5, 3),  # + the partial last step, a shape of its own
        (2, 200, 1, 20, 6),  # (optimizers + loop body + last step) x 2 replicas
        (2, 20, 1, 4, 6),  # calls of 4, 4 and 2 steps: the last takes 4, skips 2
    ],
)
def test_own_train_step_traces_as_documented(replicas, rows, batch, steps_per_execution, traces):
    # docs/keras.md, "Tracing": Keras traces it once (batches of unknown
    # size); shardfeed's steps take static shapes, so each shape traces it,
    # once per fit (no retracing across epochs or calls, of any length).
    strategy = mirrored_strategy(2) if replicas == 2 else tf.distribute.get_strategy()
    x, y = np.ones((rows, 4), "float32"), np.ones((rows, 1), "float32")
    model, traced = _tracing_model(strategy, steps_per_execution)
    with strategy.scope():
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=batch, shuffle=False)
    shardfeed.fit(model, ds, epochs=2, verbose=0)
    assert len(traced) == traces


def test_run_eagerly_on_two_replicas_gives_the_compiled_results():
    # MirroredStrategy runs each replica's step eagerly (TensorFlow logs its
    # overhead); 50 rows at 2 x 8: a partial last step, and validation on 21.
    strategy = mirrored_strategy(2)
    x, y = _regression(rows=50)
    results = {}
    for eager in (False, True):
        with strategy.scope():
            model = _dense()
            model.compile("sgd", "mse", metrics=["mae"], run_eagerly=eager)
            ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=True, seed=2)
        history = shardfeed.fit(model, ds, epochs=2, verbose=0, validation_data=(x[:21], y[:21]))
        results[eager] = (history.history, shardfeed.evaluate(model, ds), model.get_weights())
    compiled, eager = results[False], results[True]
    for key in compiled[0]:
        np.testing.assert_allclose(eager[0][key], compiled[0][key], rtol=1e-5)
    np.testing.assert_allclose(eager[1], compiled[1], rtol=1e-5)
    for ours, theirs in zip(eager[2], compiled[2], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
