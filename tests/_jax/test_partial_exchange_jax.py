"""The partial exchange on JAX (`LoadOptions(exchange_fraction < 1)`).

Each training epoch every row is used once; each replica holds the rows the
neutral `_data/exchange.py` gives it (the TensorFlow backend's draw), read
back from the devices; about `fraction * (1 - 1/R)` of the rows change
replica per epoch and none is lost or duplicated; epochs opened out of turn
(a resumed run) equal epochs opened in turn; `fit` trains with it, and a
`BackupAndRestore` resume inside an epoch equals the uninterrupted run.
Both ways an epoch holds its rows: gathered, and a per-epoch copy.
"""

from __future__ import annotations

import jax
import keras
import numpy as np
import pytest
from _helpers_fit import mlp, regression_data
from _helpers_fit import replicas as fit_replicas
from _helpers_resume import Preempt

import shardfeed
from shardfeed._data import exchange as _exchange
from shardfeed._data.options import LoadOptions
from shardfeed._jax.dataset import ShardedResidentDataset

ROWS = 1003  # uneven shards and a partial last step


def _options(copy: bool, fraction: float = 0.25) -> LoadOptions:
    # A small staging buffer: several rounds an epoch.
    return LoadOptions(exchange_fraction=fraction, epoch_copy=copy, exchange_buffer_bytes=512)


def _dataset(copy: bool, fraction: float = 0.25, n: int = ROWS) -> ShardedResidentDataset:
    x = (2 * np.arange(n, dtype=np.float32))[:, None]  # x is twice the row number
    return ShardedResidentDataset(x, np.arange(n), per_replica_batch_size=4, seed=5,
                                  load_options=_options(copy, fraction))


def _held(ds: ShardedResidentDataset) -> list[set[int]]:
    """Per replica, the rows its device holds (the `y` column, read back; a
    buffer's slots past its shard's count are padding)."""
    shards = sorted(ds.tables[1].addressable_shards, key=lambda s: s.index[0].start)
    return [set(np.asarray(s.data)[: ds.eval_plan.shard_rows(g)].tolist())
            for g, s in enumerate(shards)]


def _replica_rows(epoch) -> list[set[int]]:
    """Per replica, the rows its part of each full step's batch took."""
    out: list[set[int]] = [set() for _ in range(epoch.num_replicas_in_sync)]
    for step in range(epoch.full_steps):
        y = epoch.batch(step).y
        for shard in y.addressable_shards:
            g = shard.index[0].start // epoch.per_replica_batch_size
            out[g] |= set(np.asarray(shard.data).tolist())
    return out


def _emitted(epoch) -> np.ndarray:
    return np.concatenate([np.asarray(batch.y) for _, batch in epoch])


@pytest.mark.parametrize("copy", [False, True])
@pytest.mark.parametrize("num_devices", [2, 4])
def test_each_epoch_holds_the_neutral_rows_and_uses_each_once(replicas, num_devices, copy):
    replicas(num_devices)
    fraction = 0.5 if num_devices == 4 else 0.25
    ds = _dataset(copy, fraction)
    assert ds.epoch_copy is copy and not ds.order_is_global and ds.order_is_replayable
    loaded = _exchange.initial_layout(ds.eval_plan)
    before = _held(ds)
    for e in range(4):
        epoch = ds.epoch(e)
        emitted = _emitted(epoch)
        assert sorted(emitted.tolist()) == list(range(ROWS))  # every row once
        held = _held(ds)
        want = _exchange.holdings(
            _exchange.partial_targets(loaded, fraction, 5, range(e + 1), ROWS), num_devices
        )
        assert held == [set(w.tolist()) for w in want]  # the neutral function's rows
        for took, has in zip(_replica_rows(epoch), held, strict=True):
            assert took <= has  # each replica trains on rows its device holds
        changed = sum(len(now - then) for now, then in zip(held, before, strict=True))
        expected = fraction * (1 - 1 / num_devices) * ROWS
        assert 0 < changed and abs(changed - expected) < 0.1 * ROWS, (changed, expected)
        assert sorted(int(r) for h in held for r in h) == list(range(ROWS))  # none lost
        columns = [np.asarray(t).reshape(-1) for t in ds.tables]
        np.testing.assert_array_equal(columns[0], 2 * columns[1])  # columns moved together
        evaluation = ds.epoch(e, training=False)  # each replica evaluates what it holds
        assert sorted(_emitted(evaluation).tolist()) == list(range(ROWS))
        evaluation.close()
        epoch.close()
        before = held


@pytest.mark.parametrize("copy", [False, True])
def test_epochs_opened_out_of_turn_equal_epochs_in_turn(replicas, copy):
    """A resumed run opens its epoch on a fresh dataset: the holdings of the
    epochs before are replayed, so it trains on what the uninterrupted run did."""
    replicas(2)
    straight = _dataset(copy)
    batches = []
    for e in range(4):
        epoch = straight.epoch(e)
        batches.append(_emitted(epoch))
        epoch.close()
    resumed = _dataset(copy)
    for e in (3, 1, 1, 2):  # out of turn, back, the same again, forward
        epoch = resumed.epoch(e)
        np.testing.assert_array_equal(_emitted(epoch), batches[e])
        epoch.close()
    inside = _dataset(copy).epoch(2, first_step=100)  # resumed inside the epoch
    np.testing.assert_array_equal(_emitted(inside), batches[2][100 * 8:])


def test_an_epoch_opened_again_moves_nothing(replicas):
    replicas(2)
    ds = _dataset(False)
    first = ds.epoch(1)
    again = ds.epoch(1)  # the rows are where epoch 1 needs them: nothing donated
    assert not first.closed
    np.testing.assert_array_equal(_emitted(first), _emitted(again))
    ds.epoch(2)  # rows move: the epochs that read them close
    assert first.closed and again.closed


def test_a_copy_counts_the_in_place_staging_not_an_all_to_all(replicas):
    replicas(2)
    x = np.zeros((1000, 4), np.float32)  # 16 bytes a row, 500 a replica, 50 steps of 10
    opts = LoadOptions(device_memory_bytes=2**30, epoch_copy=True, exchange_buffer_bytes=640,
                       exchange_fraction=0.25)
    ds = ShardedResidentDataset(x, per_replica_batch_size=10, seed=0, load_options=opts)
    # Rows, their copy, and a round's staging: 10 rows a pair, sent and received, 2 replicas.
    assert [r.needed_bytes for r in ds.memory_reports] == [500 * 16 * 2 + 640] * 2
    # A large buffer: no more than a replica's pool (125 rows, rounded to 128) a pair.
    large = LoadOptions(device_memory_bytes=2**30, epoch_copy="auto", exchange_fraction=0.25)
    ds = ShardedResidentDataset(x, per_replica_batch_size=10, seed=0, load_options=large)
    assert ds.epoch_copy
    assert [r.needed_bytes for r in ds.memory_reports] == [500 * 16 * 2 + 2 * 2 * 128 * 16] * 2


@pytest.mark.parametrize("copy", [False, True])
def test_fit_trains_and_evaluate_and_predict_see_every_row(copy):
    x, y = regression_data(403)
    with fit_replicas(2):
        model = mlp()
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, seed=3,
                                    load_options=_options(copy))
        history = shardfeed.fit(model, ds, epochs=4, verbose=0)
        loss = history.history["loss"]
        assert loss[-1] < 0.5 * loss[0]
        assert jax.tree.leaves(ds.tables)  # rows moved in place, still there
        got = shardfeed.predict(model, ds, verbose=0)  # in the original order
        np.testing.assert_allclose(got, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
        evaluated = shardfeed.evaluate(model, ds, verbose=0, return_dict=True)["loss"]
        np.testing.assert_allclose(evaluated, model.evaluate(x, y, verbose=0, batch_size=403)[0],
                                   rtol=1e-5)


def _fit_mixed(callbacks):
    x, y = regression_data(600)
    with fit_replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=25, seed=1,
                                    load_options=_options(False))
        model = mlp()
        shardfeed.fit(model, ds, epochs=3, callbacks=callbacks, verbose=0,
                      options=shardfeed.FitOptions(steps_per_execution=2))
    return model


def test_a_backup_resumed_inside_an_epoch_equals_the_uninterrupted_run(tmp_path):
    straight = _fit_mixed([])
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        _fit_mixed([keras.callbacks.BackupAndRestore(backup, save_freq=4), Preempt(1, 9)])
    resumed = _fit_mixed([keras.callbacks.BackupAndRestore(backup, save_freq=4)])
    for a, b in zip(resumed.get_weights(), straight.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
