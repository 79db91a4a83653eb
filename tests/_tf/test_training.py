"""Same numbers as Keras: fit, evaluate and predict on one device.

With shuffling off, shardfeed.fit must leave the weights model.fit(shuffle=False)
leaves with the same batch size -- bit-identical without XLA (SGD and Adam,
a partial last batch), within 1e-5 relative with XLA and for the other cases
(a multi-input dict model, sample weights with a regularizer); evaluate and
predict must match Keras' own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

import shardfeed
from shardfeed import FitOptions, ShardedResidentDataset

ROWS = 1000  # 3 full batches of 256 and a partial one of 232
REPO = Path(__file__).resolve().parents[2]


def _data(rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(rows, 1))).astype("float32")
    return x, y


def _mlp(optimizer="sgd", metrics=("mae",), seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((8,)), layers.Dense(16, activation="relu"), layers.Dense(1)]
    )
    model.compile(optimizer=optimizer, loss="mse", metrics=list(metrics))
    return model


def _max_rel_diff(a: keras.Model, b: keras.Model) -> float:
    return max(
        float(np.abs(wa - wb).max() / max(np.abs(wa).max(), 1e-12))
        for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True)
    )


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_fit_matches_keras(optimizer, jit_compile):
    x, y = _data()
    reference, model = _mlp(optimizer), _mlp(optimizer)
    ref_hist = reference.fit(x, y, batch_size=256, shuffle=False, epochs=2, verbose=0)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=256, shuffle=False)
    hist = shardfeed.fit(
        model,
        ds,
        epochs=2,
        verbose=0,
        options=FitOptions(jit_compile=jit_compile, steps_per_execution=2),
    )
    if jit_compile:
        assert _max_rel_diff(reference, model) < 1e-5
    else:
        # The same ops in the same order as Keras' own train step: the same bits.
        assert _max_rel_diff(reference, model) == 0.0
    for key in ("loss", "mae"):
        np.testing.assert_allclose(hist.history[key], ref_hist.history[key], rtol=1e-5)
    assert hist is model.history
    assert hist.params["steps"] == 4 and hist.params["global_batch_size"] == 256


def _fit_with_shorter_last_calls(jit_compile: bool):
    """Two epochs of 10 full steps and a partial one in calls of 4 steps (4,
    4, 2), validated on 3 full steps and a partial one in calls of 2 (2, 1)."""
    x, y = _data(1100)
    model = _mlp("adam")
    ds = ShardedResidentDataset(x[:1000], y[:1000], per_replica_batch_size=96, seed=0)
    val = ShardedResidentDataset(x[1000:], y[1000:], per_replica_batch_size=32, shuffle=False)
    options = FitOptions(jit_compile=jit_compile, steps_per_execution=4)
    shardfeed.fit(model, ds, epochs=2, validation_data=val, verbose=0, options=options)
    return model, ds, val, options


# Traces of each compiled call (mode, piece) after fit, evaluate and predict,
# each run again: one each. Pinned before the loop was recomposed (issue 38).
# An epoch's shorter last call included (`_fit_with_shorter_last_calls`): it
# takes as many steps as the epoch's others, ending where the epoch ends, and
# skips those run before (`Loop._window`), so every call of the epoch is one
# trace; each length traced apart before. (Each trace runs `Loop.body`, which
# the test counts.) The steps it skips are not run twice: test_fit_matches_keras's
# calls of 2 steps over 3 (2, then 1) leave Keras' bits.
_ONE_TRACE_EACH = {
    False: {("train", "steps"): 1, ("train", "partial"): 1, ("test", "steps"): 1,
            ("test", "partial"): 1, ("predict", "steps"): 1},
    True: {("train", "gathered"): 1, ("train", "rows"): 1, ("train", "partial"): 1,
           ("test", "steps"): 1, ("test", "partial"): 1, ("predict", "steps"): 1},
}


@pytest.mark.parametrize("jit_compile", [False, True])
def test_every_kind_of_call_traces_once(monkeypatch, jit_compile):
    from shardfeed._tf.loop import Loop
    from shardfeed._tf.traces import EAGER_PARTIAL_CALLS

    traced: dict[tuple[str, str], int] = {}
    body = Loop.body

    def counted(self, mode, piece):
        if not tf.executing_eagerly():  # a trace, not an eager partial step
            traced[mode, piece] = traced.get((mode, piece), 0) + 1
        return body(self, mode, piece)

    monkeypatch.setattr(Loop, "body", counted)
    model, ds, val, options = _fit_with_shorter_last_calls(jit_compile)
    # Past the partial step's eager calls, so it is traced too.
    epochs = EAGER_PARTIAL_CALLS + 2
    shardfeed.fit(model, ds, epochs=epochs, initial_epoch=2, validation_data=val, verbose=0,
                  options=options)
    for _ in range(2):
        shardfeed.evaluate(model, val, verbose=0, options=options)
        shardfeed.predict(model, val, verbose=0, options=options)
    assert traced == _ONE_TRACE_EACH[jit_compile]


def test_a_recompiled_model_gets_new_loops_even_when_ids_are_reused(monkeypatch):
    # A recompile's optimizer and loss may get freed ones' `id`s: the loop
    # cache compared them by `id`, and handed back the loop traced for the
    # old optimizer. Simulated here by every `id` being equal.
    from shardfeed._tf import compiled

    x, y = _data(256)
    model = _mlp("adam")
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=64, seed=0)
    monkeypatch.setattr(compiled, "id", lambda _: 0, raising=False)
    first = compiled.loop_for(model, ds, FitOptions())
    model.compile(optimizer="adam", loss="mse")
    second = compiled.loop_for(model, ds, FitOptions())
    assert second is not first and second.traces is not first.traces


def test_a_model_dropped_while_its_dataset_lives_is_freed():
    # The loop cached for the dataset held its model: every model a search
    # fitted on one dataset stayed in memory with its weights and traces.
    import gc
    import weakref

    x, y = _data(256)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=64, seed=0)
    model = _mlp("adam")
    shardfeed.fit(model, ds, epochs=1, verbose=0)
    shardfeed.evaluate(model, ds, verbose=0)
    dropped = weakref.ref(model)
    del model
    gc.collect()
    assert dropped() is None


def test_a_fit_compiles_one_xla_program_per_kind_of_call(tmp_path):
    # Counted as the executables XLA writes to an empty persistent cache (one
    # per compile), in a process of its own: the training loop and the
    # validation loop. Before, an epoch's shorter last call compiled again
    # (the bound of its `tf.range` was a compile-time constant to XLA), and
    # so did validation's, and the partial last step compiled under XLA: 5.
    code = (
        "import sys; sys.path[:0] = ['tests/_tf', 'tests']\n"
        "from test_training import _fit_with_shorter_last_calls\n"
        "_fit_with_shorter_last_calls(jit_compile=True)\n"
    )
    env = {
        **os.environ,
        "TF_XLA_FLAGS": f"--tf_xla_persistent_cache_directory={tmp_path}",
        "PYTHONPATH": str(REPO),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env,
        check=False, cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert len(list(tmp_path.glob("*XLA*"))) == 2


def test_fit_matches_keras_with_sample_weights_and_regularizer():
    x, y = _data()
    w = np.random.default_rng(3).uniform(0.1, 2.0, size=ROWS).astype("float32")

    def model_fn():
        keras.utils.set_random_seed(2)
        m = keras.Sequential(
            [
                keras.Input((8,)),
                layers.Dense(16, activation="relu", kernel_regularizer="l2"),
                layers.Dense(1),
            ]
        )
        m.compile(optimizer="adam", loss="mse", weighted_metrics=["mae"])
        return m

    reference, model = model_fn(), model_fn()
    ref = reference.fit(x, y, sample_weight=w, batch_size=128, shuffle=False, epochs=2, verbose=0)
    ds = ShardedResidentDataset(x, y, w, per_replica_batch_size=128, shuffle=False)
    hist = shardfeed.fit(model, ds, epochs=2, verbose=0)
    assert _max_rel_diff(reference, model) < 1e-5
    np.testing.assert_allclose(hist.history["loss"], ref.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(hist.history["mae"], ref.history["mae"], rtol=1e-5)


def _dict_model():
    keras.utils.set_random_seed(4)
    a = keras.Input((5,), name="a")
    b = keras.Input((3,), name="b")
    h = layers.Concatenate()([layers.Dense(8, activation="relu")(a), b])
    out = layers.Dense(4, activation="softmax")(h)
    model = keras.Model({"a": a, "b": b}, out)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _dict_data(rows=700):
    rng = np.random.default_rng(5)
    x = {
        "a": rng.normal(size=(rows, 5)).astype("float32"),
        "b": rng.normal(size=(rows, 3)).astype("float32"),
    }
    y = rng.integers(0, 4, size=rows).astype("int32")
    return x, y


def test_fit_evaluate_predict_match_keras_for_dict_inputs():
    x, y = _dict_data()
    reference, model = _dict_model(), _dict_model()
    ref = reference.fit(x, y, batch_size=64, shuffle=False, epochs=1, verbose=0)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=64, shuffle=False)
    hist = shardfeed.fit(model, ds, epochs=1, verbose=0)
    assert _max_rel_diff(reference, model) < 1e-5
    np.testing.assert_allclose(hist.history["accuracy"], ref.history["accuracy"], rtol=1e-6)
    np.testing.assert_allclose(
        shardfeed.evaluate(model, x, y, per_replica_batch_size=100),
        reference.evaluate(x, y, batch_size=100, verbose=0),
        rtol=1e-5,
    )
    np.testing.assert_allclose(
        shardfeed.predict(model, ds),
        reference.predict(x, batch_size=64, verbose=0),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize("batch", [1, 7, 256, 999, 1000])
def test_evaluate_counts_each_row_once(batch):
    x, y = _data()
    model = _mlp()
    expected = model.evaluate(x, y, batch_size=ROWS, verbose=0)
    got = shardfeed.evaluate(model, x, y, per_replica_batch_size=batch, return_dict=True)
    assert list(got) == ["loss", "mae"]
    np.testing.assert_allclose([got["loss"], got["mae"]], expected, rtol=1e-5)


def test_predict_keeps_row_order_and_multi_outputs():
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    model = keras.Model(inp, {"sum": layers.Dense(1)(inp), "two": layers.Dense(2)(inp)})
    x, _ = _data(rows=301)
    got = shardfeed.predict(model, x, per_replica_batch_size=64)
    want = model.predict(x, verbose=0)
    assert set(got) == {"sum", "two"}
    for key in got:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compiled", [True, False])
def test_predict_and_evaluate_as_the_first_calls_on_a_loaded_model(compiled, tmp_path):
    # The same on both backends (issue 26: JAX failed here; tests/_jax/
    # test_evaluation_jax.py): a model no shardfeed call has seen.
    x, y = _data(rows=301)
    model = _mlp("adam")
    model.fit(x[:64], y[:64], batch_size=16, verbose=0)  # so its optimizer saves
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras", compile=compiled)
    got = shardfeed.predict(loaded, x, per_replica_batch_size=64)
    np.testing.assert_allclose(got, loaded.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    if compiled:
        fresh = keras.models.load_model(tmp_path / "model.keras")
        logs = shardfeed.evaluate(fresh, x, y, per_replica_batch_size=64, return_dict=True)
        want = fresh.evaluate(x, y, verbose=0, return_dict=True)
        for name in want:
            np.testing.assert_allclose(logs[name], want[name], rtol=1e-5, err_msg=name)


def test_shuffled_runs_repeat_and_epochs_differ():
    x, y = _data()
    runs = []
    for _ in range(2):
        model = _mlp("adam")
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=100, seed=7)
        hist = shardfeed.fit(model, ds, epochs=2, verbose=0)
        runs.append((model.get_weights(), hist.history["loss"]))
    for wa, wb in zip(runs[0][0], runs[1][0], strict=True):
        np.testing.assert_array_equal(wa, wb)
    assert runs[0][1] == runs[1][1]
    unshuffled = _mlp("adam")
    shardfeed.fit(
        unshuffled,
        ShardedResidentDataset(x, y, per_replica_batch_size=100, shuffle=False),
        epochs=2,
        verbose=0,
    )
    assert _max_rel_diff(unshuffled, _mlp("adam")) > 0  # trained
    assert any(
        not np.array_equal(a, b) for a, b in zip(unshuffled.get_weights(), runs[0][0], strict=True)
    )


def test_uint8_storage_with_transform_in_the_step():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(300, 4, 4, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, size=300).astype("int32")

    def transform(x):
        import tensorflow as tf

        return tf.cast(x, "float32") / 255.0

    def model_fn():
        keras.utils.set_random_seed(0)
        m = keras.Sequential(
            [keras.Input((4, 4, 3)), layers.Flatten(), layers.Dense(3, activation="softmax")]
        )
        m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return m

    ds = ShardedResidentDataset(
        images, labels, per_replica_batch_size=50, shuffle=False, transform=transform
    )
    assert ds.stores[0].variables[0].dtype.name == "uint8"
    assert ds.nbytes_on_device == images.nbytes + labels.nbytes
    reference, model = model_fn(), model_fn()
    reference.fit(images.astype("float32") / 255.0, labels, batch_size=50, shuffle=False, verbose=0)
    shardfeed.fit(model, ds, verbose=0)
    assert _max_rel_diff(reference, model) < 1e-5


def test_validation_data_gives_val_logs():
    x, y = _data()
    model = _mlp()
    ds = ShardedResidentDataset(x[:800], y[:800], per_replica_batch_size=128, seed=0)
    hist = shardfeed.fit(model, ds, epochs=2, validation_data=(x[800:], y[800:]), verbose=0)
    assert set(hist.history) == {"loss", "mae", "val_loss", "val_mae"}
    np.testing.assert_allclose(
        hist.history["val_loss"][-1],
        model.evaluate(x[800:], y[800:], verbose=0)[0],
        rtol=1e-5,
    )


class _LogsSeen(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batch_logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.batch_logs.append(dict(logs))


def test_per_call_logs_leave_keras_loss_tracker_unread(monkeypatch):
    """`fit` logs its own exact loss after each call, so Keras' loss tracker
    (whose value it would drop) is never read there; the compiled metrics are,
    and a model's own `get_metrics_result` still runs whole."""
    x, y = _data()
    model = _mlp(metrics=("mae",))
    reads = {"loss": 0, "mae": 0}
    tracker_result = type(model._loss_tracker).result

    def counted(metric):
        if metric.name in reads and tf.executing_eagerly():  # not Keras' step, traced
            reads[metric.name] += 1
        return tracker_result(metric)

    monkeypatch.setattr(type(model._loss_tracker), "result", counted)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=100, seed=0)
    seen = _LogsSeen()
    shardfeed.fit(model, ds, epochs=1, verbose=0, callbacks=[seen],
                  options=FitOptions(steps_per_execution=5))
    assert [sorted(logs) for logs in seen.batch_logs] == [["loss", "mae"]] * 2  # 2 calls
    assert reads["loss"] == 0

    class OwnResults(keras.Sequential):
        calls = 0

        def get_metrics_result(self):
            OwnResults.calls += 1
            return {**super().get_metrics_result(), "custom": 1.0}

    keras.utils.set_random_seed(1)
    own = OwnResults([keras.Input((8,)), layers.Dense(1)])
    own.compile(optimizer="sgd", loss="mse")
    seen = _LogsSeen()
    shardfeed.fit(own, ds, epochs=1, verbose=0, callbacks=[seen],
                  options=FitOptions(steps_per_execution=5))
    assert OwnResults.calls >= 2
    assert [logs["custom"] for logs in seen.batch_logs] == [1.0, 1.0]


def test_progress_bar_shows_steps_metrics_and_samples_per_second(capsys):
    x, y = _data()
    model = _mlp()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=100, seed=0)
    shardfeed.fit(model, ds, epochs=1, verbose=1, options=FitOptions(steps_per_execution=5))
    out = capsys.readouterr().out
    assert "Epoch 1/1" in out
    assert "10/10" in out
    assert "loss:" in out and "mae:" in out and "samples/s:" in out
    # A whole number with thousands separators, not Progbar's `1128627.0000`.
    rates = re.findall(r"samples/s: ([^\s\x08]+)", out)
    assert rates and all(re.fullmatch(r"\d{1,3}(,\d{3})*", r) for r in rates), rates


def test_one_line_per_epoch_formats_samples_per_second_too(capsys):
    x, y = _data()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=100, seed=0)
    shardfeed.fit(_mlp(), ds, epochs=2, verbose=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if "samples/s" in line]
    assert len(lines) == 2
    assert all(re.search(r"samples/s: \d{1,3}(,\d{3})*$", line) for line in lines), lines


def test_model_must_be_compiled():
    x, y = _data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), layers.Dense(1)])
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=100, shuffle=False)
    with pytest.raises(ValueError) as err:
        shardfeed.fit(model, ds)
    assert str(err.value) == (
        "The model must be compiled with an optimizer and a loss first. Received: "
        "model.compiled=False. Call `model.compile(optimizer=..., loss=..., "
        "metrics=[...])` before `shardfeed.fit` or `shardfeed.evaluate`."
    )


def test_a_batch_larger_than_the_data_evaluates_every_row_once():
    # Training one short step is in test_fit_contract.py (as Keras).
    x, y = _data(rows=103)
    model = _mlp()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=104, shuffle=False)
    # Evaluation and prediction pad: every row still counts once.
    np.testing.assert_allclose(
        shardfeed.evaluate(model, ds), model.evaluate(x, y, verbose=0), rtol=1e-5
    )


def test_fit_needs_targets_and_a_dataset():
    x, _ = _data()
    model = _mlp()
    with pytest.raises(TypeError, match=r"Received: type\(dataset\)=ndarray"):
        shardfeed.fit(model, x)
    ds = ShardedResidentDataset(x, per_replica_batch_size=100, shuffle=False)
    with pytest.raises(ValueError, match="Training and evaluation need targets"):
        shardfeed.fit(model, ds)


def test_recompiling_the_model_uses_the_new_optimizer():
    x, y = _data()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=256, shuffle=False)
    model, reference = _mlp("sgd"), _mlp("sgd")
    shardfeed.fit(model, ds, verbose=0)
    reference.fit(x, y, batch_size=256, shuffle=False, verbose=0)
    for m in (model, reference):
        m.compile(optimizer=keras.optimizers.Adam(0.01), loss="mae", metrics=["mse"])
    hist = shardfeed.fit(model, ds, verbose=0)
    ref = reference.fit(x, y, batch_size=256, shuffle=False, verbose=0)
    assert _max_rel_diff(reference, model) < 1e-5
    assert set(hist.history) == {"loss", "mse"}
    np.testing.assert_allclose(hist.history["loss"], ref.history["loss"], rtol=1e-5)


def test_resume_from_a_checkpoint_equals_an_uninterrupted_run(tmp_path):
    """Epoch order is a function of (seed, epoch) and all training state lives
    in the Keras model: save after epoch 2, reload "as after preemption",
    continue with initial_epoch=2, and end exactly where 4 straight epochs end."""
    x, y = _data()
    straight = _mlp("adam")
    shardfeed.fit(
        straight,
        ShardedResidentDataset(x, y, per_replica_batch_size=100, seed=9),
        epochs=4,
        verbose=0,
    )
    first = _mlp("adam")
    shardfeed.fit(
        first,
        ShardedResidentDataset(x, y, per_replica_batch_size=100, seed=9),
        epochs=2,
        verbose=0,
    )
    first.save(tmp_path / "ckpt.keras")
    resumed = keras.models.load_model(tmp_path / "ckpt.keras")
    shardfeed.fit(
        resumed,
        ShardedResidentDataset(x, y, per_replica_batch_size=100, seed=9),
        epochs=4,
        initial_epoch=2,
        verbose=0,
    )
    for a, b in zip(straight.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(resumed.optimizer.iterations.numpy()) == 40


def test_mixed_precision_trains_and_matches_keras():
    x, y = _data()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        reference, model = _mlp("adam"), _mlp("adam")
        reference.fit(x, y, batch_size=256, shuffle=False, verbose=0)
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=256, shuffle=False)
        shardfeed.fit(model, ds, verbose=0, options=FitOptions(jit_compile=False))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    for a, b in zip(reference.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)


def test_numpy_integers_count_everywhere():
    """Counts may be any integer type (np.int64 from arithmetic on shapes)."""
    x, y = _data()
    ds = ShardedResidentDataset(
        x,
        y,
        per_replica_batch_size=np.int64(250),
        seed=np.int64(0),
        load_options=shardfeed.LoadOptions(chunk_bytes=np.int32(4096)),
    )
    model = _mlp()
    options = FitOptions(steps_per_execution=np.int64(2))
    assert type(options.steps_per_execution) is int
    hist = shardfeed.fit(
        model,
        ds,
        epochs=np.int64(2),
        initial_epoch=np.int32(0),
        validation_data=(x[:100], y[:100]),
        validation_freq=np.int64(1),
        verbose=0,
        options=options,
    )
    assert len(hist.history["val_loss"]) == 2
    loss, _ = shardfeed.evaluate(model, x, y, per_replica_batch_size=np.int64(300))
    np.testing.assert_allclose(loss, model.evaluate(x, y, verbose=0)[0], rtol=1e-5)
    assert shardfeed.predict(model, x, per_replica_batch_size=np.uint8(200)).shape == (ROWS, 1)
    plan = shardfeed.plan_shards(np.int64(1001), np.int64(3), np.int64(100))
    assert plan.steps_per_epoch == 4 and type(plan.num_rows) is int


@pytest.mark.parametrize("batch", [0, -3, 2.5, True])
@pytest.mark.parametrize("call", ["evaluate", "predict"])
def test_evaluate_and_predict_refuse_a_non_positive_batch(call, batch):
    x, y = _data()
    model = _mlp()
    with pytest.raises(ValueError) as err:
        if call == "evaluate":
            shardfeed.evaluate(model, x, y, per_replica_batch_size=batch)
        else:
            shardfeed.predict(model, x, per_replica_batch_size=batch)
    assert str(err.value) == (
        "`per_replica_batch_size` must be None (the default batch) or an integer >= 1. "
        f"Received: per_replica_batch_size={batch!r}. Pass e.g. 256, or leave it as None "
        "for 256."
    )


def test_validation_freq_must_be_a_positive_integer_or_a_list():
    x, y = _data()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=100, seed=0)
    for bad in (0, [0, 2]):
        with pytest.raises(ValueError) as err:
            shardfeed.fit(_mlp(), ds, validation_data=(x, y), validation_freq=bad, verbose=0)
        assert str(err.value) == (
            "`validation_freq` must be an integer >= 1 (validate every that many epochs) or a "
            f"list of epochs counted from 1 (as in Keras). Received: validation_freq={bad!r}. "
            "Pass e.g. `validation_freq=1`, or `validation_freq=[1, 5, 10]`."
        )


def _uint8_images(rows=400, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(rows, 4, 4, 3), dtype=np.uint8)
    labels = (images.reshape(rows, -1)[:, :3].argmax(axis=1)).astype("int32")
    return images, labels


def _image_classifier(*first_layers):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4, 4, 3), dtype="uint8" if first_layers else "float32"),
            *first_layers,
            layers.Flatten(),
            layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _scale(x):
    import tensorflow as tf

    return tf.cast(x, "float32") / 255.0


def test_evaluate_and_predict_on_arrays_apply_the_training_transform():
    """Raw uint8 arrays given to evaluate/predict after a fit on a transformed
    uint8 dataset are scaled as in training (transform="auto")."""
    images, labels = _uint8_images()
    ds = ShardedResidentDataset(
        images, labels, per_replica_batch_size=50, shuffle=False, transform=_scale
    )
    model = _image_classifier()
    shardfeed.fit(model, ds, epochs=3, verbose=0)
    scaled = images.astype("float32") / 255.0
    expected = model.evaluate(scaled, labels, verbose=0)
    np.testing.assert_allclose(shardfeed.evaluate(model, images, labels), expected, rtol=1e-5)
    np.testing.assert_allclose(shardfeed.evaluate(model, ds), expected, rtol=1e-5)
    np.testing.assert_allclose(
        shardfeed.predict(model, images), model.predict(scaled, verbose=0), rtol=1e-5, atol=1e-6
    )
    # Explicit choices: None for arrays already in the model's input form, or a function.
    np.testing.assert_allclose(
        shardfeed.evaluate(model, scaled, labels, transform=None), expected, rtol=1e-5
    )
    np.testing.assert_allclose(
        shardfeed.predict(model, images, transform=_scale),
        model.predict(scaled, verbose=0),
        rtol=1e-5,
        atol=1e-6,
    )
    # A model never fit by shardfeed has no transform to remember.
    fresh = _image_classifier()
    np.testing.assert_allclose(
        shardfeed.predict(fresh, scaled), fresh.predict(scaled, verbose=0), rtol=1e-5, atol=1e-6
    )


def test_a_transform_next_to_a_dataset_is_refused():
    images, labels = _uint8_images()
    ds = ShardedResidentDataset(
        images, labels, per_replica_batch_size=50, shuffle=False, transform=_scale
    )
    model = _image_classifier()
    for call in (
        lambda: shardfeed.evaluate(model, ds, transform=_scale),
        lambda: shardfeed.predict(model, ds, transform=None),
    ):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value).startswith(
            "`transform` applies to arrays; a `ShardedResidentDataset` applies the "
            "`transform` it was built with. Received: transform="
        )
        assert str(err.value).endswith(
            "with a ShardedResidentDataset. Leave `transform` out, or build the dataset "
            "with the transform."
        )


def test_a_model_with_its_own_rescaling_needs_no_transform():
    """docs/data.md: a `Rescaling` layer inside the model ships the scaling
    with the saved model; uint8 stays uint8 on the device either way."""
    images, labels = _uint8_images()
    ds = ShardedResidentDataset(images, labels, per_replica_batch_size=50, shuffle=False)
    model = _image_classifier(layers.Rescaling(1 / 255))
    shardfeed.fit(model, ds, epochs=2, verbose=0)
    np.testing.assert_allclose(
        shardfeed.evaluate(model, images, labels),
        model.evaluate(images, labels, verbose=0),
        rtol=1e-5,
    )


def _fit_gathering(per_call: bool, augment=None, class_weight=None, rows=ROWS, steps=3):
    """Two epochs under XLA on one replica, the call's rows gathered at once
    (`per_call`, the default) or step by step inside XLA (the former path)."""
    from shardfeed._tf.compiled import loop_for

    x, y = _data(rows)
    if class_weight is not None:
        y = (y > 0).astype("int32")
    model = _mlp("adam")
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=100, seed=3, augment=augment)
    options = FitOptions(jit_compile=True, steps_per_execution=steps)
    loop = loop_for(model, ds, options)
    assert loop.gathers_per_call
    if not per_call:
        loop.gathers_per_call = False
    hist = shardfeed.fit(
        model, ds, epochs=2, verbose=0, options=options, class_weight=class_weight
    )
    return model.get_weights(), hist.history


def _jitter(x, seed):
    return x + 0.01 * tf.random.stateless_normal(tf.shape(x), seed)


# CI time: "plain" and "augment" dropped; "class_weight" is the plain path with
# weights, and the last two gather an augmented call in pieces.
@pytest.mark.parametrize("case", ["class_weight", "one_step_per_gather", "pieces_of_3_steps"])
def test_gathering_a_calls_rows_at_once_changes_no_bit(case, monkeypatch):
    # 1050 rows, batch 100: 10 full steps and a partial one, calls of 3 steps
    # (the last full call has 1), each gathered in pieces of one step, the
    # next piece while XLA trains on this one; shuffled, so every step reads
    # scattered rows.
    kwargs: dict = {"rows": 1050}
    if case == "pieces_of_3_steps":
        kwargs["steps"] = 10  # one call of 10 steps: pieces of 3, 3, 3 and 1 steps
        kwargs["augment"] = _jitter
        from shardfeed._tf import calls

        monkeypatch.setattr(calls, "GATHER_PIECES", 4)
    if case in ("augment", "one_step_per_gather"):
        kwargs["augment"] = _jitter  # seeded per step: the steps' offsets must agree
    if case == "class_weight":
        kwargs["class_weight"] = {0: 0.5, 1: 2.0}
    if case == "one_step_per_gather":
        # A buffer of one step's rows: each call gathers step by step, in pieces.
        from shardfeed._data import memory

        monkeypatch.setattr(memory, "CALL_ROWS_BYTES", 100 * 9 * 4)
    new_weights, new_history = _fit_gathering(True, **kwargs)
    old_weights, old_history = _fit_gathering(False, **kwargs)
    for a, b in zip(new_weights, old_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert new_history == old_history


@pytest.mark.parametrize(
    ("row_budget_steps", "unordered"),
    [
        (None, 2),  # room for a whole call: pieces 0 and 1 gathered at once, then one by one
        (1, 1),  # room for one step: each piece gathered after the steps before it
    ],
)
def test_a_calls_pieces_hold_at_most_the_counted_rows(row_budget_steps, unordered, monkeypatch):
    # A piece's gather waits (control input) for the steps two pieces back
    # (one back with room for one step only): without that, TensorFlow may
    # run every gather of the call at once, holding more rows than counted.
    from shardfeed._data import memory
    from shardfeed._tf import calls as calls_module
    from shardfeed._tf.compiled import loop_for

    # Four pieces per call (the default is one: then only a budget below a
    # call's rows cuts it, as in the second case).
    monkeypatch.setattr(calls_module, "GATHER_PIECES", 4)
    if row_budget_steps is not None:
        monkeypatch.setattr(memory, "CALL_ROWS_BYTES", 100 * 9 * 4 * row_budget_steps)
    x, y = _data(1050)
    model = _mlp("adam")
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=100, seed=3)
    options = FitOptions(jit_compile=True, steps_per_execution=8)
    shardfeed.fit(model, ds, epochs=1, verbose=0, options=options)
    traced = loop_for(model, ds, options).traces.call("train", "gathered")
    graph = traced._list_all_concrete_functions()[0].graph
    gathers = [op for op in graph.get_operations() if op.type == "ResourceGather"]
    calls = [op for op in graph.get_operations() if op.type == "StatefulPartitionedCall"]

    def last_call_before(op) -> int:
        """The latest piece's steps `op` waits for (data or control), -1: none."""
        seen, todo = set(), [op]
        while todo:
            node = todo.pop()
            for up in [t.op for t in node.inputs] + list(node.control_inputs):
                if up.name not in seen:
                    seen.add(up.name)
                    todo.append(up)
        return max((i for i, call in enumerate(calls) if call.name in seen), default=-1)

    columns = 2  # x and y
    assert len(gathers) == columns * len(calls) and len(calls) > unordered
    waits = [last_call_before(op) for op in gathers]
    assert waits == [max(-1, p - unordered) for p in range(len(calls)) for _ in range(columns)]


@pytest.mark.parametrize(
    ("steps", "steps_per_gather", "count", "pieces"),
    [
        (118, 992, 1, [(0, 118)]),  # W2's calls, by default: the call's rows at once
        (118, 992, 4, [(0, 30), (30, 60), (60, 90), (90, 118)]),
        (3, 992, 4, [(0, 1), (1, 2), (2, 3)]),  # fewer steps than pieces: one each
        (1, 992, 4, [(0, 1)]),
        (10, 4, 1, [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]),  # two pieces fit 4 steps
        (5, 1, 1, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]),  # one step fits: one at a time
    ],
)
def test_a_calls_gather_pieces_cover_its_steps_and_two_fit_the_counted_rows(
    steps, steps_per_gather, count, pieces
):
    from shardfeed._tf.calls import gather_pieces

    assert gather_pieces(steps, steps_per_gather, count) == pieces


def test_a_fit_converts_no_code_with_autograph(monkeypatch):
    # As Keras compiles its steps (`do_not_convert`): converting the loop's
    # 31 functions cost the first `fit` of a process 1.9 s.
    from tensorflow.python.autograph.pyct import transpiler

    converted = []
    transform = transpiler.PyToPy.transform_function

    def counted(self, fn, *args, **kwargs):
        converted.append(getattr(fn, "__qualname__", repr(fn)))
        return transform(self, fn, *args, **kwargs)

    monkeypatch.setattr(transpiler.PyToPy, "transform_function", counted)
    x, y = _data(1100)
    ds = ShardedResidentDataset(x[:1000], y[:1000], per_replica_batch_size=96, seed=0)
    val = ShardedResidentDataset(x[1000:], y[1000:], per_replica_batch_size=32, shuffle=False)
    for jit_compile in (False, True):
        model = _mlp("adam")
        options = FitOptions(jit_compile=jit_compile, steps_per_execution=4)
        shardfeed.fit(model, ds, epochs=1, validation_data=val, verbose=0, options=options)
        shardfeed.predict(model, val, options=options)
    assert converted == []


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_partial_last_step_runs_eagerly_in_a_loops_first_epochs(monkeypatch, jit_compile):
    # Its trace cost about 8 eager steps: a search's fits of 1-3 epochs
    # traced it for 1-3 steps (`Traces._eager_first`). Eager or traced,
    # the same bits as Keras' traced partial step.
    from shardfeed._tf.loop import Loop
    from shardfeed._tf.traces import EAGER_PARTIAL_CALLS

    runs = {"train": [], "test": []}
    partial = Loop._partial

    def recorded(self, mode, *args, **kwargs):
        runs[mode].append("eager" if tf.executing_eagerly() else "traced")
        return partial(self, mode, *args, **kwargs)

    monkeypatch.setattr(Loop, "_partial", recorded)
    x, y = _data()
    epochs = EAGER_PARTIAL_CALLS + 2
    reference, model = _mlp("adam"), _mlp("adam")
    want = reference.fit(x, y, batch_size=256, shuffle=False, epochs=epochs, verbose=0,
                         validation_data=(x[:300], y[:300]))
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=256, shuffle=False)
    val = ShardedResidentDataset(x[:300], y[:300], per_replica_batch_size=256, shuffle=False)
    got = shardfeed.fit(model, ds, epochs=epochs, verbose=0, validation_data=val,
                        options=FitOptions(jit_compile=jit_compile))
    # Traced once (the 4th epoch), then the trace runs.
    assert runs["train"] == runs["test"] == ["eager"] * EAGER_PARTIAL_CALLS + ["traced"]
    if jit_compile:
        assert _max_rel_diff(reference, model) < 1e-5
    else:
        assert _max_rel_diff(reference, model) == 0.0
    for key in ("loss", "val_loss", "mae", "val_mae"):
        np.testing.assert_allclose(got.history[key], want.history[key], rtol=1e-5)


def test_fit_warns_as_keras_when_the_data_runs_out_at_the_users_call():
    x = np.random.default_rng(0).random((64, 4), dtype=np.float32)
    dataset = ShardedResidentDataset(x, x[:, :1], per_replica_batch_size=16, shuffle=False)
    model = keras.Sequential([keras.Input((4,)), layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.warns(UserWarning, match="Your input ran out of data") as caught:
        shardfeed.fit(model, dataset, epochs=2, steps_per_epoch=10, verbose=0)
    # As Keras: once per epoch, each at this call (was at `_tf/training.py`,
    # which runs the epochs).
    assert [w.filename for w in caught] == [__file__, __file__]


@pytest.mark.parametrize(
    ("layer", "shape"),
    [
        (layers.Conv1DTranspose(2, 3), (8, 1)),
        (layers.Conv3DTranspose(2, 3), (4, 4, 4, 1)),
        (layers.DepthwiseConv1D(3), (8, 1)),
        (layers.SeparableConv1D(2, 3), (8, 1)),
        (layers.Conv2D(2, 3), (6, 6, 1)),
    ],
)
def test_auto_jit_compile_is_off_on_cpu_for_every_convolution(layer, shape):
    # One list of convolutions for both backends (`_training/options.has_convolution`):
    # TensorFlow's own list missed the 1-D and 3-D transposed, depthwise and
    # separable ones, and turned XLA on for them on CPUs.
    from shardfeed._tf.loop import resolve_jit_compile

    model = keras.Sequential([keras.Input(shape), layer])
    assert resolve_jit_compile("auto", model) is False
    assert resolve_jit_compile("auto", keras.Sequential([keras.Input((4,)), layers.Dense(2)]))
