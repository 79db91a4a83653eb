"""Epochs without a copy on JAX: batches gathered from the one resident copy.

The same batches, in the same order, as the per-epoch copy in every placement
and shuffle on 1, 2 and 4 devices (the global order of sharded rows moved in
place in bounded rounds); evaluation after such moves still emits every row
once and `predict` keeps the original order; an epoch whose rows were moved
is closed, never read; what `"auto"` chooses and what the memory check counts.
"""

from __future__ import annotations

import jax
import keras
import numpy as np
import pytest
from _helpers_jax import ORDERS, rows_of

from shardfeed._data.options import LoadOptions
from shardfeed._jax.dataset import ShardedResidentDataset

GATHER = LoadOptions(epoch_copy=False, exchange_buffer_bytes=64)  # a few rows a round
COPY = LoadOptions(epoch_copy=True)


def _dataset(options, n=103, b=4, **kwargs):
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    return ShardedResidentDataset(x, np.arange(n), per_replica_batch_size=b, seed=7,
                                  load_options=options, **kwargs)


@pytest.mark.parametrize("num_devices", [1, 2, 4])
@pytest.mark.parametrize(("placement", "shuffle"), ORDERS)
def test_gathered_batches_equal_the_copys(replicas, num_devices, placement, shuffle):
    replicas(num_devices)
    gather = _dataset(GATHER, shuffle=shuffle, placement=placement)
    copy = _dataset(COPY, shuffle=shuffle, placement=placement)
    assert (gather.epoch_copy, copy.epoch_copy) == (False, True)
    for e in range(3):
        for training in (True, False):
            g, c = gather.epoch(e, training=training), copy.epoch(e, training=training)
            assert (g.arrays.positions is None, c.arrays.positions is None) == (False, True)
            emitted = rows_of(g)
            assert len(np.unique(emitted)) == len(emitted)
            np.testing.assert_array_equal(emitted, g.slot_rows())
            if training or placement == "replicate" or shuffle == "local":
                np.testing.assert_array_equal(emitted, rows_of(c))  # the same global batches
            else:  # after rows moved (in order too), each replica evaluates the rows it holds
                np.testing.assert_array_equal(np.sort(emitted), np.sort(rows_of(c)))
            for _, batch in g:  # x is the row's own x
                np.testing.assert_array_equal(np.asarray(batch.x)[:, 0],
                                              2 * np.asarray(batch.y))
            c.close()


def test_rows_move_in_place_without_a_second_copy(replicas):
    replicas(2)
    ds = _dataset(GATHER, n=1000, b=10)
    held = ds.nbytes_on_device
    epoch = ds.epoch(0)
    assert epoch.arrays.columns[0] is ds.tables[0]  # gathered from the resident rows
    pointers = _pointers(ds.tables)
    before = sum(a.nbytes for a in jax.live_arrays())
    second = ds.epoch(1)  # moves rows in place (donated): the same buffers
    assert _pointers(ds.tables) == pointers
    assert second.arrays.columns[0] is ds.tables[0]
    assert sum(a.nbytes for a in jax.live_arrays()) - before < held / 10
    assert ds.nbytes_on_device == held


def _pointers(tables) -> list[int]:
    return [s.data.unsafe_buffer_pointer() for t in tables for s in t.addressable_shards]


def test_moving_rows_closes_the_epochs_that_read_them(replicas):
    replicas(2)
    ds = _dataset(GATHER)
    first = ds.epoch(0)
    evaluation = ds.epoch(0, training=False)
    ds.epoch(1)
    for closed in (first, evaluation):
        assert closed.closed
        with pytest.raises(RuntimeError) as err:
            closed.batch(0)
        assert str(err.value).startswith(
            "This epoch is closed: its device data was let go of (`close()`, or the dataset "
            "moved its rows in place for a training epoch opened later). Received: epoch="
        )


def test_auto_copies_only_small_epochs_on_cpu(replicas):
    replicas(2)
    assert _dataset(LoadOptions()).epoch_copy is True  # 103 rows: the measured fast path
    assert _dataset(LoadOptions(epoch_copy_bytes=0)).epoch_copy is False
    # One replica, 103 rows of 16 bytes (1,648) and a copy of 104 slots (1,664):
    # the copy would not fit in 2,500 bytes, the positions (416) do.
    replicas(1)
    tight = LoadOptions(device_memory_bytes=2500, memory_fraction=1.0)
    assert _dataset(tight, shuffle=False).epoch_copy is False
    assert _dataset(LoadOptions(device_memory_bytes=4000, memory_fraction=1.0)).epoch_copy


def test_memory_counts_positions_and_staging_not_a_copy(replicas):
    replicas(2)
    x = np.zeros((1000, 4), np.float32)  # 16 bytes a row, 500 per replica, 50 steps of 10
    opts = LoadOptions(device_memory_bytes=2**30, epoch_copy=False, exchange_buffer_bytes=640)
    plain = ShardedResidentDataset(x, per_replica_batch_size=10, shuffle="local", seed=0,
                                   load_options=opts)
    assert [r.needed_bytes for r in plain.memory_reports] == [500 * 16 + 500 * 4] * 2
    mixed = ShardedResidentDataset(x, per_replica_batch_size=10, seed=0, load_options=opts)
    # Plus a round's staging: 10 rows a pair, sent and received, 2 replicas.
    assert [r.needed_bytes for r in mixed.memory_reports] == [500 * 16 + 500 * 4 + 640] * 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epoch_copy": "yes"}, r'`epoch_copy` must be True, False or "auto"\. Received: '
                                r"epoch_copy='yes'\. Use \"auto\""),
        ({"epoch_copy_bytes": -1}, r"`epoch_copy_bytes` must be a non-negative integer\. "
                                   r"Received: epoch_copy_bytes=-1\. Use e\.g\."),
    ],
)
def test_bad_epoch_copy_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoadOptions(**kwargs)


def test_fit_evaluate_predict_are_the_same_gathered(replicas):
    import shardfeed

    replicas(2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((203, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32))[:, None]
    results = []
    for options in (COPY, GATHER):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, seed=3, load_options=options)
        history = shardfeed.fit(model, ds, epochs=3, verbose=0)
        results.append((history.history["loss"], model.get_weights(),
                        shardfeed.evaluate(model, ds, verbose=0),
                        shardfeed.predict(model, ds, verbose=0)))
    (loss_c, w_c, ev_c, pred_c), (loss_g, w_g, ev_g, pred_g) = results
    np.testing.assert_allclose(loss_g, loss_c, rtol=1e-6)
    for a, b in zip(w_g, w_c, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ev_g, ev_c, rtol=1e-6)
    np.testing.assert_allclose(pred_g, pred_c, rtol=1e-6)  # rows in the original order
