"""Streaming: shards too large for the device flow through a two-slot ring,
with the same API and the same per-epoch coverage as resident mode."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
from _helpers import mirrored_strategy
from keras import layers

import shardfeed
from shardfeed import FitOptions, LoadOptions, ShardedResidentDataset

ROWS = 1003


def _data(rows=ROWS):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    return x, y


def _model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((5,)), layers.Dense(8, activation="relu"), layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def _stream(chunk_rows_bytes=40 * 24, **kwargs):
    # 24 bytes per row (5 float32 x + 1 float32 y): chunks of 40 rows = 4 steps of 10.
    return LoadOptions(
        streaming=True, stream_chunk_bytes=chunk_rows_bytes, chunk_bytes=64, **kwargs
    )


def test_streamed_fit_equals_resident_fit_in_row_order():
    x, y = _data()
    resident, streamed = _model(), _model()
    opts = FitOptions(jit_compile=False, steps_per_execution=3)
    shardfeed.fit(
        resident,
        ShardedResidentDataset(x, y, per_replica_batch_size=10, shuffle=False),
        epochs=2,
        verbose=0,
        options=opts,
    )
    ds = ShardedResidentDataset(
        x, y, per_replica_batch_size=10, shuffle=False, load_options=_stream()
    )
    assert ds.is_streaming and ds.stream.chunk_rows == 40
    assert ds.stores[0].variables[0].shape[0] == 80  # two slots, not 1,003 rows
    hist = shardfeed.fit(streamed, ds, epochs=2, verbose=0, options=opts)
    for a, b in zip(resident.get_weights(), streamed.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(hist.history["loss"]) == 2


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_each_row_once_per_epoch_with_two_level_shuffle(drop_remainder):
    x, y = _data()
    ds = ShardedResidentDataset(
        x,
        y,
        per_replica_batch_size=10,
        seed=4,
        shuffle="local",  # streamed shards shuffle chunk, then row
        drop_remainder=drop_remainder,
        load_options=_stream(),
    )
    plan = ds.plan
    used = plan.used_rows_per_epoch

    def rows(epoch):
        order = ds.epoch_order(epoch, training=True)
        try:
            return order.rows(0)[:used].tolist()
        finally:
            order.close()

    epoch0, epoch1 = rows(0), rows(1)
    assert len(set(epoch0)) == used == ROWS - plan.dropped_rows_per_epoch
    assert epoch0 != epoch1 and rows(0) == epoch0
    # The short last chunk (1,003 = 25 x 40 + 3 rows) comes last in every epoch.
    assert set(epoch0[1000:]) <= {1000, 1001, 1002}


def test_streamed_evaluate_and_predict_are_exact():
    x, y = _data()
    model = _model()
    ds = ShardedResidentDataset(
        x, y, per_replica_batch_size=16, seed=0, shuffle="local", load_options=_stream()
    )
    shardfeed.fit(model, ds, epochs=1, verbose=0)
    got = shardfeed.evaluate(model, ds, return_dict=True)
    want = model.evaluate(x, y, batch_size=ROWS, verbose=0, return_dict=True)
    np.testing.assert_allclose([got["loss"], got["mae"]], [want["loss"], want["mae"]], rtol=1e-5)
    np.testing.assert_allclose(
        shardfeed.predict(model, ds), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6
    )


def test_a_shard_that_does_not_fit_streams_automatically(caplog):
    x, y = _data()
    with caplog.at_level(logging.WARNING, logger="shardfeed"):
        ds = ShardedResidentDataset(
            x,
            y,
            per_replica_batch_size=10,
            seed=0,
            shuffle="local",
            load_options=LoadOptions(device_memory_bytes=5_000, memory_fraction=1.0),
        )
    assert ds.is_streaming
    # Two slots must fit in 5,000 bytes: 2 x 10 steps x 10 rows x 24 bytes = 4,800.
    assert ds.stream.chunk_rows == 100
    (record,) = caplog.records
    # Resident, the rows (1,003 x 24 bytes), the rows one replica's calls gather
    # at once and their positions (the epoch's 101 steps of 10, 4 bytes a slot)
    # would need 52,352 bytes.
    assert record.getMessage() == (
        "shardfeed: the shard does not fit (needed_bytes=52,352 (0.00 GiB), "
        "free_bytes=5,000 (0.00 GiB, from given), usable_bytes=5,000); streaming it in "
        "chunks of 100 rows through two slots per replica."
    )
    model = _model()
    shardfeed.fit(model, ds, epochs=1, verbose=0)


@pytest.mark.multi_device
def test_streaming_on_two_replicas_with_uneven_shards_is_exact():
    strategy = mirrored_strategy(2)
    x, y = _data()
    with strategy.scope():
        model = _model()
        ds = ShardedResidentDataset(
            x, y, per_replica_batch_size=10, seed=1, shuffle="local", load_options=_stream()
        )
    shardfeed.fit(model, ds, epochs=1, verbose=0)
    plain = _model()
    plain.set_weights(model.get_weights())
    got = shardfeed.evaluate(model, ds, return_dict=True)
    want = plain.evaluate(x, y, batch_size=ROWS, verbose=0, return_dict=True)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    np.testing.assert_allclose(
        shardfeed.predict(model, ds), plain.predict(x, verbose=0), rtol=1e-5, atol=1e-6
    )


def test_streaming_needs_shard_placement_and_room_for_two_steps():
    x, y = _data()
    with pytest.raises(ValueError) as err:
        ShardedResidentDataset(
            x,
            y,
            per_replica_batch_size=10,
            shuffle=False,
            placement="replicate",
            load_options=_stream(),
        )
    assert str(err.value).startswith(
        "Streaming needs placement='shard' (each replica streams its own rows). Received: "
        "placement='replicate'."
    )
    with pytest.raises(MemoryError) as err:
        ShardedResidentDataset(
            x,
            y,
            per_replica_batch_size=10,
            shuffle=False,
            load_options=_stream(100, device_memory_bytes=10**9),
        )
    assert str(err.value) == (
        "Streaming needs room for two chunks of at least one step each. Received: "
        "per_replica_batch_size=10, row_bytes=24, usable_bytes=800000000, "
        "stream_chunk_bytes=100. "
        "Lower `per_replica_batch_size`, store a compact dtype, or use more replicas."
    )
