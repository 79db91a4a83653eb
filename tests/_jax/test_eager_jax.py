"""`FitOptions(jit_compile=False)` and `compile(run_eagerly=True)` on JAX: the
steps run un-jitted, one after another from Python, as Keras' JAX trainer
runs them (for debugging), with the compiled loop's results."""

from __future__ import annotations

import jax
import keras
import numpy as np
from _helpers_fit import assert_history_close, max_weight_diff, regression_data, replicas

from shardfeed import FitOptions, ShardedResidentDataset, evaluate, fit, predict


class _Seen(keras.layers.Layer):
    """Records whether each training call saw concrete arrays (un-jitted) or
    tracers (inside `jax.jit`)."""

    def __init__(self) -> None:
        super().__init__()
        self.concrete: list[bool] = []

    def call(self, x, training=False):
        if training:
            self.concrete.append(not isinstance(x, jax.core.Tracer))
        return x


def _model(run_eagerly: bool = False) -> tuple[keras.Model, _Seen]:
    keras.utils.set_random_seed(2)
    seen = _Seen()
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(seen(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(keras.optimizers.Adam(1e-2), "mse", metrics=["mae"], run_eagerly=run_eagerly)
    return model, seen


def test_jit_compile_false_on_2_replicas_equals_the_compiled_loop():
    x, y = regression_data(203)  # global batch 16: 12 full steps and a partial one of 11 rows
    options = FitOptions(jit_compile=False, steps_per_execution=5)
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False)
        ours, seen = _model()
        history = fit(ours, ds, epochs=1, verbose=0, options=options)
        scores = evaluate(ours, x, y, per_replica_batch_size=8, options=options)
        outputs = predict(ours, x, per_replica_batch_size=8, options=options)
        compiled = ShardedResidentDataset(x, y, per_replica_batch_size=8, shuffle=False)
        theirs, _ = _model()
        expected = fit(theirs, compiled, epochs=1, verbose=0,
                       options=FitOptions(steps_per_execution=5))
    assert seen.concrete == [True] * 13  # every training step ran on concrete arrays
    assert history.params["jit_compile"] is False
    assert max_weight_diff(ours, theirs) < 1e-5
    assert_history_close(history.history, expected.history)
    np.testing.assert_allclose(scores, theirs.evaluate(x, y, batch_size=16, verbose=0),
                               rtol=1e-5)
    np.testing.assert_allclose(outputs, theirs.predict(x, batch_size=16, verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_run_eagerly_equals_keras_fit():
    x, y = regression_data(100)  # batch 16: 6 full steps and a partial one of 4 rows
    with replicas(1):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, shuffle=False)
        ours, seen = _model(run_eagerly=True)
        history = fit(ours, ds, epochs=1, verbose=0, options=FitOptions(steps_per_execution=1))
    # Keras' compiled fit as the bar (its eager fit gives the same numbers, slower).
    theirs, _ = _model()
    expected = theirs.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert seen.concrete == [True] * 7
    assert max_weight_diff(ours, theirs) < 1e-5
    assert_history_close(history.history, expected.history)
