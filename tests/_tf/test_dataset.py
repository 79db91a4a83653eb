"""ShardedResidentDataset on one device: what it holds, its epoch order, its errors."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

from shardfeed import LoadOptions, ShardedResidentDataset


def _xy(rows=103):
    x = np.arange(rows * 3, dtype="float32").reshape(rows, 3)
    y = np.arange(rows, dtype="int64")
    return x, y


def _rows_of_epoch(ds, epoch, training=True):
    """Global rows each step uses, real rows only (per replica, flattened)."""
    plan = ds.plan if training else ds.eval_plan
    b = plan.per_replica_batch_size
    order = ds.epoch_order(epoch, training)
    out = []
    for local, store in enumerate(ds.stores):
        real = plan.full_steps_per_epoch * b + (
            plan.last_step_rows[store.replica] if plan.has_partial_step else 0
        )
        out.append(order.rows(local)[:real].tolist())
    return out


def test_holds_rows_in_chunks_with_their_dtype():
    x, y = _xy()
    ds = ShardedResidentDataset(
        {"a": x, "b": x.astype("float16")},
        y.astype("uint8"),
        per_replica_batch_size=10,
        shuffle=False,
        load_options=LoadOptions(chunk_bytes=7 * 12),  # 7 rows of `a` per transfer
    )
    (store,) = ds.stores
    a, b, labels = store.variables
    np.testing.assert_array_equal(a.numpy(), x)
    assert b.dtype == tf.float16 and labels.dtype == tf.uint8
    np.testing.assert_array_equal(labels.numpy(), y.astype("uint8"))
    assert "CPU:0" in a.device
    assert ds.nbytes_on_device == x.nbytes + x.nbytes // 2 + len(y)
    text = ds.describe()
    assert "103 rows" in text and "11 steps/epoch" in text and "0 rows dropped/epoch" in text


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_each_row_once_per_epoch_and_seeded_order_repeats(drop_remainder):
    x, y = _xy()
    ds = ShardedResidentDataset(
        x, y, per_replica_batch_size=10, seed=3, drop_remainder=drop_remainder
    )
    epoch0 = _rows_of_epoch(ds, 0)[0]
    epoch1 = _rows_of_epoch(ds, 1)[0]
    expected_rows = 100 if drop_remainder else 103
    assert len(epoch0) == len(set(epoch0)) == expected_rows
    assert set(epoch0) <= set(range(103))
    assert epoch0 != epoch1  # epochs reshuffle
    again = ShardedResidentDataset(
        x, y, per_replica_batch_size=10, seed=3, drop_remainder=drop_remainder
    )
    assert _rows_of_epoch(again, 0)[0] == epoch0  # runs repeat
    assert ds.plan.dropped_rows_per_epoch == 103 - expected_rows
    assert sorted(_rows_of_epoch(ds, 0, training=False)[0]) == list(range(103))


def test_dropped_rows_are_reported_once(caplog):
    x, y = _xy()
    with caplog.at_level(logging.WARNING, logger="shardfeed"):
        ShardedResidentDataset(x, y, per_replica_batch_size=10, seed=0, drop_remainder=True)
    assert [r.getMessage() for r in caplog.records] == [
        "shardfeed: 3 of 103 rows are left out of each training epoch so every replica "
        "runs 10 equal steps (drop_remainder=True)."
    ]


def test_memory_check_runs_before_allocating():
    x, y = _xy(1000)
    with pytest.raises(MemoryError) as err:
        ShardedResidentDataset(
            x,
            y,
            per_replica_batch_size=10,
            shuffle=False,
            load_options=LoadOptions(
                device_memory_bytes=10_000, memory_fraction=0.5, streaming=False
            ),
        )
    assert str(err.value) == (
        "The resident data must fit in 50% of the free memory on /device:CPU:0 (the rest "
        "is headroom for the model). Received: needed_bytes=44,000 (0.00 GiB), "
        "free_bytes=10,000 (0.00 GiB, from given), usable_bytes=5,000. Spread the rows "
        "over more replicas with placement='shard' (more GPUs or workers), store a "
        "compact dtype (e.g. uint8 images, float16 features) and cast in `transform`, "
        "stream the shard (`LoadOptions(streaming=True)`), or raise "
        "`LoadOptions.memory_fraction` if the model is small."
    )


def test_shuffle_needs_a_seed():
    x, y = _xy()
    with pytest.raises(ValueError) as err:
        ShardedResidentDataset(x, y, per_replica_batch_size=10)
    assert str(err.value) == (
        "Shuffling requires a seed, so that every replica and every rerun draws the same "
        "epoch order. Received: shuffle=True, seed=None. Pass `seed=<int>`, or "
        "`shuffle=False` to keep the rows in order."
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        (
            {"y": np.zeros(99)},
            ValueError,
            "All arrays must have the same number of rows. Received: x has 103, y has 99. "
            "Trim or align the arrays so each row of x has its y (and sample_weight).",
        ),
        (
            {"y": {"out": np.zeros(103), "aux": np.zeros(5)}},
            ValueError,
            "Received: x has 103, y['aux'] has 5, y['out'] has 103.",
        ),
        (
            {"x": np.zeros((0, 3)), "y": None},
            ValueError,
            "A dataset needs at least one row. Received: num_rows=0. Check how the arrays "
            "were loaded or filtered.",
        ),
        (
            {"x": np.array([object(), object()], dtype=object), "y": None},
            TypeError,
            "Object (pickled) arrays cannot be uploaded to a device: their rows are Python "
            "objects, not numbers. Received: x.dtype=object.",
        ),
        (
            {"x": np.array(["a", "b"]), "y": None},
            TypeError,
            "Resident data must be numeric (bool, integer, float or complex). Received: "
            "x.dtype=<U1.",
        ),
        (
            {"per_replica_batch_size": 0},
            ValueError,
            "`per_replica_batch_size` must be an integer >= 1. Received: per_replica_batch_size=0.",
        ),
        (
            {"x": None},
            ValueError,
            "A dataset needs inputs. Received: x=None.",
        ),
        (
            {"transform": "scale"},
            TypeError,
            "`transform` must be a function of a batch's `x`. Received: type(transform)=str.",
        ),
    ],
)
def test_bad_input_errors(kwargs, error, text):
    x, y = _xy()
    args = {"x": x, "y": y, "per_replica_batch_size": 10, "shuffle": False, **kwargs}
    with pytest.raises(error) as err:
        ShardedResidentDataset(args.pop("x"), args.pop("y"), **args)
    assert text in str(err.value)


def test_check_finite_names_the_column_and_row():
    x, y = _xy()
    x[57, 1] = np.nan
    ShardedResidentDataset(x, y, per_replica_batch_size=10, shuffle=False)  # off by default
    with pytest.raises(ValueError) as err:
        ShardedResidentDataset(
            {"feat": x},
            y,
            per_replica_batch_size=10,
            shuffle=False,
            load_options=LoadOptions(check_finite=True, chunk_bytes=120),
        )
    assert str(err.value) == (
        "Inputs must be finite when `check_finite=True`. Received: x['feat'] row 57 holds "
        "NaN or inf. Clean or drop those rows before building the dataset, or pass "
        "`check_finite=False` to upload them as they are."
    )


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"chunk_bytes": 0}, "`chunk_bytes` must be a positive integer. Received: chunk_bytes=0."),
        (
            {"memory_fraction": 1.5},
            "`memory_fraction` must be in (0, 1]. Received: memory_fraction=1.5.",
        ),
        ({"device_memory_bytes": -1}, "Received: device_memory_bytes=-1."),
        # 1 == True: accepted before, then read as not `True` (not streamed).
        ({"streaming": 1}, '`streaming` must be True, False or "auto". Received: streaming=1.'),
        ({"epoch_copy": 0}, '`epoch_copy` must be True, False or "auto". Received: epoch_copy=0.'),
    ],
)
def test_load_options_are_validated(kwargs, text):
    with pytest.raises(ValueError) as err:
        LoadOptions(**kwargs)
    assert text in str(err.value)


def test_an_epoch_copy_is_refused_on_tensorflow():
    with pytest.raises(ValueError) as err:
        ShardedResidentDataset(np.zeros((8, 2), np.float32), per_replica_batch_size=2,
                               shuffle=False, load_options=LoadOptions(epoch_copy=True))
    assert str(err.value) == (
        "A per-epoch copy of the rows (`epoch_copy=True`) is the JAX backend's: TensorFlow "
        "always gathers each batch from the resident rows. Received: "
        'LoadOptions(epoch_copy=True). Leave `epoch_copy="auto"` (or False), or use '
        "`KERAS_BACKEND=jax`."
    )


@pytest.mark.parametrize(
    "seed",
    [
        2**63,  # one past int64: TensorFlow cannot hold it
        -1,  # NumPy's generator (streamed epochs) refuses negative seeds
        "abc",
        1.0,
        True,  # a bool is an int, never a seed
    ],
)
def test_seeds_are_checked_when_the_dataset_is_built(seed):
    x, y = _xy()
    with pytest.raises(ValueError) as err:
        ShardedResidentDataset(x, y, per_replica_batch_size=10, seed=seed)
    assert str(err.value) == (
        "`seed` must be an integer in [0, 2**63) (TensorFlow's stateless shuffle takes it "
        "as an int64; NumPy's generator needs it non-negative). Received: "
        f"seed={seed!r}. Pass e.g. `seed=0`, or `seed=None` with `shuffle=False`."
    )


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("seed", [0, 2**63 - 1, np.uint64(2**63 - 1), np.int32(7)])
def test_seeds_at_the_edges_shuffle_resident_and_streamed_epochs(seed, streaming):
    x, y = _xy()
    ds = ShardedResidentDataset(
        x,
        y,
        per_replica_batch_size=np.int64(10),  # NumPy integers count as integers
        seed=seed,
        shuffle="local" if streaming else True,  # a streamed shard has no global order
        load_options=LoadOptions(streaming=streaming, stream_chunk_bytes=np.int64(20 * 20)),
    )
    assert type(ds.seed) is int and ds.per_replica_batch_size == 10
    order = ds.epoch_order(1, training=True)
    try:
        order.prepare(0, 1)
        rows = order.rows(0)
    finally:
        order.close()
    assert sorted(rows[: ds.num_rows].tolist()) == list(range(ds.num_rows))
    assert rows[: ds.num_rows].tolist() != list(range(ds.num_rows))  # shuffled
