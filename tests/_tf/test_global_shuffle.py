"""The global shuffle of sharded rows on 1-4 replicas in one process.

`placement="shard"` with `shuffle=True` must train exactly as
`placement="replicate"` and as one replica with batch N*b on the same order,
while each replica holds only 1/N of the rows: the per-epoch exchange moves
every row the next epoch needs to its replica, all columns together.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from _helpers import strategy_of
from _helpers_global_shuffle import build_model, data, scale

import shardfeed
from shardfeed import LoadOptions, ShardedResidentDataset, files
from shardfeed._data import exchange as _exchange
from shardfeed._data.formats import base as _formats_base

pytestmark = pytest.mark.multi_device

ROWS = 1001  # uneven shards on 2, 3 and 4 replicas, and a partial last step
SMALL_BUFFER = LoadOptions(exchange_buffer_bytes=4_000)  # many rounds per exchange


_strategy = strategy_of


class _EpochWeights(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = []

    def on_epoch_end(self, epoch, logs=None):
        self.weights.append(self.model.get_weights())


def _train(replicas, b, placement, options=None, shuffle=True):
    x, y, w = data(ROWS)
    with _strategy(replicas).scope():
        model = build_model()
        ds = ShardedResidentDataset(
            x, y, w, per_replica_batch_size=b, seed=11, placement=placement,
            transform=scale, load_options=options, shuffle=shuffle,
        )
    record = _EpochWeights()
    shardfeed.fit(model, ds, epochs=3, verbose=0, callbacks=[record])
    return record.weights, ds, model


# 3: uneven shards; 4: rounds over more pairs. 2 replicas run in
# test_global_shuffle_workers.py (two workers) and the JAX tier.
@pytest.mark.parametrize("replicas", [3, 4])
def test_sharded_global_order_trains_as_replicated_and_as_one_replica(replicas):
    b = 32
    sharded, ds, model = _train(replicas, b, "shard", SMALL_BUFFER)
    replicated, _, _ = _train(replicas, b, "replicate")
    single, _, _ = _train(1, b * replicas, "shard")
    for epoch in range(3):
        for got, rep, one in zip(sharded[epoch], replicated[epoch], single[epoch], strict=True):
            np.testing.assert_allclose(got, rep, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(got, one, rtol=1e-5, atol=1e-6)
    # Each replica still holds only its shard's worth of rows.
    assert [s.variables[0].shape[0] for s in ds.stores] == [
        ds.plan.shard_rows(r) for r in range(replicas)
    ]
    reports = ds.exchange.reports
    assert [r.epoch for r in reports] == [0, 1, 2]
    assert all(r.rounds > 1 and min(r.rows_sent) > 0 for r in reports)
    # Packing and unpacking are traced once, in the first exchange, not per round.
    assert [r.traces for r in reports] == [2, 0, 0]
    # After the exchanges, evaluate and predict see every row once, in order (on this fit's
    # dataset: a fit of its own for them cost CI 8 s and moved the rows the same way).
    x, y, w = data(ROWS)
    got = shardfeed.predict(model, ds)
    want = model.predict(scale(x), batch_size=ROWS, verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    loss = shardfeed.evaluate(model, ds, return_dict=True)["loss"]
    # Keras' weighted mse: sum of w * squared error over all rows, / rows.
    ref = float(np.sum(w * np.mean((want - y) ** 2, axis=1)) / ROWS)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)


# 3: uneven shards, rounds over several pairs. 2 replicas run the same exchange with one
# pair: in test_global_shuffle_workers.py (two workers) and the JAX tier (test_training_jax.py).
@pytest.mark.parametrize("replicas", [3])
def test_rows_in_order_on_sharded_replicas_train_as_one_replica_with_n_b(replicas):
    """`shuffle=False`: global batch k is one replica's batch k of N*b (rows
    k*N*b...), not each shard's k-th batch: the rows move once, before the
    first training epoch, and stay; `predict` still returns them in order."""
    b = 32
    sharded, ds, _ = _train(replicas, b, "shard", SMALL_BUFFER, shuffle=False)
    replicated, _, _ = _train(replicas, b, "replicate", shuffle=False)
    single, _, _ = _train(1, b * replicas, "shard", shuffle=False)
    for epoch in range(3):
        for got, rep, one in zip(sharded[epoch], replicated[epoch], single[epoch], strict=True):
            np.testing.assert_allclose(got, rep, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(got, one, rtol=1e-5, atol=1e-6)
    assert ds.order_is_global
    sent = [max(r.rows_sent) for r in ds.exchange.reports]
    assert sent[0] > 0 and sent[1:] == [0, 0]  # moved once; the order never changes
    assert [s.variables[0].shape[0] for s in ds.stores] == [
        ds.plan.shard_rows(r) for r in range(replicas)
    ]
    x, _, _ = data(ROWS)
    with ds.world.scope():
        model = build_model()
    model.set_weights(sharded[-1])
    got = shardfeed.predict(model, ds)
    np.testing.assert_allclose(
        got, model.predict(scale(x), batch_size=ROWS, verbose=0), rtol=1e-5, atol=1e-6
    )


def test_rows_in_order_that_cannot_move_warn_once_and_say_what_to_pass(caplog):
    x, y, _ = data(100)
    streamed = LoadOptions(streaming=True)
    shard_bytes = 50 * (6 * 4 + 4)
    tight = LoadOptions(device_memory_bytes=int(shard_bytes * 1.5 / 0.8))  # no room to stage
    for options in (streamed, tight):
        caplog.clear()
        with caplog.at_level("WARNING", logger="shardfeed"):
            ds = ShardedResidentDataset(x["a"], y, per_replica_batch_size=10, shuffle=False,
                                        load_options=options, strategy=_strategy(2))
        assert ds.exchange is None and not ds.order_is_global
        assert ds.is_streaming == (options is streamed)
        warned = [r.getMessage() for r in caplog.records if "shuffle=False" in r.getMessage()]
        assert len(warned) == 1
        assert "a global batch joins rows from 2 places of the data, not the batches one " \
            "replica with batch 20 takes" in warned[0]
        assert 'or pass placement="replicate"' in warned[0]
        rows = [ds.epoch_order(0, True).rows(r) for r in range(2)] if not ds.is_streaming else []
        assert [r[:3].tolist() for r in rows] in ([], [[0, 1, 2], [50, 51, 52]])


@pytest.mark.parametrize("drop_remainder", [False, True])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_each_row_used_exactly_once_per_epoch_with_all_its_columns(replicas, drop_remainder):
    ids = np.arange(ROWS)
    x = {"id": ids.astype("int64"), "twice": (2 * ids).astype("float32")}
    strategy = _strategy(replicas)
    args = dict(per_replica_batch_size=40, seed=3, drop_remainder=drop_remainder,
                strategy=strategy)
    ds = ShardedResidentDataset(x, ids.astype("int32"), (ids % 7).astype("float32"),
                                load_options=SMALL_BUFFER, **args)
    replicated = ShardedResidentDataset(x, placement="replicate", **args)
    plan, b = ds.plan, 40
    for epoch in range(3):
        order, reference = ds.epoch_order(epoch, True), replicated.epoch_order(epoch, True)
        used = []
        for local, store in enumerate(ds.stores):
            real = plan.full_steps_per_epoch * b + (
                plan.last_step_rows[store.replica] if plan.has_partial_step else 0
            )
            idx = tf.reshape(order.slice(0, plan.steps_per_epoch)[local], [-1])[:real]
            got_id, twice, label, weight = (tf.gather(v, idx).numpy() for v in store.variables)
            np.testing.assert_array_equal(twice, 2 * got_id)  # columns moved together
            np.testing.assert_array_equal(label, got_id)
            np.testing.assert_array_equal(weight, got_id % 7)
            np.testing.assert_array_equal(order.rows(local)[:real], got_id)
            np.testing.assert_array_equal(reference.rows(local)[:real], got_id)  # global order
            used.append(got_id)
        counts = np.bincount(np.concatenate(used), minlength=ROWS)
        assert counts.max() == 1 and counts.sum() == ROWS - plan.dropped_rows_per_epoch
    # The union of what the replicas hold is still every row, once.
    held = np.concatenate([s.variables[0].numpy()[: s.num_rows] for s in ds.stores])
    assert sorted(held.tolist()) == list(range(ROWS))


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_partial_exchange_mixes_a_fraction_and_uses_each_row_once(fraction):
    ids = np.arange(ROWS).astype("int64")
    ds = ShardedResidentDataset(
        ids, per_replica_batch_size=48, seed=1, strategy=_strategy(4),
        load_options=LoadOptions(exchange_fraction=fraction),
    )
    for epoch in range(2):
        order = ds.epoch_order(epoch, True)
        used = np.concatenate([order.rows(i)[: ds.plan.shard_rows(s.replica)]
                               for i, s in enumerate(ds.stores)])
        assert sorted(used.tolist()) == list(range(ROWS))
        moved = max(ds.exchange.reports[-1].rows_sent)
        assert 0 < moved < 250 * fraction * 1.2  # about fraction * 3/4 of a 250-row shard
        # The rows the neutral function gives each replica (what the JAX backend holds too).
        loaded = [np.arange(a, b) for a, b in ds.plan.shards]
        want = _exchange.partial_targets(loaded, fraction, 1, range(epoch + 1), ROWS)
        assert [sorted(h.tolist()) for h in ds.exchange.held] == [
            w.tolist() for w in _exchange.holdings(want, 4)
        ]
    held = [s.variables[0].numpy() for s in ds.stores]
    assert sorted(np.concatenate(held).tolist()) == list(range(ROWS))


def test_npy_shards_are_read_once_and_train_three_epochs_in_the_global_order(
    tmp_path, monkeypatch
):
    x, y, w = data(ROWS)
    paths = []
    for i, (start, stop) in enumerate([(0, 400), (400, ROWS)]):  # two shard files
        np.save(tmp_path / f"a{i}.npy", x["a"][start:stop])
        paths.append(tmp_path / f"a{i}.npy")
    reads = []
    original = _formats_base.RawArray._read_into

    def counting(self, start, stop, out):
        reads.append((self.source, start, stop))
        return original(self, start, stop, out)

    monkeypatch.setattr(_formats_base.RawArray, "_read_into", counting)
    source = files.concat([files.npy(p) for p in paths])
    with _strategy(2).scope():
        model = build_model()
        ds = ShardedResidentDataset(
            {"a": source, "b": x["b"]}, y, w, per_replica_batch_size=32, seed=11,
            transform=scale,
        )
    loaded = len(reads)
    assert sum(stop - start for _, start, stop in reads) == ROWS  # each row read once
    record = _EpochWeights()
    shardfeed.fit(model, ds, epochs=3, verbose=0, callbacks=[record])
    assert len(reads) == loaded  # three epochs, no file read again
    assert len(ds.exchange.reports) == 3
    reference, _, _ = _train(2, 32, "replicate")
    for got, want in zip(record.weights[-1], reference[-1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_refusals_name_the_way_out():
    x, y, _ = data(100)
    with pytest.raises(ValueError) as err:
        ShardedResidentDataset(x["a"], y, per_replica_batch_size=10, seed=0, shuffle="random")
    assert str(err.value) == (
        '`shuffle` must be True (the global order), "local" (each replica shuffles its own '
        "shard) or False (rows in order). Received: shuffle='random'. Pass shuffle=True, "
        'shuffle="local" or shuffle=False.'
    )
    with pytest.raises(ValueError, match='shuffle="local" needs placement="shard"'):
        ShardedResidentDataset(
            x["a"], y, per_replica_batch_size=10, seed=0, shuffle="local", placement="replicate"
        )
    with pytest.raises(ValueError) as err:
        ShardedResidentDataset(x["a"], y, per_replica_batch_size=10, seed=0,
                               load_options=LoadOptions(streaming=True), strategy=_strategy(2))
    assert "a streamed shard has no global order. Received: streaming=True, shuffle=True." in str(
        err.value
    )
    assert 'Pass shuffle="local" to stream' in str(err.value)
    # One replica holds every row: no exchange, so it streams (as before the global order).
    alone = ShardedResidentDataset(x["a"], y, per_replica_batch_size=10, seed=0,
                                   load_options=LoadOptions(streaming=True))
    assert alone.is_streaming and alone.exchange is None
    # The shard fits; shard plus staging does not.
    shard_bytes = 50 * (6 * 4 + 4)
    tight = LoadOptions(device_memory_bytes=int(shard_bytes * 1.5 / 0.8))
    with pytest.raises(MemoryError) as err:
        ShardedResidentDataset(x["a"], y, per_replica_batch_size=10, seed=0,
                               load_options=tight, strategy=_strategy(2))
    assert "plus a staging buffer of at most `LoadOptions.exchange_buffer_bytes`" in str(err.value)
    assert 'Pass shuffle="local"' in str(err.value)
    ShardedResidentDataset(x["a"], y, per_replica_batch_size=10, seed=0, shuffle="local",
                           load_options=tight, strategy=_strategy(2))  # fits without staging


@pytest.mark.parametrize(
    ("replicas", "placement", "shuffle"),
    [
        (2, "shard", True),  # shards plus the exchange's staging
        (3, "shard", True),
        (3, "shard", "local"),  # no exchange: shards only
        (3, "shard", False),  # rows in order move once: the same staging
        (2, "replicate", True),  # every row on every device, no staging
    ],
)
@pytest.mark.parametrize("buffer_bytes", [1_000, 256 * 2**20])  # capped / whole shards
def test_memory_plan_counts_what_the_dataset_checks(replicas, placement, shuffle, buffer_bytes):
    """`memory_plan` on one worker predicts the dataset's own fit check: the
    same bytes per device (shards and staging) against the same usable bytes."""
    x, y, _ = data(ROWS)
    device_memory = 200_000
    options = LoadOptions(device_memory_bytes=device_memory, exchange_buffer_bytes=buffer_bytes)
    ds = ShardedResidentDataset(
        x["a"], y, per_replica_batch_size=10, seed=0, shuffle=shuffle, placement=placement,
        load_options=options, strategy=_strategy(replicas),
    )
    plan = shardfeed.memory_plan(
        {"x": x["a"], "y": y}, num_workers=1, replicas_per_worker=replicas,
        per_replica_batch_size=10, placement=placement, shuffle=shuffle,
        device_memory_bytes=device_memory, exchange_buffer_bytes=buffer_bytes,
    )
    (rank,) = plan.ranks
    assert rank.needed_bytes == max(r.needed_bytes for r in ds.memory_reports)
    assert rank.usable_bytes == ds.memory_reports[0].usable_bytes
    assert rank.fits == all(r.fits for r in ds.memory_reports)


def test_one_sharded_replica_takes_the_global_order_without_an_exchange():
    """On one replica the shard is every row: `shuffle=True` is the same
    permutation `placement="replicate"` draws, with no exchange and no staging."""
    x, y, _ = data(100)
    shard = ShardedResidentDataset(x["a"], y, per_replica_batch_size=10, seed=3)
    replicate = ShardedResidentDataset(
        x["a"], y, per_replica_batch_size=10, seed=3, placement="replicate"
    )
    assert shard.exchange is None
    for epoch in range(3):
        np.testing.assert_array_equal(
            shard.epoch_order(epoch, True).rows(0), replicate.epoch_order(epoch, True).rows(0)
        )


def test_describe_says_sharded_rows_move_with_the_global_shuffle():
    x, y, _ = data(100)
    moving = ShardedResidentDataset(x["a"], y, per_replica_batch_size=10, seed=0,
                                    strategy=_strategy(2))
    assert "loaded replica 0 on " in repr(moving)
    assert repr(moving).endswith("shuffle=True: rows move between replicas each epoch")
    local = ShardedResidentDataset(x["a"], y, per_replica_batch_size=10, seed=0,
                                   shuffle="local", strategy=_strategy(2))
    assert "rows move" not in repr(local) and "loaded" not in repr(local)
    in_order = ShardedResidentDataset(x["a"], y, per_replica_batch_size=10, shuffle=False,
                                      strategy=_strategy(2))
    assert repr(in_order).endswith(
        "shuffle=False: rows move between replicas once, before the first training epoch, "
        "to follow one replica's batches"
    )
    # Validation data never trains: no move, and no staging counted for one.
    training, validation = in_order.split(0.5)
    assert training.exchange is not None and validation.exchange is None
    assert validation.memory_reports[0].needed_bytes < training.memory_reports[0].needed_bytes
