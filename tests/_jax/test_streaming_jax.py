"""Streaming on JAX: a shard that does not fit streams through a two-slot ring.

A streamed epoch emits the same batches, in the same order, as a resident
one of the same dataset and seed (every placement and shuffle, 1 and 2
devices, several chunks and a short last one, files read in windows,
`augment` keyed on the epoch's own step); `fit`, `evaluate` and `predict`
give the resident results, and a `ResidentIterator` resumed mid-chunk the
resident batches; `"auto"` streams a shard the memory check says does not
fit, and logs it; the device holds the ring, not the rows
(`jax.live_arrays()`); what is refused names the fix.
"""

from __future__ import annotations

import logging
import types

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from _helpers_fit import mlp, regression_data, train_and_predict
from _helpers_jax import ORDERS, rows_of, run_jax_processes

import shardfeed
from shardfeed import files
from shardfeed._data.options import LoadOptions
from shardfeed._jax.dataset import ShardedResidentDataset
from shardfeed._jax.loop import schedule
from shardfeed._jax.streaming import StreamedEpoch

ROW_BYTES = 2 * 4 + 8  # x: float32[2], y: int64 (counted as given; held as int32)


def _stream(chunk_rows: int, **kwargs) -> LoadOptions:
    return LoadOptions(streaming=True, stream_chunk_bytes=chunk_rows * ROW_BYTES, **kwargs)


def _dataset(options=None, n=103, b=4, x=None, **kwargs):
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2) if x is None else x
    return ShardedResidentDataset(x, np.arange(n), per_replica_batch_size=b, seed=7,
                                  load_options=options, **kwargs)


def _batches(epoch):
    return [(step, np.asarray(batch.x), np.asarray(batch.y)) for step, batch in epoch]


@pytest.mark.parametrize("num_devices", [1, 2])
@pytest.mark.parametrize(("placement", "shuffle"), ORDERS)
def test_streamed_batches_equal_the_resident_ones(replicas, num_devices, placement, shuffle):
    replicas(num_devices)
    resident = _dataset(n=111, shuffle=shuffle, placement=placement)
    # 4 steps a chunk: 111 rows make 27 (1 device) or 13 (2) full steps, so
    # several chunks and a short last one, then a partial step.
    streamed = _dataset(_stream(16), n=111, shuffle=shuffle, placement=placement)
    assert (resident.is_streaming, streamed.is_streaming) == (False, True)
    for e in range(2):
        for training in (True, False):
            r, s = resident.epoch(e, training=training), streamed.epoch(e, training=training)
            assert isinstance(s, StreamedEpoch) and s.chunk_steps == 4
            assert s.num_chunks > 2 and s.full_steps % 4 != 0  # a short last chunk
            got, want = _batches(s), _batches(r)
            assert [g[0] for g in got] == [w[0] for w in want]
            for (_, gx, gy), (_, wx, wy) in zip(got, want, strict=True):
                np.testing.assert_array_equal(gy, wy)
                np.testing.assert_array_equal(gx, wx)
            np.testing.assert_array_equal(s.slot_rows(), r.slot_rows())
            s.close()


def test_rows_read_from_a_file_in_windows(replicas, tmp_path):
    replicas(2)
    n = 103
    np.save(tmp_path / "x.npy", np.arange(n * 2, dtype=np.float32).reshape(n, 2))
    x = files.npy(tmp_path / "x.npy")  # not an ndarray: ranged reads, 5 rows a window
    streamed = _dataset(_stream(12, chunk_bytes=5 * 8), x=x)
    resident = _dataset()
    for e in range(2):
        np.testing.assert_array_equal(rows_of(streamed.epoch(e)), rows_of(resident.epoch(e)))
        for _, batch in streamed.epoch(e):
            np.testing.assert_array_equal(np.asarray(batch.x)[:, 0], 2 * np.asarray(batch.y))


def test_augment_keys_on_the_epochs_own_step(replicas):
    replicas(2)

    def augment(x, key):
        return x + jax.random.uniform(key, x.shape)

    resident = _dataset(augment=augment)
    streamed = _dataset(_stream(12), augment=augment)
    for (_, s), (_, r) in zip(streamed.epoch(1, augment=True), resident.epoch(1, augment=True),
                              strict=True):
        np.testing.assert_allclose(np.asarray(s.x), np.asarray(r.x), rtol=1e-6)


def test_calls_never_cross_a_chunk(replicas):
    replicas(1)
    epoch = _dataset(_stream(12)).epoch(0)  # 25 full steps, chunks of 3
    pieces = [p for c in schedule(epoch, 2) for p in c.pieces]
    # Keras' cells of 2 steps; the one across step 3 runs as two pieces.
    assert pieces[:4] == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert all(a // 3 == (b - 1) // 3 for a, b in pieces[:-1])
    assert pieces[-1] == (25, 26) and epoch.call_bounds == list(range(0, 25, 3))


@pytest.mark.parametrize(
    ("full_steps", "partial", "k", "chunk", "hooks"),
    [
        (6, True, 3, None, [(0, 2), (3, 5), (6, 8)]),  # 100 rows, batch 16: Keras' 2, 5, 8
        (6, True, 101, None, [(0, 100)]),  # the partial step joins the one short call
        (7, True, 3, None, [(0, 2), (3, 5), (6, 8)]),  # 1 full step + the partial: one call
        (6, False, 4, None, [(0, 3), (4, 7)]),  # a shorter last full call
        (5, False, 2, 3, [(0, 1), (2, 3), (4, 5)]),  # a chunk cuts a call into pieces only
    ],
)
def test_batch_hooks_number_the_calls_as_keras(full_steps, partial, k, chunk, hooks):
    epoch = types.SimpleNamespace(
        steps=full_steps + partial, full_steps=full_steps, has_partial_step=partial,
        call_bounds=list(range(0, full_steps, chunk or full_steps)),
    )
    calls = schedule(epoch, k)
    assert [(c.begin_step, c.end_step) for c in calls] == hooks
    assert sum(b - a for c in calls for a, b in c.pieces) == full_steps + partial


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def test_fit_evaluate_predict_equal_the_resident_run(replicas):
    # The global order on 2 devices (the other orders: the batches' test above).
    replicas(2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1001, 8)).astype(np.float32)
    y = (x @ rng.normal(size=(8, 1))).astype(np.float32)
    opts = shardfeed.FitOptions(steps_per_execution=4)
    results = []
    for options in (None, LoadOptions(streaming=True, stream_chunk_bytes=10 * 16 * 36)):
        model = _model()
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, seed=3,
                                    load_options=options)
        history = shardfeed.fit(model, ds, epochs=2, verbose=0, options=opts,
                                validation_data=(x[:300], y[:300]))
        loss = shardfeed.evaluate(model, ds, verbose=0, options=opts)
        pred = shardfeed.predict(model, ds, options=opts)
        results.append((history.history, loss, pred, model.get_weights()))
    (h1, l1, p1, w1), (h2, l2, p2, w2) = results
    for key in h1:
        np.testing.assert_allclose(h2[key], h1[key], rtol=1e-5)
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    np.testing.assert_allclose(p2, p1, rtol=1e-5, atol=1e-6)
    for a, b in zip(w2, w1, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_auto_streams_what_does_not_fit_and_logs_it(replicas, caplog):
    replicas(2)
    # `device_memory_bytes` is per device: 800 usable bytes each, so a slot of
    # 400 bytes is 6 steps of 4 rows of 16 bytes.
    small = LoadOptions(device_memory_bytes=1000, stream_chunk_bytes=10**6)
    with caplog.at_level(logging.WARNING, logger="shardfeed"):
        ds = _dataset(small)
    assert ds.is_streaming and ds.nbytes_on_device == 0
    assert "does not fit" in caplog.text and "streaming it in chunks of 24 rows" in caplog.text
    # The memory check counts the ring: two slots of 24 rows a replica, no rows.
    assert [r.needed_bytes for r in ds.memory_reports] == [2 * 24 * ROW_BYTES] * 2
    assert all(r.fits for r in ds.memory_reports)
    np.testing.assert_array_equal(np.sort(rows_of(ds.epoch(0))), np.arange(103))
    with pytest.raises(MemoryError, match="stream the shard"):
        _dataset(LoadOptions(device_memory_bytes=1000, streaming=False))
    assert not _dataset(LoadOptions(device_memory_bytes=10**6)).is_streaming


def _live_bytes() -> int:
    return sum(a.nbytes for a in jax.live_arrays())


@pytest.mark.parametrize("streaming", [True, False])
def test_the_device_holds_the_ring_not_the_rows(replicas, streaming):
    replicas(2)
    n, slot_rows = 20_000, 512
    x = np.random.default_rng(0).normal(size=(n, 8)).astype(np.float32)
    row_bytes = 8 * 4 + 4  # x and its first column as y
    ring = 2 * 2 * slot_rows * row_bytes  # two slots on each of 2 replicas
    model = _model()
    model.build((None, 8))
    before = _live_bytes()
    options = LoadOptions(streaming=streaming, stream_chunk_bytes=slot_rows * row_bytes,
                          epoch_copy=False)
    ds = ShardedResidentDataset(x, x[:, 0], per_replica_batch_size=256, seed=0,
                                load_options=options)
    peaks = []

    class Peak(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            peaks.append(_live_bytes())

    shardfeed.fit(model, ds, epochs=1, verbose=0, callbacks=[Peak()],
                  options=shardfeed.FitOptions(steps_per_execution=2))
    for _, _batch in ds.epoch(1):
        peaks.append(_live_bytes())
    # Beside the ring: the model's state (Adam, a few KB) and a step's batch.
    bound = before + ring + 256 * 1024
    if streaming:
        assert max(peaks) <= bound, (max(peaks) - before, ring)
    else:  # the control: resident rows are 720 KB, past the ring's 74 KB and the slack
        assert max(peaks) > bound


def test_refusals_name_the_fix(replicas):
    replicas(1)
    with pytest.raises(ValueError, match=r"keeps no per-epoch copy.*Received: "
                       r"LoadOptions\(streaming=True, epoch_copy=True\).*epoch_copy=\"auto\""):
        _dataset(LoadOptions(streaming=True, epoch_copy=True))
    with pytest.raises(ValueError, match=r"Received: LoadOptions\(streaming=\"auto\", "
                       r"epoch_copy=True\)"):
        _dataset(LoadOptions(device_memory_bytes=1000, epoch_copy=True))
    replicas(2)
    with pytest.raises(ValueError, match=r"a partial exchange has no role.*Received: "
                       r"LoadOptions\(streaming=True, exchange_fraction=0.5\).*"
                       r"Leave `exchange_fraction=1`"):
        _dataset(_stream(12, exchange_fraction=0.5))
    epoch = _dataset(_stream(12)).epoch(0)
    with pytest.raises(TypeError, match=r"traced step.*epoch.call_arrays\(start, stop\)"):
        jax.jit(lambda i: epoch.batch(i).y)(jnp.int32(0))
    with pytest.raises(ValueError, match=r"within one chunk.*Received: start=2, stop=4.*"
                       r"Cut calls at `epoch.call_bounds`"):
        epoch.call_arrays(2, 4)
    with pytest.raises(ValueError, match=r"Received: arrays=None.*epoch.call_arrays"):
        epoch.batch_fn(epoch.arrays, 0)
    epoch.close()
    with pytest.raises(RuntimeError, match=r"closed.*Open the epoch again"):
        epoch.batch(0)


def test_a_custom_jitted_loop_over_chunks(replicas):
    replicas(2)
    ds = _dataset(_stream(12))
    epoch = ds.epoch(0, training=False)
    total = jax.jit(lambda arrays, step: jnp.sum(epoch.batch_fn(arrays, step).y))
    sums = [int(total(epoch.call_arrays(s, s + 1), jnp.int32(s))) for s in range(epoch.full_steps)]
    partial = epoch.partial_batch()
    assert sum(sums) + int(np.sum(np.asarray(partial.y))) == sum(range(103))


def test_a_resumed_iterator_streams_the_resident_batches(replicas):
    replicas(2)
    resident, streamed = _dataset(), _dataset(_stream(12))
    want = [np.asarray(b.y) for epoch in resident.iterator().epochs(2) for _, b in epoch]
    it = streamed.iterator()
    got = []
    for epoch in it.epochs(2):
        for step, batch in epoch:
            got.append(np.asarray(batch.y))
            if step == 5:
                break
        break
    state = it.get_state()  # mid-epoch, mid-chunk: a fresh iterator resumes there
    again = _dataset(_stream(12)).iterator()
    again.set_state(state)
    got += [np.asarray(b.y) for epoch in again.epochs(2) for _, b in epoch]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


# The two-process checks, both in one job (one jax.distributed job, not two: CI
# time): `sys.argv[1:3]` are the coordinator's port and the process id
# (`run_jax_processes`).
PROCESSES = """
import json, sys
sys.path.insert(0, "tests/_jax")
import jax
port, pid = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, coordinator_bind_address=f"127.0.0.1:{port}",
                           initialization_timeout=60)
import shardfeed
from _helpers_fit import mlp, regression_data, train_and_predict
x, y = regression_data(1003)
# Only rank 1 has little memory (free memory differs per host).
small = 2_000 if pid == 1 else None
def build(**kwargs):
    return shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=8, seed=3,
        load_options=shardfeed.LoadOptions(device_memory_bytes=small, **kwargs))
ds = build()
history = shardfeed.fit(mlp(), ds, epochs=1, verbose=0)
try:
    build(streaming=False)
    refused = None
except MemoryError as err:
    refused = str(err)
agree = {"streaming": ds.is_streaming, "slot_rows": ds._slot_rows,
         "loss": history.history["loss"], "refused": refused}
options = shardfeed.LoadOptions(streaming=True, stream_chunk_bytes=3 * 8 * 36)
stream = [train_and_predict(shardfeed, load_options=options) for _ in range(3)]
print("RESULT " + json.dumps({"agree": agree, "stream": stream}))
"""


@pytest.fixture(scope="module")
def two_processes() -> list[dict]:
    return run_jax_processes(PROCESSES)


def test_two_processes_stream_when_one_rank_must(two_processes, replicas):
    """Under `streaming="auto"` rank 1's shard does not fit: both ranks stream
    with the same chunks (rank 1 alone streamed and the job hung until its
    timeout), and `streaming=False` is refused on both, naming rank 1."""
    results = [r["agree"] for r in two_processes]
    replicas(4)
    x, y = regression_data(1003)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, seed=3)
    expected = shardfeed.fit(mlp(), ds, epochs=1, verbose=0).history["loss"]
    for result in results:
        # 800 usable bytes a slot on rank 1's devices: 2 steps of 8 rows of 36 bytes.
        assert result["streaming"] and result["slot_rows"] == 16
        np.testing.assert_allclose(result["loss"], expected, rtol=1e-5)
        assert "free memory on rank 1's " in result["refused"]
        assert "Received: rank 1: needed_bytes=" in result["refused"]


def test_two_processes_fit_evaluate_predict_streamed_rows(two_processes, replicas):
    """Three streamed fit/evaluate/predict runs on each of two processes give
    the one-process results (the upload thread's `device_put` onto the mesh
    was a collective that crossed the main thread's: 6 of 8 runs hung or
    failed in `evaluate`'s weights check)."""
    results = [r["stream"] for r in two_processes]
    replicas(4)
    expected = train_and_predict(shardfeed)
    for runs in results:
        for result in runs:
            for name in ("history", "evaluate"):
                for key, value in expected[name].items():
                    np.testing.assert_allclose(result[name][key], value, rtol=1e-5, err_msg=key)
            np.testing.assert_allclose(result["predict"], expected["predict"], rtol=1e-5,
                                       atol=1e-6)
