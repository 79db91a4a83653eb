"""Keras callbacks work with shardfeed.fit as they do with model.fit."""

from __future__ import annotations

import csv

import keras
import numpy as np
import pytest
from keras import layers

import shardfeed
from shardfeed import FitOptions, ShardedResidentDataset


def _setup(rows=600, lr=0.05, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")).astype("float32")
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((4,)), layers.Dense(8, activation="relu"), layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse", metrics=["mae"])
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=50, seed=1)
    return model, ds, (x, y)


def test_lambda_callback_sees_every_hook_in_order():
    model, ds, _ = _setup()
    events = []
    cb = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: events.append("train_begin"),
        on_epoch_begin=lambda epoch, logs: events.append(f"epoch_begin {epoch}"),
        on_train_batch_end=lambda batch, logs: events.append(f"batch_end {batch}"),
        on_epoch_end=lambda epoch, logs: events.append(f"epoch_end {epoch} {sorted(logs)}"),
        on_train_end=lambda logs: events.append("train_end"),
    )
    shardfeed.fit(
        model, ds, epochs=2, callbacks=[cb], verbose=0, options=FitOptions(steps_per_execution=5)
    )
    # 12 steps per epoch, 5 per call: batch hooks after steps 5, 10 and 12,
    # numbered by Keras' step counter (call j ends at 5j + 4, also the short last one).
    epoch = ["batch_end 4", "batch_end 9", "batch_end 14"]
    assert events == [
        "train_begin",
        "epoch_begin 0",
        *epoch,
        "epoch_end 0 ['loss', 'mae']",
        "epoch_begin 1",
        *epoch,
        "epoch_end 1 ['loss', 'mae']",
        "train_end",
    ]


def test_stop_training_from_a_batch_hook_stops_after_that_call():
    model, ds, _ = _setup()

    class StopAfterFirstCall(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = True

    hist = shardfeed.fit(
        model,
        ds,
        epochs=5,
        callbacks=[StopAfterFirstCall()],
        verbose=0,
        options=FitOptions(steps_per_execution=3),
    )
    assert len(hist.history["loss"]) == 1
    assert int(model.optimizer.iterations.numpy()) == 3


def test_early_stopping_restores_best_weights():
    model, ds, (x, y) = _setup(lr=0.2)
    best = {}

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            best[epoch] = (logs["val_loss"], [w.copy() for w in self.model.get_weights()])

    # A huge learning rate from epoch 3 makes validation loss go up.
    def schedule(epoch, lr):
        return 0.01 if epoch < 3 else 5.0

    stopper = keras.callbacks.EarlyStopping(
        monitor="val_loss", patience=2, restore_best_weights=True
    )
    hist = shardfeed.fit(
        model,
        ds,
        epochs=20,
        validation_data=(x[:100], y[:100]),
        verbose=0,
        callbacks=[keras.callbacks.LearningRateScheduler(schedule), Record(), stopper],
    )
    assert len(hist.history["loss"]) < 20
    best_epoch = min(best, key=lambda e: best[e][0])
    for w, w_best in zip(model.get_weights(), best[best_epoch][1], strict=True):
        np.testing.assert_array_equal(w, w_best)


def test_reduce_lr_on_plateau_changes_the_learning_rate_the_loop_uses():
    reference, _, (x, y) = _setup()
    model, _, _ = _setup()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=50, shuffle=False)

    def plateau():
        return keras.callbacks.ReduceLROnPlateau(
            monitor="loss", factor=0.5, patience=0, min_delta=1e9
        )

    reference.fit(x, y, batch_size=50, shuffle=False, epochs=3, callbacks=[plateau()], verbose=0)
    shardfeed.fit(model, ds, epochs=3, callbacks=[plateau()], verbose=0)
    lr = float(model.optimizer.learning_rate.numpy())
    assert lr < 0.05
    assert lr == float(reference.optimizer.learning_rate.numpy())
    for w, w_ref in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-7)


def test_model_checkpoint_csv_logger_and_tensorboard_write_files(tmp_path):
    model, ds, (x, _) = _setup()
    ckpt = tmp_path / "best.keras"
    log = tmp_path / "log.csv"
    tb = tmp_path / "tb"
    shardfeed.fit(
        model,
        ds,
        epochs=2,
        verbose=0,
        callbacks=[
            keras.callbacks.ModelCheckpoint(str(ckpt), monitor="loss", save_best_only=True),
            keras.callbacks.CSVLogger(str(log)),
            keras.callbacks.TensorBoard(str(tb)),
        ],
    )
    restored = keras.models.load_model(ckpt)
    np.testing.assert_allclose(
        restored.predict(x[:5], verbose=0), model.predict(x[:5], verbose=0), rtol=1e-6
    )
    with open(log) as f:
        rows = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows] == ["0", "1"]
    assert {"epoch", "loss", "mae"} <= set(rows[0])
    assert float(rows[1]["loss"]) > 0
    assert any(p.name.startswith("events.out.tfevents") for p in (tb / "train").iterdir())


def test_initial_epoch_continues_numbering():
    model, ds, _ = _setup()
    seen = []
    cb = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: seen.append(e))
    hist = shardfeed.fit(model, ds, epochs=4, initial_epoch=2, callbacks=[cb], verbose=0)
    assert seen == [2, 3]
    assert len(hist.history["loss"]) == 2


def test_file_writing_callbacks_run_on_the_chief_only(tmp_path):
    from shardfeed._training.callbacks import callback_list as _callback_list
    from shardfeed._training.progress import Progress

    model, _, _ = _setup()
    stopper = keras.callbacks.EarlyStopping()
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"))
    logger = keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))
    mine = keras.callbacks.CSVLogger(str(tmp_path / "rank.csv"))
    mine.shardfeed_all_ranks = True  # asks to run on every rank

    def kinds(is_chief):
        cbs = _callback_list([stopper, checkpoint, logger, mine], model, 1, is_chief, {})
        return [type(c).__name__ for c in cbs.callbacks]

    assert kinds(True) == [
        "EarlyStopping",
        "ModelCheckpoint",
        "CSVLogger",
        "CSVLogger",
        Progress.__name__,
        "History",
    ]
    # Other ranks get the same global logs but write nothing (except opt-ins).
    assert kinds(False) == ["EarlyStopping", "CSVLogger", "History"]


def test_backup_and_restore_resumes_a_preempted_run_exactly(tmp_path):
    """Preempted after 2 of 4 epochs, a fresh process (here: a fresh model and
    dataset) with the same BackupAndRestore directory resumes at epoch 2 and
    ends where an uninterrupted run ends."""
    _, _, (x, y) = _setup()

    def run(epochs, callbacks):
        model, _, _ = _setup()
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=50, seed=1)
        hist = shardfeed.fit(model, ds, epochs=epochs, callbacks=callbacks, verbose=0)
        return model, hist

    straight, _ = run(4, [])

    class Preempt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt("preempted")

    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        run(4, [keras.callbacks.BackupAndRestore(backup), Preempt()])
    resumed, hist = run(4, [keras.callbacks.BackupAndRestore(backup)])
    assert len(hist.history["loss"]) == 2  # epochs 2 and 3 only
    for a, b in zip(straight.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_on_chief_runs_a_callback_on_rank_0_only_and_other_ranks_print_nothing(capsys):
    from shardfeed._training.callbacks import callback_list as _callback_list

    model, _, _ = _setup()
    mine = shardfeed.on_chief(keras.callbacks.LambdaCallback())
    rates = keras.callbacks.LearningRateScheduler(lambda e, lr: 0.01, verbose=1)
    stopper = keras.callbacks.EarlyStopping(verbose=1)
    everywhere = keras.callbacks.EarlyStopping(verbose=1)
    everywhere.shardfeed_all_ranks = True  # opted in as it is: not silenced

    def run(is_chief):
        cbs = _callback_list([mine, rates, stopper, everywhere], model, 0, is_chief, {})
        kept = [c for c in cbs.callbacks if c in (mine, rates, stopper, everywhere)]
        during = (rates.verbose, stopper.verbose, everywhere.verbose)
        cbs.on_train_begin()
        cbs.on_epoch_begin(0)
        printed = capsys.readouterr().out
        cbs.on_train_end()
        return kept, during, printed

    kept, during, printed = run(is_chief=True)
    assert kept == [mine, rates, stopper, everywhere] and during == (1, 1, 1)
    assert "LearningRateScheduler setting learning rate to 0.01" in printed
    kept, during, printed = run(is_chief=False)
    assert kept == [rates, stopper, everywhere]
    assert during == (0, 0, 1) and "LearningRateScheduler" not in printed
    assert model.optimizer.learning_rate.numpy() == pytest.approx(0.01)  # it still acts
    assert (rates.verbose, stopper.verbose) == (1, 1)  # given back at on_train_end
    with pytest.raises(TypeError, match=r"Received: type\(callback\)=function"):
        shardfeed.on_chief(lambda: None)
