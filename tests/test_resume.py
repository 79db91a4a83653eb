"""Exactly-once resume: mid-epoch, on another number of replicas; replicas in sync.

A run is "preempted" by an exception from a callback after a backup was
written; a fresh model and dataset with the same `BackupAndRestore` directory
then resume it. The model sees a row-id column and a metric sums the ids it
trained on (count, sum, sum of squares, in float64): the metric state is part
of the backup, so the epoch's logged hash after a resume proves that every row
of the interrupted epoch was used exactly once across the preemption.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import shardfeed
from shardfeed import FitOptions, LoadOptions, ShardedResidentDataset

ROWS = 600
SEED = 3


class RowHash(keras.metrics.Metric):
    """Count, sum and sum of squares of the row ids a model trained on."""

    def __init__(self, name="rows", **kwargs):
        super().__init__(name=name, dtype="float64", **kwargs)
        self.stats = self.add_variable(
            shape=(3,), initializer="zeros", dtype="float64", aggregation="sum", name="stats"
        )

    def update_state(self, ids):
        ids = tf.cast(ids, "float64")
        self.stats.assign_add(
            tf.stack([tf.cast(tf.size(ids), "float64"), tf.reduce_sum(ids), tf.reduce_sum(ids**2)])
        )

    def result(self):
        return {"row_count": self.stats[0], "row_sum": self.stats[1], "row_sumsq": self.stats[2]}


class IdModel(keras.Model):
    """A small MLP on all but the last input column (the row id)."""

    def __init__(self):
        super().__init__(name="ids")
        self.hidden = keras.layers.Dense(8, activation="relu", name="hidden")
        self.out = keras.layers.Dense(1, name="out")
        self.row_hash = RowHash()

    def call(self, x):
        return self.out(self.hidden(x[:, :-1]))

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        self.row_hash.update_state(x[:, -1])
        return super().compute_metrics(x, y, y_pred, sample_weight)


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")).astype("float32")
    ids = np.arange(ROWS, dtype="float32")[:, None]
    return np.concatenate([x, ids], axis=1), y


def _model():
    keras.utils.set_random_seed(SEED)
    model = IdModel()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


def _strategy(n):
    if n == 1:
        return tf.distribute.get_strategy()
    # Strategies built in one process share collective group keys (see test_mirrored.py).
    tf.distribute.MirroredStrategy._collective_key_base += 100_000
    return tf.distribute.MirroredStrategy([f"/CPU:{i}" for i in range(n)])


def _fit(
    replicas,
    global_batch,
    callbacks,
    epochs=3,
    placement="replicate",
    shuffle=True,
    load_options=None,
    **kwargs,
):
    x, y = _data()
    strategy = _strategy(replicas)
    with strategy.scope():
        model = _model()
        ds = ShardedResidentDataset(
            x,
            y,
            per_replica_batch_size=global_batch // replicas,
            seed=1,
            placement=placement,
            shuffle=shuffle,
            load_options=load_options,
            strategy=strategy,
        )
    hist = shardfeed.fit(
        model,
        ds,
        epochs=epochs,
        callbacks=callbacks,
        verbose=0,
        options=FitOptions(steps_per_execution=2, jit_compile=False),
        **kwargs,
    )
    return model, hist


class Preempt(keras.callbacks.Callback):
    """Raises after the call ending at `batch` of `epoch` (after any backup)."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.epoch, self.batch, self.current = epoch, batch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.current, batch) == (self.epoch, self.batch):
            raise KeyboardInterrupt("preempted")


def _assert_every_row_once(hist):
    ids = np.arange(ROWS, dtype="float64")
    for count, total, squares in zip(
        hist.history["row_count"], hist.history["row_sum"], hist.history["row_sumsq"], strict=True
    ):
        assert (round(count), round(total), round(squares)) == (
            ROWS,
            round(ids.sum()),
            round((ids**2).sum()),
        )


def test_backup_every_n_steps_resumes_at_the_exact_step(tmp_path):
    """600 rows, global batch 50: 12 steps per epoch, 2 per call. Backups
    every 4 steps; preempted after step 10 of epoch 1, resumed from step 8:
    the final weights, optimizer state and epoch 1's logs equal an
    uninterrupted run's, and epoch 1 used every row once."""
    straight, straight_hist = _fit(1, 50, [])
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        _fit(1, 50, [keras.callbacks.BackupAndRestore(backup, save_freq=4), Preempt(1, 9)])
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(b))
    resumed, hist = _fit(1, 50, [keras.callbacks.BackupAndRestore(backup, save_freq=4), record])
    # Resumed inside epoch 1 at step 8: calls end at steps 9 and 11, then epoch 2.
    assert seen[:3] == [9, 11, 1]
    assert len(hist.history["loss"]) == 2
    for a, b in zip(straight.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(straight.optimizer.variables, resumed.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for name in ("loss", "mae"):
        np.testing.assert_allclose(hist.history[name], straight_hist.history[name][1:], rtol=1e-6)
    _assert_every_row_once(hist)
    assert not (tmp_path / "backup").exists()  # deleted at the end, as Keras does


@pytest.mark.multi_device
@pytest.mark.parametrize("replicas", [4, 2, 1])
@pytest.mark.parametrize("placement", ["replicate", "shard"])  # shard: the global exchange
def test_resume_on_another_number_of_replicas_keeps_the_global_batch(
    tmp_path, replicas, placement
):
    """Backed up on 4 replicas (per-replica batch 12, global 48), resumed on 4,
    2 and 1: per-replica batch 12, 24, 48; the same global batches, so every
    row of the interrupted epoch once and the weights of the uninterrupted
    4-replica run (to float summation order). Sharded rows take the global
    order through the exchange, which starts from whatever the new replicas
    hold."""
    straight, _ = _fit(4, 48, [], placement=placement)
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        _fit(
            4, 48, [keras.callbacks.BackupAndRestore(backup, save_freq=3), Preempt(1, 7)],
            placement=placement,
        )
    resumed, hist = _fit(
        replicas, 48, [keras.callbacks.BackupAndRestore(backup, save_freq=3)], placement=placement
    )
    assert hist.params["per_replica_batch_size"] == 48 // replicas
    assert hist.params["global_batch_size"] == 48
    _assert_every_row_once(hist)
    rtol = 0 if replicas == 4 else 1e-5
    for a, b in zip(straight.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * 1e-2)


@pytest.mark.multi_device
def test_resume_needs_a_replica_count_that_divides_the_global_batch(tmp_path):
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        _fit(2, 50, [keras.callbacks.BackupAndRestore(backup, save_freq=3), Preempt(0, 5)])
    with pytest.raises(ValueError) as err:
        _fit(4, 48, [keras.callbacks.BackupAndRestore(backup)])
    assert str(err.value) == (
        "A resumed fit keeps the checkpoint's global batch, so the number of replicas must "
        "divide it. Received: global_batch_size=50 (checkpoint: 2 replicas), "
        "num_replicas_in_sync=4. Resume on a number of replicas that divides 50 (one of "
        "[1, 2, 5, 10, 25, 50]), or start a new run with a new global batch."
    )


@pytest.mark.multi_device
def test_mid_epoch_resume_on_other_replicas_is_refused_with_local_shuffling(tmp_path):
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        _fit(
            2, 48, [keras.callbacks.BackupAndRestore(backup, save_freq=3), Preempt(0, 5)],
            placement="shard", shuffle="local",
        )
    with pytest.raises(ValueError) as err:
        _fit(
            4, 48, [keras.callbacks.BackupAndRestore(backup)], placement="shard", shuffle="local"
        )
    assert str(err.value) == (
        "Resuming inside an epoch on another number of replicas needs the global order "
        '(shuffle=True with a full exchange, or placement="replicate"; not streamed): with '
        "shuffle='local' each replica's order is its own, so the rows left in the epoch "
        "cannot be known on the new replicas. Received: num_replicas=4 (checkpoint: 2), "
        "placement='shard', shuffle='local', step 4 of the epoch. Resume on 2 replicas, or "
        'resume from a checkpoint taken at an epoch boundary (save_freq="epoch"), or train '
        "with the global order (shuffle=True)."
    )
    # On the same replicas, a locally shuffled run resumes exactly.
    _, hist = _fit(
        2, 48, [keras.callbacks.BackupAndRestore(backup)], placement="shard", shuffle="local"
    )
    _assert_every_row_once(hist)


@pytest.mark.multi_device
def test_mid_epoch_resume_after_a_partial_exchange_is_refused(tmp_path):
    """A partial exchange mixes from the rows each replica held, which a restart
    resets: the interrupted epoch's order cannot be drawn again."""
    partial = LoadOptions(exchange_fraction=0.5)
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        _fit(
            2, 48, [keras.callbacks.BackupAndRestore(backup, save_freq=3), Preempt(0, 5)],
            placement="shard", load_options=partial,
        )
    with pytest.raises(ValueError) as err:
        _fit(2, 48, [keras.callbacks.BackupAndRestore(backup)], placement="shard",
             load_options=partial)
    assert str(err.value) == (
        "Resuming inside an epoch needs that epoch's order again; a partial exchange "
        "(exchange_fraction < 1) mixes the rows each replica held before the epoch, and a "
        "restart reloads the shards as they were first loaded. Received: exchange_fraction=0.5, "
        'step 4 of the epoch. Resume from a checkpoint taken at an epoch boundary '
        '(save_freq="epoch"), or train with the full exchange (exchange_fraction=1).'
    )


def test_model_checkpoint_and_initial_step_resume_inside_an_epoch(tmp_path):
    """`ModelCheckpoint(save_freq=N)` names `{epoch}` (1-based) and `{batch}`
    (steps done); `initial_epoch=epoch - 1, initial_step=batch` continues with
    the same batches. The first epoch's logs cover only its remaining steps."""
    straight, _ = _fit(1, 50, [])
    pattern = str(tmp_path / "e{epoch}-b{batch}.weights.h5")
    ckpt = keras.callbacks.ModelCheckpoint(pattern, save_weights_only=True, save_freq=4)
    with pytest.raises(KeyboardInterrupt):
        _fit(1, 50, [ckpt, Preempt(1, 9)])
    assert (tmp_path / "e2-b8.weights.h5").exists()
    x, y = _data()
    model = _model()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=50, seed=1, placement="replicate")
    shardfeed.evaluate(model, x[:50], y[:50])  # builds the model and optimizer
    model.optimizer.build(model.trainable_variables)
    model.load_weights(tmp_path / "e2-b8.weights.h5")
    hist = shardfeed.fit(
        model, ds, epochs=3, initial_epoch=1, initial_step=8, verbose=0,
        options=FitOptions(steps_per_execution=2, jit_compile=False),
    )
    assert hist.history["row_count"][0] == 4 * 50  # steps 8-11 of epoch 1
    for a, b in zip(straight.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_steps_per_epoch_takes_each_pass_in_epochs_as_keras():
    """12 steps per pass, `steps_per_epoch=5`: as Keras' epoch iterator, an
    epoch ends when the pass runs out (5, 5, 2 steps), and the next starts a
    new pass; 15 such epochs are the 5 passes of 5 one-pass epochs."""
    one_pass, _ = _fit(1, 50, [], epochs=5)
    with pytest.warns(UserWarning, match="Your input ran out of data") as caught:
        short, hist = _fit(1, 50, [], epochs=15, steps_per_epoch=5)
    assert len(caught) == 5  # once per pass, at its 2-step epoch
    assert hist.params["steps"] == 5
    assert [round(c) for c in hist.history["row_count"]] == [250, 250, 100] * 5
    for a, b in zip(one_pass.get_weights(), short.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def _ran_out_warnings(fit, *args, **kwargs):
    """`fit(*args, **kwargs)` and how many times it warned that the data ran out."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # Keras' own noise (pyproject) included; counted apart
        out = fit(*args, **kwargs)
    return out, sum("Your input ran out of data" in str(w.message) for w in caught)


def test_backup_inside_an_epoch_that_starts_inside_a_pass(tmp_path):
    """`steps_per_epoch=5` on 12-step passes: epoch 1 is steps 5-9 of pass 0.
    Preempted after its 4th step, the resume continues at step 9 of the pass
    and ends where the uninterrupted run ends."""
    (straight, straight_hist), warned = _ran_out_warnings(
        _fit, 1, 50, [], epochs=4, steps_per_epoch=5
    )
    assert warned == 1  # epoch 2: the pass's last 2 steps
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        _fit(1, 50, [keras.callbacks.BackupAndRestore(backup, save_freq=2), Preempt(1, 3)],
             epochs=4, steps_per_epoch=5)
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(b))
    (resumed, hist), _ = _ran_out_warnings(
        _fit, 1, 50, [keras.callbacks.BackupAndRestore(backup, save_freq=2), record],
        epochs=4, steps_per_epoch=5,
    )
    assert seen[:2] == [5, 1]  # the rest of epoch 1 (its last call), then epoch 2
    for a, b in zip(straight.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(hist.history["loss"], straight_hist.history["loss"][1:], rtol=1e-6)
    assert [round(c) for c in hist.history["row_count"]] == [250, 100, 250]


def test_steps_per_epoch_and_initial_step_are_checked():
    with pytest.raises(ValueError) as err:
        _fit(1, 50, [], steps_per_epoch=0)
    assert str(err.value) == (
        "`steps_per_epoch` must be None (one pass over the data) or an integer >= 1. "
        "Received: steps_per_epoch=0. Pass e.g. `steps_per_epoch=12` (one pass), or leave it out."
    )
    with pytest.raises(ValueError) as err:
        _fit(1, 50, [], initial_step=12)
    assert str(err.value) == (
        "`initial_step` must be an integer in [0, 12) (the steps of `initial_epoch` already "
        "done). Received: initial_step=12. Pass the `{batch}` of a "
        "`ModelCheckpoint(save_freq=N)` file name, or 0."
    )


@pytest.mark.multi_device
@pytest.mark.parametrize("sync_check", [True, 1])
def test_diverged_replicas_are_caught(sync_check):
    """Replica 1's copy of the first kernel drifts after the first call: the
    check names the variable and the replica (at the epoch's end, or after
    every call with `sync_check=1`)."""
    calls = []

    class Drift(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            calls.append(batch)
            if len(calls) == 1:
                kernel = self.model.trainable_variables[0].value
                copies = self.model.distribute_strategy.experimental_local_results(kernel)
                copies[1].assign_add(tf.fill(copies[1].shape, 1e-3))

    x, y = _data()
    strategy = _strategy(2)
    with strategy.scope():
        model = _model()
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=24, seed=1, strategy=strategy)
    with pytest.raises(RuntimeError) as err:
        shardfeed.fit(
            model, ds, epochs=2, verbose=0, callbacks=[Drift()],
            options=FitOptions(steps_per_execution=2, sync_check=sync_check),
        )
    where = "after epoch 0, step 13" if sync_check is True else "after epoch 0, step 4"
    assert str(err.value).startswith(
        "Every replica must hold the same weights: data-parallel training applies the same "
        "aggregated gradients on every replica. Received: variable='ids/hidden/kernel' "
        f"(trainable variable 0 of 4, 1 diverged) differs on replicas [1] from replica 0 {where}."
    )


@pytest.mark.multi_device
def test_replicas_in_sync_pass_the_check_and_it_can_be_turned_off():
    x, y = _data()
    strategy = _strategy(2)
    with strategy.scope():
        model = _model()
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=24, seed=1, strategy=strategy)
    shardfeed.fit(model, ds, epochs=1, verbose=0, options=FitOptions(sync_check=1))

    class Drift(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            kernel = self.model.trainable_variables[0].value
            self.model.distribute_strategy.experimental_local_results(kernel)[1].assign_add(
                tf.fill(kernel.shape, 1e-3)
            )

    shardfeed.fit(
        model, ds, epochs=1, verbose=0, callbacks=[Drift()],
        options=FitOptions(sync_check=False),
    )
    with pytest.raises(ValueError, match="`sync_check` must be True, False or an integer"):
        FitOptions(sync_check=0)
