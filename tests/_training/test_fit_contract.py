"""Keras' `fit` contract under `shardfeed.fit`: each case against real `model.fit`.

Issue 15's items 4-7, 9 and 10: the epoch when `steps_per_epoch` is not one
pass, the batch hooks' step counter, `compile(steps_per_execution=k)`,
`stop_evaluating` and Keras' debugging caps, the user's `BackupAndRestore`,
and the edge cases where Keras trains a short batch or no epoch at all.
Models are seeded identically; SGD on a linear model keeps the weights
comparable to a tight tolerance.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
from _helpers import mirrored_strategy

import shardfeed
from shardfeed import FitOptions, ShardedResidentDataset

RAN_OUT = "Your input ran out of data; interrupting training."


def _data(rows=100, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype("float32")
    y = (x @ rng.normal(size=(4, 1))).astype("float32")
    return x, y


def _model(steps_per_execution=1, metrics=("mae",)):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss="mse",
        metrics=list(metrics),
        steps_per_execution=steps_per_execution,
    )
    return model


class Events(keras.callbacks.Callback):
    """Every epoch and batch hook with its index, in order."""

    def __init__(self):
        super().__init__()
        self.events = []

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(("epoch", epoch))

    def on_train_batch_begin(self, batch, logs=None):
        self.events.append(("begin", batch))

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("end", batch))

    def on_test_batch_begin(self, batch, logs=None):
        self.events.append(("test_begin", batch))

    def on_test_batch_end(self, batch, logs=None):
        self.events.append(("test_end", batch))


class StepCount(keras.callbacks.Callback):
    """Keras 3.15.1's `trainer_test.StepCount`, unchanged: its step counter check."""

    def __init__(self, steps_per_execution=1):
        super().__init__()
        self.begin_count = 0
        self.end_count = 0
        self.steps_per_execution = steps_per_execution

    def on_epoch_begin(self, epoch, logs=None):
        self.begin_count = 0
        self.end_count = 0

    def on_batch_begin(self, batch, logs=None):
        if batch != self.begin_count * self.steps_per_execution:
            raise ValueError("Batch index is not correct")
        self.begin_count += 1

    def on_batch_end(self, batch, logs=None):
        self.end_count += 1
        if batch != self.end_count * self.steps_per_execution - 1:
            raise ValueError("Batch index is not correct")


def _keras_fit(model, x, y, batch, **kwargs):
    return model.fit(x, y, batch_size=batch, shuffle=False, verbose=0, **kwargs)


def _ours(model, x, y, batch, options=None, **kwargs):
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=batch, shuffle=False)
    options = options or FitOptions(jit_compile=False)
    return shardfeed.fit(model, ds, verbose=0, options=options, **kwargs)


def _ran_out(caught):
    return sum(str(w.message).startswith(RAN_OUT) for w in caught)


def _steps_per_epoch(events):
    counts = []
    for kind, _ in events:
        if kind == "epoch":
            counts.append(0)
        elif kind == "end":
            counts[-1] += 1
    return counts


def _assert_same_weights(a, b, rtol=1e-5):
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(wa, wb, rtol=rtol, atol=1e-6)


# -- item 4: steps_per_epoch other than one pass ---------------------------


@pytest.mark.parametrize(
    ("steps_per_epoch", "epochs", "steps_run", "warnings_expected"),
    [
        (20, 2, [7, 7], 2),  # longer than the data: each epoch is one pass, warned
        (5, 3, [5, 2, 5], 1),  # shorter, not dividing: the pass's rest, then a new pass
        (7, 2, [7, 7], 0),  # exactly one pass: no warning
    ],
)
def test_steps_per_epoch_ends_the_epoch_when_the_data_runs_out(
    steps_per_epoch, epochs, steps_run, warnings_expected
):
    """100 rows in batches of 16 are 7 steps: Keras ends an epoch when the
    pass over the data runs out, warns, and starts the next epoch on a new
    pass; the weights, losses and hooks match."""
    x, y = _data()
    theirs, ours = _model(), _model()
    seen = {}
    for name, model, fit in (("keras", theirs, _keras_fit), ("shardfeed", ours, _ours)):
        events = Events()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hist = fit(
                model, x, y, 16, epochs=epochs, steps_per_epoch=steps_per_epoch,
                callbacks=[events],
            )
        seen[name] = (events.events, _ran_out(caught), hist)
    (k_events, k_warned, k_hist), (s_events, s_warned, s_hist) = seen["keras"], seen["shardfeed"]
    assert s_events == k_events
    assert _steps_per_epoch(s_events) == steps_run
    assert s_warned == k_warned == warnings_expected
    assert s_hist.params["steps"] == k_hist.params["steps"] == steps_per_epoch
    np.testing.assert_allclose(s_hist.history["loss"], k_hist.history["loss"], rtol=1e-5)
    _assert_same_weights(theirs, ours)


# -- item 5: the batch hooks' step counter -----------------------------------


def test_batch_hooks_count_steps_as_keras_with_a_partial_last_call():
    """100 rows, batch 16, 3 steps per call: 7 steps, calls end at Keras'
    counter 2, 5, 8 (Keras' `StepCount` check passes), in fit, its
    validation and evaluate."""
    x, y = _data()
    theirs, ours = _model(steps_per_execution=3), _model()
    k_events, s_events = Events(), Events()
    _keras_fit(theirs, x, y, 16, callbacks=[k_events, StepCount(3)], validation_data=(x, y))
    options = FitOptions(steps_per_execution=3, jit_compile=False)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, shuffle=False)
    shardfeed.fit(
        ours, ds, verbose=0, options=options, callbacks=[s_events, StepCount(3)],
        validation_data=ds,
    )
    assert s_events.events == k_events.events
    assert [e for e in s_events.events if e[0] == "end"] == [("end", 2), ("end", 5), ("end", 8)]
    k_eval, s_eval = Events(), Events()
    theirs.evaluate(x, y, batch_size=16, verbose=0, callbacks=[k_eval])
    shardfeed.evaluate(ours, ds, callbacks=[s_eval], options=options)
    assert s_eval.events == k_eval.events == [
        ("test_begin", 0), ("test_end", 2), ("test_begin", 3), ("test_end", 5),
        ("test_begin", 6), ("test_end", 8),
    ]
    _assert_same_weights(theirs, ours)


# -- item 6: compile(steps_per_execution=k) ---------------------------------


def test_compiled_steps_per_execution_sets_the_steps_per_call():
    x, y = _data()
    theirs, ours = _model(steps_per_execution=3), _model(steps_per_execution=3)
    k_events, s_events = Events(), Events()
    _keras_fit(theirs, x, y, 16, callbacks=[k_events])
    hist = _ours(ours, x, y, 16, callbacks=[s_events])  # FitOptions' default "auto"
    assert s_events.events == k_events.events
    assert hist.params["steps_per_execution"] == 3
    # An explicit equal value is fine; a different one is refused.
    _ours(ours, x, y, 16, options=FitOptions(steps_per_execution=3, jit_compile=False))
    with pytest.raises(ValueError) as err:
        _ours(ours, x, y, 16, options=FitOptions(steps_per_execution=4))
    assert str(err.value) == (
        "`FitOptions.steps_per_execution` and the model's compiled `steps_per_execution` "
        "must agree (both set the steps per compiled call). Received: "
        "FitOptions.steps_per_execution=4, model.compile(steps_per_execution=3). Set one of "
        'them: leave `FitOptions.steps_per_execution` as "auto" to use the model\'s, or '
        "compile the model with `steps_per_execution=1`."
    )


# -- item 7: stop_evaluating and Keras' debugging caps ---------------------


class StopEvaluating(keras.callbacks.Callback):
    def on_test_batch_end(self, batch, logs=None):
        if batch >= 1:
            self.model.stop_evaluating = True


def test_evaluate_stops_when_a_callback_sets_stop_evaluating():
    x, y = _data()
    theirs, ours = _model(), _model()
    k_events, s_events = Events(), Events()
    expected = theirs.evaluate(
        x, y, batch_size=16, verbose=0, callbacks=[k_events, StopEvaluating()], return_dict=True
    )
    got = shardfeed.evaluate(
        ours, x, y, per_replica_batch_size=16, callbacks=[s_events, StopEvaluating()],
        return_dict=True, options=FitOptions(steps_per_execution=1),
    )
    assert s_events.events == k_events.events == [
        ("test_begin", 0), ("test_end", 0), ("test_begin", 1), ("test_end", 1),
    ]
    assert got.keys() == expected.keys()
    np.testing.assert_allclose(list(got.values()), list(expected.values()), rtol=1e-5)
    assert ours.stop_evaluating and theirs.stop_evaluating
    # The next evaluate resets it, as Keras' does: all 7 steps run.
    again = Events()
    shardfeed.evaluate(ours, x, y, per_replica_batch_size=16, callbacks=[again],
                       options=FitOptions(steps_per_execution=1))
    assert [e for e in again.events if e[0] == "test_end"][-1] == ("test_end", 6)


@pytest.fixture
def keras_caps():
    yield keras.config
    keras.config.set_max_epochs(None)
    keras.config.set_max_steps_per_epoch(None)


def test_max_epochs_and_max_steps_per_epoch_cap_fit_and_evaluate(keras_caps):
    x, y = _data()
    keras_caps.set_max_epochs(2)
    keras_caps.set_max_steps_per_epoch(3)
    theirs, ours = _model(), _model()
    k_events, s_events = Events(), Events()
    with pytest.warns(UserWarning) as k_caught:
        k_hist = _keras_fit(theirs, x, y, 16, epochs=5, callbacks=[k_events])
    with pytest.warns(UserWarning) as s_caught:
        s_hist = _ours(ours, x, y, 16, epochs=5, callbacks=[s_events])
    assert s_events.events == k_events.events
    assert len(s_hist.history["loss"]) == len(k_hist.history["loss"]) == 2
    messages = {str(w.message) for w in s_caught}
    assert messages == {str(w.message) for w in k_caught} == {
        "Limiting epochs to 2", "Limiting steps_per_epoch to 3",
    }
    _assert_same_weights(theirs, ours)
    with pytest.warns(UserWarning, match="Limiting steps_per_epoch to 3"):
        expected = theirs.evaluate(x, y, batch_size=16, verbose=0)
    with pytest.warns(UserWarning, match="Limiting steps_per_epoch to 3"):
        got = shardfeed.evaluate(ours, x, y, per_replica_batch_size=16)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    with pytest.warns(UserWarning, match="Limiting steps_per_epoch to 3"):
        expected = theirs.predict(x, batch_size=16, verbose=0)
    with pytest.warns(UserWarning, match="Limiting steps_per_epoch to 3"):
        got = shardfeed.predict(ours, x, per_replica_batch_size=16)
    assert got.shape == expected.shape == (48, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


# -- item 9: the user's BackupAndRestore ------------------------------------


def test_the_users_backup_and_restore_is_the_one_that_changes(tmp_path):
    """After fit the user's object holds what Keras' own run leaves in it."""
    x, y = _data()
    theirs, ours = _model(), _model()
    k_backup = keras.callbacks.BackupAndRestore(str(tmp_path / "k"), save_freq=3)
    s_backup = keras.callbacks.BackupAndRestore(str(tmp_path / "s"), save_freq=3)
    _keras_fit(theirs, x, y, 16, epochs=2, callbacks=[k_backup])
    _ours(ours, x, y, 16, epochs=2, callbacks=[s_backup])
    assert s_backup.model is ours
    assert s_backup.params["epochs"] == 2
    for name in ("_current_epoch", "_last_batch_seen"):
        assert getattr(s_backup, name) == getattr(k_backup, name), name


def test_a_backup_and_restore_subclass_is_refused(tmp_path):
    class Mine(keras.callbacks.BackupAndRestore):
        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)

    x, y = _data()
    with pytest.raises(TypeError) as err:
        _ours(_model(), x, y, 16, callbacks=[Mine(str(tmp_path))])
    assert str(err.value) == (
        "`shardfeed.fit` backs up mid-epoch and on every rank itself, driving a "
        "`keras.callbacks.BackupAndRestore`'s settings; a subclass's overridden methods "
        "would not run. Received: type(callback)=Mine. Pass a plain "
        "`keras.callbacks.BackupAndRestore(...)` and put your own hooks in a separate callback."
    )


# -- item 10: a batch larger than the data, no epoch to run -----------------


def test_a_batch_larger_than_the_data_trains_one_short_step():
    x, y = _data(rows=103)
    theirs, ours = _model(), _model()
    k_hist = _keras_fit(theirs, x, y, 104, epochs=2)
    s_hist = _ours(ours, x, y, 104, epochs=2)
    assert s_hist.params["steps"] == 1
    np.testing.assert_allclose(s_hist.history["loss"], k_hist.history["loss"], rtol=1e-5)
    _assert_same_weights(theirs, ours)


@pytest.mark.multi_device
def test_a_global_batch_larger_than_the_data_on_two_replicas():
    """100 rows, 2 replicas x 64: one step of 50 + 50 rows, Keras' one batch of 100."""
    strategy = mirrored_strategy(2)
    x, y = _data()
    theirs = _model()
    with strategy.scope():
        ours = _model()
    k_hist = _keras_fit(theirs, x, y, 128, epochs=2)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=64, shuffle=False, strategy=strategy)
    s_hist = shardfeed.fit(ours, ds, epochs=2, verbose=0)
    assert s_hist.params["steps"] == 1
    np.testing.assert_allclose(s_hist.history["loss"], k_hist.history["loss"], rtol=1e-5)
    _assert_same_weights(theirs, ours)


@pytest.mark.parametrize(("epochs", "initial_epoch"), [(0, 0), (2, 2), (2, 3)])
def test_no_epoch_to_run_returns_an_empty_history(epochs, initial_epoch):
    x, y = _data()
    theirs, ours = _model(), _model()
    k_events, s_events = Events(), Events()
    k_hist = _keras_fit(theirs, x, y, 16, epochs=epochs, initial_epoch=initial_epoch,
                        callbacks=[k_events])
    s_hist = _ours(ours, x, y, 16, epochs=epochs, initial_epoch=initial_epoch,
                   callbacks=[s_events])
    assert s_hist.history == k_hist.history == {}
    assert s_events.events == k_events.events == []
    assert s_hist is ours.history
    _assert_same_weights(theirs, ours, rtol=0)


def test_fit_finalizes_the_optimizer_as_keras():
    """`use_ema=True`: Keras' `fit` ends by putting the moving averages in the
    model (`optimizer.finalize_variable_values`)."""
    x, y = _data()

    def ema_model():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05, use_ema=True), loss="mse")
        return model

    theirs, ours = ema_model(), ema_model()
    _keras_fit(theirs, x, y, 16, epochs=2)
    _ours(ours, x, y, 16, epochs=2)
    _assert_same_weights(theirs, ours)
