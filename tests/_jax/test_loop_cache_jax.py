"""The JAX loop's compiled calls kept across `fit`/`evaluate`/`predict` calls,
and let go of with their model; datasets never held."""

from __future__ import annotations

import gc
import weakref

import jax
import keras
import numpy as np
from _helpers_fit import mlp, regression_data, replicas

from shardfeed import FitOptions, ShardedResidentDataset, evaluate, fit, predict


class _Counted(keras.layers.Dense):
    """A Dense layer counting its traces (its `call` runs only when traced)."""

    traces = 0

    def call(self, inputs):
        type(self).traces += 1
        return super().call(inputs)


def _counted_model(**compile_kwargs) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), _Counted(4), keras.layers.Dense(1)])
    compile_kwargs.setdefault("optimizer", "adam")
    compile_kwargs.setdefault("loss", "mse")
    model.compile(**compile_kwargs)
    return model


def _traces_of(run) -> int:
    before = _Counted.traces
    run()
    return _Counted.traces - before


def test_repeated_calls_on_the_same_model_compile_nothing_again():
    x, y = regression_data(115)  # batch 2 * 5: 11 full steps and a partial one
    model = _counted_model(steps_per_execution=4)
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=5, seed=0)
        assert _traces_of(lambda: fit(model, ds, epochs=1, verbose=0)) > 0
        assert _traces_of(lambda: fit(model, ds, epochs=2, verbose=0)) == 0
        # Another dataset whose batches trace alike (shapes, structure, mesh).
        other = ShardedResidentDataset(x + 1, y, per_replica_batch_size=5, seed=1)
        assert _traces_of(lambda: fit(model, other, epochs=1, verbose=0)) == 0
        # Arrays: a new dataset per call, the same traces.
        assert _traces_of(lambda: evaluate(model, x, y, per_replica_batch_size=5)) > 0
        assert _traces_of(lambda: evaluate(model, x, y, per_replica_batch_size=5)) == 0
        assert _traces_of(lambda: predict(model, x, per_replica_batch_size=5)) > 0
        assert _traces_of(lambda: predict(model, x, per_replica_batch_size=5)) == 0
        # Other shapes are other traces.
        assert _traces_of(lambda: evaluate(model, x, y, per_replica_batch_size=3)) > 0


def test_a_recompiled_model_runs_its_new_loss_and_optimizer():
    x, y = regression_data(100)
    model = _counted_model(metrics=["mae"])
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=10, shuffle=False)
        fit(model, ds, epochs=1, verbose=0)
        mse = evaluate(model, ds, return_dict=True)
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mae", metrics=["mse"])
        logs = evaluate(model, ds, return_dict=True)
        expected = model.evaluate(x, y, batch_size=20, verbose=0, return_dict=True)
        assert abs(logs["loss"] - expected["loss"]) < 1e-5
        assert abs(logs["loss"] - mse["mae"]) < 1e-5 and abs(logs["mse"] - mse["loss"]) < 1e-5
        # The new optimizer (learning rate 0) runs: the weights stay.
        weights = model.get_weights()
        fit(model, ds, epochs=1, verbose=0)
        assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights(), strict=True))


def _live_bytes() -> int:
    gc.collect()
    return sum(a.nbytes for a in jax.live_arrays())


def test_a_dropped_dataset_frees_its_device_arrays_while_its_model_lives():
    x, y = regression_data(4000, features=64)
    model = mlp(features=64)
    with replicas(2):
        # Warms JAX's own arrays (e.g. the dataset's first epoch number).
        ShardedResidentDataset(x[:8], y[:8], per_replica_batch_size=2, shuffle=False)
        before = _live_bytes()
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, seed=0)
        fit(model, ds, epochs=1, verbose=0)
        evaluate(model, x, y, per_replica_batch_size=16)
        assert _live_bytes() > before + x.nbytes
        del ds
        # The model's weights and optimizer state stay; no rows do.
        assert _live_bytes() < before + x.nbytes // 4


def test_a_dropped_model_frees_its_weights_and_traces():
    x, y = regression_data(200)
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=10, seed=0)
        # The dataset keeps a closed epoch's copy for its next epoch (its own
        # memory, counted by its memory check): in the baseline too.
        ds.epoch(0).close()
        before = _live_bytes()
        model = mlp()
        fit(model, ds, epochs=1, verbose=0)
        evaluate(model, ds)
        predict(model, ds)
        dead = weakref.ref(model)
        del model
        gc.collect()
        assert dead() is None
        assert _live_bytes() <= before


def _lowered_train_call(model: keras.Model, ds: ShardedResidentDataset, k: int) -> str:
    from shardfeed._jax.compiled import loop_for

    loop = loop_for(model, ds.world, FitOptions(steps_per_execution=k))
    epoch = ds.epoch(0)
    loop.build(epoch, "train")
    fn = loop._compiled("train", False)
    return fn.lower(loop.state("train"), epoch.arrays, np.int32(0), epoch.batch_fn, k).as_text()


def _small_cnn() -> keras.Model:
    keras.utils.set_random_seed(0)
    cnn = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(2, 3),
                            keras.layers.Flatten(), keras.layers.Dense(1)])
    cnn.compile(optimizer="sgd", loss="mse")
    return cnn


def _images(rows: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).normal(size=(rows, 6, 6, 1)).astype("float32")
    return x, x.reshape(rows, -1).sum(axis=1, keepdims=True)


def test_a_one_step_call_has_no_loop_in_its_program():
    # JAX lowers even a length-1 `lax.scan(unroll=True)` to a `while` loop,
    # inside which XLA:CPU's convolutions run 5-8x slower.
    x, y = _images(40)
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=0)
        assert "while" not in _lowered_train_call(_small_cnn(), ds, 1)
        dense = ShardedResidentDataset(x.reshape(40, -1)[:, :8], y, per_replica_batch_size=4,
                                       seed=0)
        assert "while" not in _lowered_train_call(mlp(), dense, 1)
        assert "while" in _lowered_train_call(mlp(), dense, 2)  # a rolled scan: MLPs keep it


def test_a_convolution_on_cpu_runs_up_to_8_steps_per_call_unrolled_by_default():
    from shardfeed._jax.compiled import loop_for

    x, y = _images(640)  # batch 2 * 4: 80 steps
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=0)
        # XLA:CPU's convolutions inside a `while` loop are several times slower.
        assert "while" not in _lowered_train_call(_small_cnn(), ds, 3)
        history = fit(cnn := _small_cnn(), ds, epochs=1, verbose=0)
        assert history.params["steps_per_execution"] == 8
        # About ten calls per epoch, at most 8 steps each (measured on the
        # keras-io convnets, docs/performance.md); an MLP keeps ten calls.
        conv_loop = loop_for(cnn, ds.world, FitOptions())
        mlp_loop = loop_for(mlp(), ds.world, FitOptions())
        assert [conv_loop.steps_per_call(n) for n in (5, 30, 80, 4000)] == [1, 3, 8, 8]
        assert [mlp_loop.steps_per_call(n) for n in (5, 30, 80, 4000)] == [1, 3, 8, 400]
        dense = ShardedResidentDataset(x.reshape(640, -1)[:, :8], y, per_replica_batch_size=4,
                                       seed=0)
        assert "while" in _lowered_train_call(mlp(), dense, 3)


# --- models of one architecture share compiled calls (KerasTuner's trials) ---


def _shared_traces(model: keras.Model) -> int:
    from shardfeed._jax import loop as _loop

    key = _loop.architecture_key(model)
    assert key is not None
    return sum(s.traces for k, s in _loop._SHARED.items() if k[0] == key)


def test_a_new_model_of_one_architecture_compiles_nothing(monkeypatch):
    from shardfeed._jax import loop as _loop

    x, y = regression_data(203)  # 6 full steps of 32 and a partial one
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
    first = mlp(seed=1, optimizer=keras.optimizers.Adam(1e-2))
    fit(first, ds, epochs=1, verbose=0, validation_data=(x[:50], y[:50]))
    traced = _shared_traces(first)
    assert traced > 0
    # Other initial weights, another learning rate (optimizer state): no trace.
    second = mlp(seed=2, optimizer=keras.optimizers.Adam(3e-3))
    history = fit(second, ds, epochs=2, verbose=0, validation_data=(x[:50], y[:50]))
    assert _shared_traces(second) == traced
    # ...and the same numbers as the model tracing its own calls.
    monkeypatch.setattr(_loop, "architecture_key", lambda model: None)
    alone = mlp(seed=2, optimizer=keras.optimizers.Adam(3e-3))
    expected = fit(alone, ds, epochs=2, verbose=0, validation_data=(x[:50], y[:50]))
    for a, b in zip(second.get_weights(), alone.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for name in expected.history:
        np.testing.assert_allclose(history.history[name], expected.history[name], rtol=1e-6)


def test_what_shares_and_what_does_not():
    from shardfeed._jax import loop as _loop

    def key(**compile_kwargs):
        return _loop.architecture_key(mlp(**compile_kwargs))

    assert key() == key()  # layer names differ, the key does not
    assert key(optimizer=keras.optimizers.Adam(1e-2)) == key(
        optimizer=keras.optimizers.Adam(5e-3)
    )  # a float learning rate is optimizer state
    assert key(optimizer=keras.optimizers.Adam(1e-2, beta_1=0.8)) != key(
        optimizer=keras.optimizers.Adam(1e-2)
    )  # a constant of the step
    assert key(loss="mae") != key(loss="mse")

    def scaled(alpha):
        def loss(y_true, y_pred):
            return alpha * keras.ops.mean(keras.ops.square(y_true - y_pred))

        return loss

    # User code (a loss closing over a number, a layer, a subclass): never shared.
    assert key(loss=scaled(1.0)) is None
    assert _loop.architecture_key(_counted_model()) is None

    class Mine(keras.Sequential):
        pass

    model = Mine([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    assert _loop.architecture_key(model) is None


def test_several_outputs_keep_their_own_log_names():
    x, y = regression_data(128)

    def two_outputs(names):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(4)(inputs)
        outputs = [keras.layers.Dense(1, name=n)(hidden) for n in names]
        model = keras.Model(inputs, outputs)
        model.compile(optimizer="adam", loss=["mse", "mse"])
        return model

    ds = ShardedResidentDataset(x, (y, y), per_replica_batch_size=32, seed=0)
    first = fit(two_outputs(["a", "b"]), ds, epochs=1, verbose=0)
    second = fit(two_outputs(["c", "d"]), ds, epochs=1, verbose=0)
    assert {"a_loss", "b_loss"} <= set(first.history)
    assert {"c_loss", "d_loss"} <= set(second.history)


def test_a_shared_call_traced_outside_run_reads_a_live_model():
    """The first model of an architecture is gone; a second one's call,
    lowered outside `run` (as the program checks above do), traces with the
    second model, not with the loop that made the call first."""
    x, y = regression_data(40)
    with replicas(2):
        dense = ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=0)
        first = mlp()
        _lowered_train_call(first, dense, 1)
        del first
        gc.collect()
        # Other rows: the call traces again (its arrays' shapes differ).
        other = ShardedResidentDataset(x[:24], y[:24], per_replica_batch_size=4, seed=0)
        assert "while" not in _lowered_train_call(mlp(), other, 1)


def test_model_cache_keeps_a_models_entries_for_its_current_compile():
    from shardfeed._training.loop_cache import ModelCache

    class Part:  # an optimizer, a compiled loss
        pass

    class Model:  # what the cache reads of a model: its compiled parts
        def __init__(self):
            self.optimizer, self._compile_loss = Part(), Part()

    cache: ModelCache[dict[str, str]] = ModelCache(dict)
    model = Model()
    cache.of(model)["k"] = "loop"
    assert cache.of(model) == {"k": "loop"}  # the same compile: kept
    model.optimizer = Part()  # a recompile replaces the optimizer
    assert cache.of(model) == {}
    dead = weakref.ref(model)
    del model
    gc.collect()
    assert dead() is None  # the cache never holds a model
