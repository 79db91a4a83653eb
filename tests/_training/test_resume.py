"""Exactly-once resume: mid-epoch, on another number of replicas; replicas in sync.

A run is "preempted" by an exception from a callback after a backup was
written; a fresh model and dataset with the same `BackupAndRestore` directory
then resume it. The model sees a row-id column and a metric sums the ids it
trained on (count, sum, sum of squares, in float64): the metric state is part
of the backup, so the epoch's logged hash after a resume proves that every row
of the interrupted epoch was used exactly once across the preemption.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from _helpers import strategy_of
from _helpers_resume import DELETE as _DELETE
from _helpers_resume import Preempt
from _helpers_resume import edit_state as _state
from _helpers_row_ids import IdModel

import shardfeed
from shardfeed import FitOptions, LoadOptions, ShardedResidentDataset

ROWS = 600
SEED = 3


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


_strategy = strategy_of


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


@pytest.fixture(scope="module")
def four_replica_runs(tmp_path_factory):
    """Per placement, the uninterrupted 4-replica run's weights and the backup
    of the 4-replica run preempted at epoch 1, step 7: made once (CI time) and
    shared by the cases that resume from them on 4 and on 1 replica."""
    runs = {}

    def runs_for(placement):
        if placement not in runs:
            straight, _ = _fit(4, 48, [], placement=placement)
            backup = tmp_path_factory.mktemp(f"interrupted_{placement}") / "backup"
            with pytest.raises(KeyboardInterrupt):
                _fit(
                    4, 48,
                    [keras.callbacks.BackupAndRestore(str(backup), save_freq=3), Preempt(1, 7)],
                    placement=placement,
                )
            runs[placement] = straight.get_weights(), backup
        return runs[placement]

    return runs_for


@pytest.mark.multi_device
@pytest.mark.parametrize(
    ("placement", "replicas"),
    # shard: the global exchange. CI time: replicate on 4 and 2, and shard on 2
    # (shapes the sharded cases on 4 and 1 and replicate on 1 cover) were dropped.
    [("replicate", 1), ("shard", 4), ("shard", 1)],
)
def test_resume_on_another_number_of_replicas_keeps_the_global_batch(
    tmp_path, replicas, placement, four_replica_runs
):
    """Backed up on 4 replicas (per-replica batch 12, global 48), resumed on 4,
    2 and 1: per-replica batch 12, 24, 48; the same global batches, so every
    row of the interrupted epoch once and the weights of the uninterrupted
    4-replica run (to float summation order). Sharded rows take the global
    order through the exchange, which starts from whatever the new replicas
    hold."""
    straight_weights, interrupted = four_replica_runs(placement)
    backup = str(tmp_path / "backup")
    shutil.copytree(interrupted, backup)  # the resumed run deletes it at the end
    resumed, hist = _fit(
        replicas, 48, [keras.callbacks.BackupAndRestore(backup, save_freq=3)], placement=placement
    )
    assert hist.params["per_replica_batch_size"] == 48 // replicas
    assert hist.params["global_batch_size"] == 48
    _assert_every_row_once(hist)
    rtol = 0 if replicas == 4 else 1e-5
    for a, b in zip(straight_weights, resumed.get_weights(), strict=True):
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
        "aggregated gradients on every replica. Received: variable ids/hidden/kernel differs "
        f"on replicas [1] from replica 0 (1 of 4 trainable variables differ) {where}."
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


# -- the state file is checked, not trusted ------------------------------------
#
# One interrupted run (600 rows, global batch 50: 12 steps per epoch; backed up
# at epoch 1, step 8; preempted after step 10) is copied per probe, its
# `shardfeed_state.json` edited as a hostile or unlucky user would, and the
# resume must refuse it before any step, naming the file and the field.


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    backup = tmp_path_factory.mktemp("interrupted") / "backup"
    with pytest.raises(KeyboardInterrupt):
        _fit(1, 50, [keras.callbacks.BackupAndRestore(str(backup), save_freq=4), Preempt(1, 9)])
    return backup


def _backup_copy(interrupted, tmp_path):
    backup = tmp_path / "backup"
    shutil.copytree(interrupted, backup, symlinks=True)
    return backup


def _write(data):
    def edit(backup):
        (backup / "shardfeed_state.json").write_bytes(data(backup))

    return edit


def _weights(name):
    """Points `weights` at a copy of the weights file outside the backup."""

    def edit(backup):
        outside = backup.parent / "outside"
        outside.mkdir()
        shutil.copy(next(backup.glob("ckpt-*.weights.h5")), outside / "ckpt-0.weights.h5")
        path = backup / "shardfeed_state.json"
        saved = json.loads(path.read_text())
        saved["weights"] = name.format(outside=outside)
        path.write_text(json.dumps(saved))

    return edit


def _linked(which):
    """Moves the state file or the weights file it names out of the backup,
    leaving a symlink to it in its place."""

    def edit(backup):
        name = "shardfeed_state.json"
        if which == "weights":
            name = json.loads((backup / name).read_text())["weights"]
        shutil.move(backup / name, backup.parent / name)
        (backup / name).symlink_to(backup.parent / name)

    return edit


def _fifo(which):
    """Puts a FIFO in place of the state file or the weights file it names
    (a read of it waited for a writer forever)."""

    def edit(backup):
        name = "shardfeed_state.json"
        if which == "weights":
            name = json.loads((backup / name).read_text())["weights"]
        (backup / name).unlink()
        os.mkfifo(backup / name)

    return edit


STATE_PROBES = [
    pytest.param(_state(cursor__step=10**12), id="step 10**12"),  # skipped the epoch's rest
    pytest.param(_state(cursor__step=-5), id="step -5"),  # retrained the whole epoch
    pytest.param(_state(cursor__step=13), id="step past the epoch"),
    pytest.param(_state(cursor__step=8.0), id="step 8.0"),
    pytest.param(_state(cursor__epoch=-1), id="epoch -1"),  # four epochs in the history
    pytest.param(_state(cursor__data_epoch=5), id="another data_epoch"),  # another row order
    pytest.param(_state(cursor__data_step=3), id="another data_step"),
    pytest.param(_state(loss_sum=float("nan")), id="loss_sum NaN"),
    pytest.param(_state(loss_sum=1e308), id="loss_sum 1e308"),
    pytest.param(_state(loss_rows=-400), id="loss_rows negative"),
    pytest.param(_state(loss_rows=7), id="loss_rows not the steps' rows"),
    pytest.param(  # was in the resumed epoch's `mae`
        _state(metrics=[0.0, 0.0, float("nan"), 400.0, [400.0, 123675.0, 50075793.0]]),
        id="metrics NaN",
    ),
    pytest.param(_state(metrics=[0.0, 0.0, 1.0, 1.0, [1.0]]), id="metric of another shape"),
    pytest.param(_state(steps_per_epoch=0), id="steps_per_epoch 0"),
    pytest.param(_state(shuffle=1), id="shuffle 1"),
    pytest.param(_state(global_batch_size=49, num_replicas=2), id="batch not a multiple"),
    pytest.param(_state(format=3), id="format 3"),
    pytest.param(_state(format=True), id="format true"),
    pytest.param(_state(order=None), id="order null"),
    pytest.param(_state(order=_DELETE), id="order missing"),
    pytest.param(_state(format=1), id="format 1 with an order"),
    pytest.param(_state(loss_rows=_DELETE), id="missing field"),
    pytest.param(_state(extra=1), id="unknown field"),
    pytest.param(_state(cursor="x"), id="cursor not an object"),
    pytest.param(_weights("{outside}/ckpt-0.weights.h5"), id="weights absolute"),
    pytest.param(_weights("../outside/ckpt-0.weights.h5"), id="weights ../"),
    pytest.param(_linked("weights"), id="weights a symlink"),
    pytest.param(_linked("state"), id="state file a symlink"),
    pytest.param(_fifo("weights"), id="weights a FIFO"),
    pytest.param(_fifo("state"), id="state file a FIFO", marks=pytest.mark.timeout(120)),
    pytest.param(_write(lambda b: (b / "shardfeed_state.json").read_bytes()[:40]), id="truncated"),
    pytest.param(_write(lambda b: b""), id="empty"),
    pytest.param(_write(lambda b: b"\xff\xfe garbage \x00"), id="garbage"),
    pytest.param(_write(lambda b: b'{"state": {}}'), id="no weights"),
    pytest.param(_write(lambda b: b"[1, 2]"), id="not an object"),
]


@pytest.mark.parametrize("edit", STATE_PROBES)
def test_a_resume_state_is_checked_before_any_step(interrupted, tmp_path, edit, request):
    """Each edit ran before (skipped or retrained steps, logged edited totals,
    loaded weights from outside the backup) or raised a bare JSONDecodeError /
    UnicodeDecodeError / KeyError / TypeError; now the resume is refused
    before any step, naming the file and the field."""
    backup = _backup_copy(interrupted, tmp_path)
    edit(backup)
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(b))
    with pytest.raises(ValueError) as err:
        _fit(1, 50, [keras.callbacks.BackupAndRestore(str(backup)), record])
    assert not seen
    text = str(err.value).replace(str(backup), "BACKUP").replace(str(tmp_path), "TMP")
    assert text == STATE_ERRORS[request.node.callspec.id]


def test_a_state_from_before_the_shared_order_resumes_only_at_an_epoch_boundary(
    interrupted, tmp_path
):
    """A format 1 state (no `order`: written when TensorFlow drew its own
    order) resumed inside its epoch on the new order, training rows the
    interrupted run had trained and skipping others; now it is refused
    there, and resumes from an epoch boundary (whose next epochs' order no
    step had fixed yet)."""
    backup = _backup_copy(interrupted, tmp_path)
    _state(format=1, order=_DELETE)(backup)
    with pytest.raises(ValueError) as err:
        _fit(1, 50, [keras.callbacks.BackupAndRestore(str(backup))])
    assert str(err.value) == (
        "Resuming inside an epoch needs that epoch's order again; the checkpoint was "
        "written under another epoch order (a resume state of format 1, from before both "
        "backends shared one order). Received: checkpoint order=None, dataset "
        "order='numpy-pcg64-1', step 8 of the epoch. Resume from a checkpoint taken at "
        'an epoch boundary (save_freq="epoch"), or with the backend, residency and '
        "shardfeed version that wrote it."
    )
    _state(cursor__step=0, cursor__data_step=0, loss_sum=0.0, loss_rows=0)(backup)
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(b))
    _, hist = _fit(1, 50, [keras.callbacks.BackupAndRestore(str(backup)), record])
    assert len(hist.history["loss"]) == 2  # epochs 1 and 2, from their first step
    assert seen[0] == 1  # the first call's last step (two a call), of epoch 1


def test_a_state_of_another_order_is_refused_inside_an_epoch(interrupted, tmp_path):
    """A state written where epochs took another order (TensorFlow's streamed
    chunks) would resume inside the epoch on this dataset's order."""
    backup = _backup_copy(interrupted, tmp_path)
    _state(order="numpy-pcg64-1+tensorflow-stream-chunks")(backup)
    with pytest.raises(ValueError, match=(
        r"under another epoch order \(another backend's streamed or unmoved rows, or another "
        r"shardfeed\)\. Received: checkpoint order='numpy-pcg64-1\+tensorflow-stream-chunks', "
        r"dataset order='numpy-pcg64-1', step 8 of the epoch\."
    )):
        _fit(1, 50, [keras.callbacks.BackupAndRestore(str(backup))])


FIX = (
    "Resume from the backup directory as `fit` wrote it (the file was edited, damaged or "
    "comes from another run), or delete the directory to start afresh."
)
STATE_ERRORS = {
    "step 10**12": (
        "A shardfeed resume state's `cursor.step` must be in [0, 12]: fit epoch 1 is "
        "steps [0, 12) of pass 1 over the data (12 steps per pass, "
        "steps_per_epoch=None). Received: BACKUP/shardfeed_state.json: "
        "state.cursor.epoch=1, state.cursor.step=1000000000000. "
    ) + FIX,
    "step -5": (
        "A shardfeed resume state's `cursor.step` must be an integer >= 0. Received: "
        "BACKUP/shardfeed_state.json: state.cursor.step=-5. "
    ) + FIX,
    "step past the epoch": (
        "A shardfeed resume state's `cursor.step` must be in [0, 12]: fit epoch 1 is "
        "steps [0, 12) of pass 1 over the data (12 steps per pass, "
        "steps_per_epoch=None). Received: BACKUP/shardfeed_state.json: "
        "state.cursor.epoch=1, state.cursor.step=13. "
    ) + FIX,
    "step 8.0": (
        "A shardfeed resume state's `cursor.step` must be an integer >= 0. Received: "
        "BACKUP/shardfeed_state.json: state.cursor.step=8.0. "
    ) + FIX,
    "epoch -1": (
        "A shardfeed resume state's `cursor.epoch` must be an integer >= 0. Received: "
        "BACKUP/shardfeed_state.json: state.cursor.epoch=-1. "
    ) + FIX,
    "another data_epoch": (
        "A shardfeed resume state's `cursor.data_epoch` and `cursor.data_step` must be "
        "where the fit's cursor lies in the data, pass 1 step 8 (fit epoch 1 is steps "
        "[0, 12) of pass 1 over the data (12 steps per pass, steps_per_epoch=None); the "
        "pass seeds the order). Received: BACKUP/shardfeed_state.json: "
        "state.cursor.data_epoch=5, state.cursor.data_step=8 (state.cursor.epoch=1, "
        "state.cursor.step=8). "
    ) + FIX,
    "another data_step": (
        "A shardfeed resume state's `cursor.data_epoch` and `cursor.data_step` must be "
        "where the fit's cursor lies in the data, pass 1 step 8 (fit epoch 1 is steps "
        "[0, 12) of pass 1 over the data (12 steps per pass, steps_per_epoch=None); the "
        "pass seeds the order). Received: BACKUP/shardfeed_state.json: "
        "state.cursor.data_epoch=1, state.cursor.data_step=3 (state.cursor.epoch=1, "
        "state.cursor.step=8). "
    ) + FIX,
    "loss_sum NaN": (
        "A shardfeed resume state's `loss_sum` must be a finite number (the epoch's "
        "running loss: a run whose loss was not finite cannot be continued). Received: "
        "BACKUP/shardfeed_state.json: state.loss_sum=nan. "
    ) + FIX,
    "loss_sum 1e308": (
        "A shardfeed resume state's `loss_sum` must be at most float32's largest value "
        "(3.4e+38) per counted row in magnitude. Received: BACKUP/shardfeed_state.json: "
        "state.loss_sum=1e+308, state.loss_rows=400. "
    ) + FIX,
    "loss_rows negative": (
        "A shardfeed resume state's `loss_rows` must be an integer >= 0. Received: "
        "BACKUP/shardfeed_state.json: state.loss_rows=-400. "
    ) + FIX,
    "loss_rows not the steps' rows": (
        "A shardfeed resume state's `loss_rows` must be the rows of the 8 step(s) done "
        "(351 to 400 with a global batch of 50; 0 under a model's own `train_step`). "
        "Received: BACKUP/shardfeed_state.json: state.loss_rows=7, state.cursor.step=8, "
        "state.global_batch_size=50. "
    ) + FIX,
    "metrics NaN": (
        "A shardfeed resume state's `metrics` must be a list of the metric variables' "
        "values (finite numbers or nested lists of them). Received: "
        "BACKUP/shardfeed_state.json: state.metrics=[0.0, 0.0, nan, 400.0, [400.0, 123675.0, "
        "50075793.0]]. "
    ) + FIX,
    "metric of another shape": (
        "A shardfeed resume state's `metrics[4]` must hold the value of metric variable "
        "'rows/stats', of shape (3,). Received: BACKUP/shardfeed_state.json: "
        "state.metrics[4]=[1.0]. "
    ) + FIX,
    "steps_per_epoch 0": (
        "A shardfeed resume state's `steps_per_epoch` must be an integer >= 1. "
        "Received: BACKUP/shardfeed_state.json: state.steps_per_epoch=0. "
    ) + FIX,
    "shuffle 1": (
        "A shardfeed resume state's `shuffle` must be true, false or \"local\". Received: "
        "BACKUP/shardfeed_state.json: state.shuffle=1. "
    ) + FIX,
    "batch not a multiple": (
        "A shardfeed resume state's `global_batch_size` must be a multiple of "
        "`num_replicas` (replicas x per-replica batch). Received: "
        "BACKUP/shardfeed_state.json: state.global_batch_size=49, state.num_replicas=2. "
    ) + FIX,
    "format 3": (
        "A shardfeed resume state must have format 1 or 2. Received: "
        "BACKUP/shardfeed_state.json: state.format=3. Resume with the shardfeed version "
        "that wrote it, or start afresh."
    ),
    "format true": (
        "A shardfeed resume state must have format 1 or 2. Received: "
        "BACKUP/shardfeed_state.json: state.format=True. Resume with the shardfeed version "
        "that wrote it, or start afresh."
    ),
    "order null": (
        "A shardfeed resume state's `order` must be the name of an epoch order (a string). "
        "Received: BACKUP/shardfeed_state.json: state.order=None. "
    ) + FIX,
    "order missing": (
        "A shardfeed resume state must have exactly the fields shardfeed writes. "
        "Received: BACKUP/shardfeed_state.json: missing state.order. "
    ) + FIX,
    "format 1 with an order": (
        "A shardfeed resume state must have exactly the fields shardfeed writes. "
        "Received: BACKUP/shardfeed_state.json: unknown state.order. "
    ) + FIX,
    "missing field": (
        "A shardfeed resume state must have exactly the fields shardfeed writes. "
        "Received: BACKUP/shardfeed_state.json: missing state.loss_rows. "
    ) + FIX,
    "unknown field": (
        "A shardfeed resume state must have exactly the fields shardfeed writes. "
        "Received: BACKUP/shardfeed_state.json: unknown state.extra. "
    ) + FIX,
    "cursor not an object": (
        "A shardfeed resume state's `cursor` must be a JSON object. Received: "
        "BACKUP/shardfeed_state.json: state.cursor='x'. "
    ) + FIX,
    "weights absolute": (
        "A shardfeed backup's shardfeed_state.json must name one of the weights files "
        "this backup writes ('ckpt-0.weights.h5' or 'ckpt-1.weights.h5', in the backup "
        "directory). Received: BACKUP/shardfeed_state.json: "
        "weights='TMP/outside/ckpt-0.weights.h5'. "
    ) + FIX,
    "weights ../": (
        "A shardfeed backup's shardfeed_state.json must name one of the weights files "
        "this backup writes ('ckpt-0.weights.h5' or 'ckpt-1.weights.h5', in the backup "
        "directory). Received: BACKUP/shardfeed_state.json: "
        "weights='../outside/ckpt-0.weights.h5'. "
    ) + FIX,
    "weights a symlink": (
        "A shardfeed backup's shardfeed_state.json must name a regular weights file "
        "(not a link, FIFO or device). Received: BACKUP/shardfeed_state.json: "
        "weights='ckpt-0.weights.h5': BACKUP/ckpt-0.weights.h5 is a symbolic link. "
    ) + FIX,
    "state file a symlink": (
        "A shardfeed backup's shardfeed_state.json must be a regular file (not a link, "
        "FIFO or device). Received: BACKUP/shardfeed_state.json: is a symbolic link, not "
        "a regular file. "
    ) + FIX,
    "weights a FIFO": (
        "A shardfeed backup's shardfeed_state.json must name a regular weights file "
        "(not a link, FIFO or device). Received: BACKUP/shardfeed_state.json: "
        "weights='ckpt-0.weights.h5': BACKUP/ckpt-0.weights.h5 is a FIFO (named pipe). "
    ) + FIX,
    "state file a FIFO": (
        "A shardfeed backup's shardfeed_state.json must be a regular file (not a link, "
        "FIFO or device). Received: BACKUP/shardfeed_state.json: is a FIFO (named pipe), "
        "not a regular file. "
    ) + FIX,
    "truncated": (
        "A shardfeed backup's shardfeed_state.json must be JSON. Received: "
        "BACKUP/shardfeed_state.json: Unterminated string starting at: line 1 column 34 "
        "(char 33). "
    ) + FIX,
    "empty": (
        "A shardfeed backup's shardfeed_state.json must be JSON. Received: "
        "BACKUP/shardfeed_state.json: Expecting value: line 1 column 1 (char 0). "
    ) + FIX,
    "garbage": (
        "A shardfeed backup's shardfeed_state.json must be UTF-8 JSON. Received: "
        "BACKUP/shardfeed_state.json: 'utf-8' codec can't decode byte 0xff in position "
        "0: invalid start byte. "
    ) + FIX,
    "no weights": (
        "A shardfeed backup's shardfeed_state.json must be a JSON object with the "
        "fields \"weights\", \"weights_sha256\" and \"state\". Received: "
        "BACKUP/shardfeed_state.json: fields=['state']. "
    ) + FIX,
    "not an object": (
        "A shardfeed backup's shardfeed_state.json must be a JSON object with the "
        "fields \"weights\", \"weights_sha256\" and \"state\". Received: "
        "BACKUP/shardfeed_state.json: type=list. "
    ) + FIX,
}


def test_steps_per_epoch_on_resume_is_the_fits_own_or_refused(interrupted, tmp_path):
    """Keras' `BackupAndRestore` resumes with `fit`'s own arguments. The
    checkpoint's epochs are one pass each: `steps_per_epoch=5` would split
    them otherwise, so it is refused, naming both values (it was silently
    replaced by the checkpoint's None)."""
    backup = _backup_copy(interrupted, tmp_path)
    with pytest.raises(ValueError) as err:
        _fit(1, 50, [keras.callbacks.BackupAndRestore(str(backup))], steps_per_epoch=5)
    assert str(err.value).replace(str(backup), "BACKUP") == (
        "A resumed fit must split the data into the checkpoint's epochs: its cursor and the "
        "epoch's running loss and metrics count epochs of the checkpoint's `steps_per_epoch`, "
        "and `fit` keeps the `steps_per_epoch` it is given (as Keras' `BackupAndRestore` "
        "does). Received: steps_per_epoch=5; BACKUP/shardfeed_state.json: "
        "state.steps_per_epoch=None (12 steps per pass over the data). Leave "
        "`steps_per_epoch` out as the interrupted run did, or delete the backup directory to "
        "start afresh with the new epochs."
    )


def test_steps_per_epoch_that_gives_the_same_epochs_is_honoured(interrupted, tmp_path):
    """`steps_per_epoch=100` on 12-step passes gives the checkpoint's one-pass
    epochs: the fit keeps its own value (Keras' `params["steps"]` and its
    "ran out of data" warning, once per epoch), and the interrupted epoch
    still uses every row once."""
    backup = _backup_copy(interrupted, tmp_path)
    (_, hist), warned = _ran_out_warnings(
        _fit, 1, 50, [keras.callbacks.BackupAndRestore(str(backup))], steps_per_epoch=100
    )
    assert hist.params["steps"] == 100
    assert warned == 2
    _assert_every_row_once(hist)


def _first_array_offset(path):
    """Where the first weights array of more than 2 floats starts in the file."""
    import h5py

    found = []

    def visit(_, item):
        if isinstance(item, h5py.Dataset) and item.size > 2 and not found:
            found.append(item.id.get_offset())

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return found[0]


@pytest.mark.parametrize("damage", ["truncated", "flipped bytes"])
def test_a_damaged_weights_file_is_refused_naming_it(interrupted, tmp_path, damage):
    """A truncated file gave h5py's raw OSError ("Unable to synchronously
    open file (truncated file: ...)"), naming neither the backup nor the fix;
    bytes flipped inside the weights loaded silently (a loss of 1.9e12 or
    NaN weights). The state names the file's SHA-256."""
    backup = _backup_copy(interrupted, tmp_path)
    weights = backup / json.loads((backup / "shardfeed_state.json").read_text())["weights"]
    raw = bytearray(weights.read_bytes())
    if damage == "truncated":
        raw = raw[:1000]
    else:  # one float of a kernel: h5py reads it without complaint
        at = _first_array_offset(weights) + 8
        raw[at : at + 4] = bytes(b ^ 0x40 for b in raw[at : at + 4])
    weights.write_bytes(bytes(raw))
    with pytest.raises(ValueError) as err:
        _fit(1, 50, [keras.callbacks.BackupAndRestore(str(backup))])
    text = str(err.value).replace(str(backup), "BACKUP")
    assert text.startswith(
        "A shardfeed backup's weights file must be the whole file `fit` wrote, for this "
        f"model. Received: BACKUP/{weights.name}: SHA-256 "
    )
    assert ", where shardfeed_state.json names " in text and text.endswith(FIX)


@pytest.mark.parametrize("swap", ["another file", "a symlink"])
def test_weights_swapped_after_the_check_are_not_loaded(interrupted, tmp_path, swap):
    """The weights file is checked when the backup is read and loaded from
    that very file (device and inode) without following links: one replaced
    in between (here by a callback that runs first) is refused."""
    backup = _backup_copy(interrupted, tmp_path)
    weights = backup / json.loads((backup / "shardfeed_state.json").read_text())["weights"]

    def replace(logs=None):
        shutil.copy(weights, tmp_path / "other.weights.h5")
        weights.unlink()
        if swap == "a symlink":
            weights.symlink_to(tmp_path / "other.weights.h5")
        else:
            shutil.move(tmp_path / "other.weights.h5", weights)

    first = keras.callbacks.LambdaCallback(on_train_begin=replace)
    with pytest.raises(ValueError) as err:
        _fit(1, 50, [first, keras.callbacks.BackupAndRestore(str(backup))])
    text = str(err.value).replace(str(backup), "BACKUP")
    assert text.startswith(
        "A shardfeed backup's shardfeed_state.json must name the weights file that was "
        "checked. Received: BACKUP/shardfeed_state.json: BACKUP/ckpt-0.weights.h5 "
    )
    assert ("is a symbolic link, not a regular file" in text) == (swap == "a symlink")
    assert text.endswith(FIX)
