"""The JAX `ShardedResidentDataset` and `ResidentEpoch` on 1, 2 and 4 CPU devices.

Each row once per epoch in every placement and shuffle; the global order
equal on N replicas x b and 1 x N*b; each replica's part of a global batch
on its own device; the partial step's real rows only; dtypes and structures
kept; the TensorFlow side's messages; memory checked before allocating and
flat over repeated epochs.
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers_jax import ORDERS, rows_of

from shardfeed._data.options import LoadOptions
from shardfeed._jax import exchange as _exchange
from shardfeed._jax.dataset import ShardedResidentDataset
from shardfeed._jax.exchange import moves


@pytest.mark.parametrize("num_devices", [1, 2, 4])
@pytest.mark.parametrize(("placement", "shuffle"), ORDERS)
def test_each_row_once_per_epoch(replicas, num_devices, placement, shuffle):
    replicas(num_devices)
    n = 103  # uneven over every device count and batch
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    ds = ShardedResidentDataset(
        x, np.arange(n), per_replica_batch_size=4, shuffle=shuffle, seed=7, placement=placement
    )
    for e in range(2):
        epoch = ds.epoch(e)
        emitted = rows_of(epoch)
        assert len(np.unique(emitted)) == len(emitted) == ds.plan.used_rows_per_epoch
        np.testing.assert_array_equal(emitted, epoch.slot_rows())
        assert ds.plan.dropped_rows_per_epoch == 0 or num_devices > 1
    if shuffle:
        assert not np.array_equal(rows_of(ds.epoch(0)), rows_of(ds.epoch(1)))
    else:
        np.testing.assert_array_equal(rows_of(ds.epoch(0)), rows_of(ds.epoch(1)))


@pytest.mark.parametrize("num_devices", [2, 4])
@pytest.mark.parametrize("placement", ["shard", "replicate"])
@pytest.mark.parametrize("shuffle", [True, False])  # the global order, or rows in order
def test_global_order_equals_one_replica_with_the_global_batch(
    replicas, num_devices, placement, shuffle
):
    n, b = 212, 5  # a partial last step with rows on every replica (sharded: 53 or 106 each)
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)

    def batches(devices: int, batch: int) -> list[np.ndarray]:
        replicas(devices)
        ds = ShardedResidentDataset(
            x, np.arange(n), per_replica_batch_size=batch, seed=3, placement=placement,
            shuffle=shuffle,
        )
        return [np.asarray(bt.x) for e in range(2) for _, bt in ds.epoch(e)]

    one = batches(1, num_devices * b)
    many = batches(num_devices, b)
    assert len(one) == len(many)
    for a, c in zip(one, many, strict=True):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize(("placement", "shuffle"), ORDERS)
def test_each_replicas_part_is_on_its_own_device(replicas, placement, shuffle):
    world = replicas(4)
    n, b = 64, 3
    ds = ShardedResidentDataset(
        np.arange(n, dtype=np.float32)[:, None], np.arange(n), per_replica_batch_size=b,
        shuffle=shuffle, seed=1, placement=placement,
    )
    epoch = ds.epoch(0)
    batch = epoch.batch(1)
    assert batch.x.shape == (4 * b, 1)
    rows = epoch.slot_rows()[4 * b : 8 * b]  # step 1, replicas in order
    by_device = {s.device: s for s in batch.y.addressable_shards}
    assert list(by_device) == list(world.devices)
    for r, device in enumerate(world.devices):
        shard = by_device[device]
        assert shard.index[0] == slice(r * b, (r + 1) * b)
        np.testing.assert_array_equal(np.asarray(shard.data), rows[r * b : (r + 1) * b])
        if placement == "shard" and shuffle == "local":  # its own rows, never another's
            start, stop = ds.plan.shards[r]
            assert ((start <= np.asarray(shard.data)) & (np.asarray(shard.data) < stop)).all()


@pytest.mark.parametrize(("num_rows", "training"), [(30, True), (30, False), (10, False)])
def test_partial_batch_has_exactly_the_real_rows(replicas, num_rows, training):
    world = replicas(4)
    ds = ShardedResidentDataset(
        np.arange(num_rows, dtype=np.float32), np.arange(num_rows), per_replica_batch_size=3,
        shuffle=False, transform=lambda x: x * 10,
    )
    epoch = ds.epoch(0, training=training)
    assert epoch.has_partial_step
    partial = epoch.partial_batch()
    assert partial is not None
    real = sum(epoch.plan.last_step_rows)
    assert partial.y.shape == (real,) == (epoch.global_rows(epoch.steps - 1),)
    tail = epoch.slot_rows()[-real:]
    np.testing.assert_array_equal(np.asarray(partial.y), tail)
    np.testing.assert_array_equal(np.asarray(partial.x), tail * 10.0)  # transform applied
    assert partial.x.sharding.is_fully_replicated
    assert {s.device for s in partial.x.addressable_shards} == set(world.devices)
    assert sorted(epoch.slot_rows()) == list(range(num_rows))


def test_no_partial_batch_when_steps_are_full(replicas):
    replicas(2)
    ds = ShardedResidentDataset(np.zeros((12, 1), np.float32), per_replica_batch_size=3,
                                shuffle=False)
    epoch = ds.epoch(0)
    assert (epoch.steps, epoch.full_steps, epoch.has_partial_step) == (2, 2, False)
    assert epoch.partial_batch() is None
    assert epoch.replica_rows(1) == (3, 3)


def test_dict_inputs_sample_weights_and_uint8_are_kept(replicas):
    replicas(2)
    n = 30
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8)
    extra = rng.normal(size=(n, 2)).astype(np.float32)
    y = {"label": np.arange(n, dtype=np.int32), "score": rng.normal(size=n).astype(np.float32)}
    sw = rng.uniform(size=n).astype(np.float32)
    ds = ShardedResidentDataset(
        {"image": image, "extra": extra}, y, sw, per_replica_batch_size=4, seed=0,
        load_options=LoadOptions(chunk_bytes=100),  # many chunks per column
    )
    epoch = ds.epoch(0)
    rows = epoch.slot_rows()
    got = [batch for _, batch in epoch]
    x = {k: np.concatenate([np.asarray(b.x[k]) for b in got]) for k in ("image", "extra")}
    assert x["image"].dtype == np.uint8
    np.testing.assert_array_equal(x["image"], image[rows])
    np.testing.assert_array_equal(x["extra"], extra[rows])
    label = np.concatenate([np.asarray(b.y["label"]) for b in got])
    np.testing.assert_array_equal(label, rows)
    np.testing.assert_array_equal(np.concatenate([np.asarray(b.sample_weight) for b in got]),
                                  sw[rows])
    assert ds.nbytes_on_device == image.nbytes + extra.nbytes + 4 * n * 3
    assert ds.has_targets and "JAX" in ds.describe()


class ReadRecorder:
    """An array-like over a NumPy array (as `shardfeed.files`' readers are)
    that records the row ranges read from it."""

    def __init__(self, array: np.ndarray) -> None:
        self.array, self.shape, self.dtype, self.reads = array, array.shape, array.dtype, []

    def __getitem__(self, rows: slice) -> np.ndarray:
        self.reads.append((rows.start, rows.stop))
        return self.array[rows]


@pytest.mark.parametrize("placement", ["shard", "replicate"])
def test_uploads_in_chunks_and_reads_each_row_once(replicas, placement):
    replicas(4)
    x = ReadRecorder(np.arange(100 * 4, dtype=np.float32).reshape(100, 4))  # 16 bytes a row
    ds = ShardedResidentDataset(x, per_replica_batch_size=5, shuffle=False, placement=placement,
                                load_options=LoadOptions(chunk_bytes=7 * 16, check_agreement=False))
    assert all(stop - start <= 7 for start, stop in x.reads)  # 7 rows per transfer at most
    read = np.concatenate([np.arange(start, stop) for start, stop in x.reads])
    np.testing.assert_array_equal(np.sort(read), np.arange(100))  # replicated rows: read once
    np.testing.assert_array_equal(np.concatenate([np.asarray(b.x) for _, b in ds.epoch(0)]),
                                  x.array[ds.epoch(0).slot_rows()])


def test_batch_fn_in_the_users_jit_with_a_traced_step(replicas):
    replicas(4)
    ds = ShardedResidentDataset(np.arange(80, dtype=np.float32), np.arange(80),
                                per_replica_batch_size=4, seed=2)
    traces = []

    @jax.jit
    def total(arrays, step):
        traces.append(1)
        return jnp.sum(epoch.batch_fn(arrays, step).x)

    for e in range(2):
        epoch = ds.epoch(e)
        for step in range(epoch.full_steps):
            assert float(total(epoch.arrays, jnp.int32(step))) == float(
                np.sum(np.asarray(epoch.batch(step).x))
            )
    assert len(traces) == 1  # one trace for every step of every epoch
    assert ds.epoch(0).batch_fn is ds.epoch(1).batch_fn


@pytest.mark.parametrize("step", [5, 6, -1])  # the partial step; past the epoch; negative
def test_batch_fn_refuses_a_traced_step_that_is_not_a_full_step(replicas, step):
    """A traced partial step trained its padding slots silently (a step past
    the epoch, or negative, silently repeated clamped rows)."""
    replicas(4)
    ds = ShardedResidentDataset(np.arange(90, dtype=np.float32), np.arange(90),
                                per_replica_batch_size=4, seed=2)
    epoch = ds.epoch(0)
    assert (epoch.full_steps, epoch.steps) == (5, 6)  # 90 rows: 5 steps of 16, then 10
    total = jax.jit(lambda arrays, i: jnp.sum(epoch.batch_fn(arrays, i).x))
    assert float(total(epoch.arrays, jnp.int32(4))) == float(np.sum(np.asarray(epoch.batch(4).x)))
    with pytest.raises(jax.errors.JaxRuntimeError) as raised:
        float(total(epoch.arrays, jnp.int32(step)))
    assert (
        "ValueError: A step of `batch_fn` must be a full step of the epoch, in [0, "
        "full_steps): the partial last step's slots past its real rows are padding, which a "
        "traced step would train as data (and a step past the epoch would repeat clamped "
        f"rows). Received: step={step}, full_steps=5. Loop over `range(epoch.full_steps)` "
        "in the compiled step and take the partial last step's real rows with "
        "`epoch.partial_batch()`, as `shardfeed.fit` does."
    ) in str(raised.value)


@pytest.mark.parametrize("copy", [True, False])
def test_the_full_step_check_adds_no_effect_to_a_compiled_step(replicas, copy):
    """The check was a `jax.debug.callback`, an effect: every call of a
    compiled step holding it (eager `epoch.batch`, a user's `jax.jit` step
    around `batch_fn`) left JAX's fast dispatch path, 0.27 ms a call on CPU,
    more than the step of the guide's model. Still refused: the test above."""
    replicas(2)
    ds = ShardedResidentDataset(np.arange(90, dtype=np.float32), np.arange(90),
                                per_replica_batch_size=4, seed=2,
                                load_options=LoadOptions(epoch_copy=copy))
    epoch = ds.epoch(0)
    traced = jax.make_jaxpr(lambda arrays, i: epoch.batch_fn(arrays, i).x)(epoch.arrays, 0)
    assert not traced.effects


def test_big_endian_arrays_are_held_in_native_byte_order(replicas):
    """`np.arange(10, dtype='>f4')` raised JAX's raw "JAX only supports number,
    bool, and string dtypes, got dtype >f4"; now each chunk is byte-swapped."""
    replicas(2)
    x = np.arange(40, dtype=">f4").reshape(20, 2)
    y = np.arange(20, dtype=">i8")
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=4, shuffle=False,
                                load_options=LoadOptions(chunk_bytes=24))
    native = ShardedResidentDataset(x.astype("<f4"), y.astype("<i8"), per_replica_batch_size=4,
                                    shuffle=False)
    for (_, ours), (_, theirs) in zip(ds.epoch(0), native.epoch(0), strict=True):
        assert ours.x.dtype == np.float32 and ours.y.dtype == np.int32
        np.testing.assert_array_equal(np.asarray(ours.x), np.asarray(theirs.x))
        np.testing.assert_array_equal(np.asarray(ours.y), np.asarray(theirs.y))


def test_jax_augment_gets_a_key_from_seed_epoch_and_step(replicas):
    replicas(2)

    def noise(x, key):
        return x + jax.random.uniform(key, x.shape)

    ds = ShardedResidentDataset(np.zeros((16, 1), np.float32), per_replica_batch_size=2,
                                seed=5, shuffle=False, augment=noise)
    first = np.asarray(ds.epoch(0, augment=True).batch(0).x)
    assert np.asarray(ds.epoch(0).batch(0).x).max() == 0  # not asked: no augment
    np.testing.assert_array_equal(first, np.asarray(ds.epoch(0, augment=True).batch(0).x))
    assert not np.array_equal(first, np.asarray(ds.epoch(0, augment=True).batch(1).x))
    assert not np.array_equal(first, np.asarray(ds.epoch(1, augment=True).batch(0).x))
    with pytest.raises(ValueError, match="training epochs only"):
        ds.epoch(0, training=False, augment=True)


def test_repeated_epochs_keep_device_memory_flat(replicas):
    replicas(4)
    ds = ShardedResidentDataset(np.ones((400, 8), np.float32), np.arange(400),
                                per_replica_batch_size=8, seed=0)

    def live() -> tuple[int, int]:
        gc.collect()
        arrays = jax.live_arrays()
        return len(arrays), sum(a.nbytes for a in arrays)

    for e in range(2):
        rows_of(ds.epoch(e))
    before = live()
    for e in range(2, 8):
        rows_of(ds.epoch(e))
    assert live() == before


def test_rows_in_order_are_copied_once(replicas):
    replicas(2)
    ds = ShardedResidentDataset(np.arange(40, dtype=np.float32), np.arange(40),
                                per_replica_batch_size=4, shuffle=False)
    first, again = ds.epoch(0), ds.epoch(3, training=True)
    assert first.arrays.columns[0] is again.arrays.columns[0]
    np.testing.assert_array_equal(rows_of(first), rows_of(again))
    assert ds.memory_reports[0].source == "meminfo"  # CPU devices: the host's RAM, once
    assert len(ds.memory_reports) == 1
    shuffled = ShardedResidentDataset(np.arange(40, dtype=np.float32), np.arange(40),
                                      per_replica_batch_size=4, seed=0)
    assert shuffled.epoch(0).arrays.columns[0] is not shuffled.epoch(0).arrays.columns[0]


def _pointers(epoch) -> list[int]:
    return [s.data.unsafe_buffer_pointer() for c in epoch.arrays.columns
            for s in c.addressable_shards]


# Rows in order are copied once and kept: nothing to write into.
@pytest.mark.parametrize(("placement", "shuffle"), [o for o in ORDERS if o[1] is not False])
def test_the_next_epoch_is_written_into_a_closed_epochs_copy(replicas, placement, shuffle):
    replicas(4)
    n = 103
    x, y = np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=4, shuffle=shuffle, seed=7,
                                placement=placement)
    fresh = ShardedResidentDataset(x, y, per_replica_batch_size=4, shuffle=shuffle, seed=7,
                                   placement=placement)
    first = ds.epoch(0)
    pointers, taken = _pointers(first), first.batch(1)
    first.close()
    second = ds.epoch(1)
    assert _pointers(second) == pointers  # the same memory: no new buffer to fault in
    assert first.arrays is None and second.arrays is not None
    np.testing.assert_array_equal(rows_of(second), rows_of(fresh.epoch(1)))
    np.testing.assert_array_equal(np.asarray(taken.y), np.asarray(fresh.epoch(0).batch(1).y))
    third = ds.epoch(2)  # `second` is still open: a copy of its own
    assert _pointers(third) != pointers
    np.testing.assert_array_equal(rows_of(second), rows_of(fresh.epoch(1)))
    second.close()
    evaluation = ds.epoch(0, training=False)  # its own order, into the same memory
    np.testing.assert_array_equal(rows_of(evaluation), rows_of(fresh.epoch(0, training=False)))
    evaluation.close()
    # Another batch, another length of copy: the spare is let go of, not written.
    other = ds.epoch(3, plan=ds.training_plan(3))
    expected = fresh.epoch(3, plan=fresh.training_plan(3))
    np.testing.assert_array_equal(rows_of(other), rows_of(expected))
    # After `split` let go of the rows, a closed epoch's copy is let go of too.
    other.close()
    opened = ds.epoch(4)
    ds.split(0.5)
    opened.close()
    assert ds._spare is None


def test_a_dataset_let_go_of_frees_its_device_memory(replicas):
    replicas(4)

    def live_bytes() -> int:
        gc.collect()
        return sum(a.nbytes for a in jax.live_arrays())

    before = live_bytes()
    for seed in range(3):
        ds = ShardedResidentDataset(np.ones((400, 8), np.float32), np.arange(400), seed=seed,
                                    per_replica_batch_size=8, transform=lambda x: x * 2)
        epoch = ds.epoch(0)
        rows_of(epoch)
        assert live_bytes() > before
        del ds, epoch
    assert live_bytes() == before


def test_a_shard_that_does_not_fit_is_refused_before_allocating(replicas):
    replicas(2)
    gc.collect()
    before = len(jax.live_arrays())
    with pytest.raises(MemoryError) as err:
        ShardedResidentDataset(np.zeros((1000, 100), np.float32), per_replica_batch_size=10,
                               shuffle=False,
                               load_options=LoadOptions(device_memory_bytes=10_000,
                                                        streaming=False))
    text = str(err.value)
    assert "needed_bytes=" in text and "free_bytes=10,000" in text and "from given" in text
    assert "placement='shard'" in text and "`LoadOptions(streaming=True)`" in text
    gc.collect()
    assert len(jax.live_arrays()) == before


def test_memory_counts_the_epoch_copy_and_the_exchange(replicas):
    replicas(2)
    opts = LoadOptions(device_memory_bytes=2**30)
    x = np.zeros((1000, 4), np.float32)  # 16 bytes a row, 500 per replica
    # Each replica on its own rows: no exchange (rows in order move once, as the global order).
    plain = ShardedResidentDataset(x, per_replica_batch_size=10, shuffle="local", seed=0,
                                   load_options=opts)
    assert [r.needed_bytes for r in plain.memory_reports] == [2 * 500 * 16] * 2  # rows + copy
    mixed = ShardedResidentDataset(x, per_replica_batch_size=10, seed=0, load_options=opts)
    assert all(r.needed_bytes > 2 * 500 * 16 for r in mixed.memory_reports)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(seed=None), ValueError, "Shuffling requires a seed"),
        (dict(seed=-1), ValueError, r"`seed` must be an integer in \[0, 2\*\*63\)"),
        (dict(shuffle="global", seed=0), ValueError, "`shuffle` must be True"),
        (dict(shuffle="local", seed=0, placement="replicate"), ValueError,
         'needs placement="shard"'),
        (dict(placement="mirror", shuffle=False), ValueError, "`placement` must be one of"),
        (dict(per_replica_batch_size=0, shuffle=False), ValueError,
         "`per_replica_batch_size` must be an integer >= 1"),
        (dict(transform=3, shuffle=False), TypeError, "`transform` must be a function"),
        (dict(augment=3, seed=0), TypeError, "`augment` must be a function"),
        (dict(augment=lambda x, k: x, shuffle=False), ValueError, "Augmenting requires a seed"),
        (dict(strategy="mirrored", shuffle=False), ValueError,
         "a `tf.distribute` strategy has no role"),
        (dict(load_options=LoadOptions(streaming=True, epoch_copy=True), shuffle=False),
         ValueError, "A streamed dataset keeps no per-epoch copy"),
    ],
)
def test_bad_arguments_give_the_tensorflow_sides_messages(replicas, kwargs, error, match):
    replicas(1)
    args = dict(per_replica_batch_size=4) | kwargs
    with pytest.raises(error, match=match):
        ShardedResidentDataset(np.zeros((8, 2), np.float32), **args)


def test_bad_data_gives_the_sources_messages(replicas):
    replicas(1)
    with pytest.raises(ValueError, match="same number of rows"):
        ShardedResidentDataset(np.zeros((8, 2)), np.zeros(7), per_replica_batch_size=4,
                               shuffle=False)
    with pytest.raises(ValueError, match="int32"):
        ShardedResidentDataset(np.array([0, 2**40]), per_replica_batch_size=1, shuffle=False)


def test_split_keeps_the_options_and_the_last_rows_for_validation(replicas):
    replicas(2)
    ds = ShardedResidentDataset(np.arange(20, dtype=np.float32), np.arange(20),
                                per_replica_batch_size=4, seed=9)
    training, validation = ds.split(0.25)
    assert (training.num_rows, validation.num_rows, validation.shuffle) == (15, 5, False)
    assert training.seed == 9 and validation.per_replica_batch_size == 2
    assert sorted(rows_of(validation.epoch(0, training=False))) == list(range(15, 20))
    assert ds.split(0.25) == (training, validation)
    # Validation data never trains: its rows in order stay on their shards.
    assert training.order_is_global and not validation.order_is_global
    assert training.moves_rows and not validation.moves_rows
    with pytest.raises(ValueError, match="leave rows on both sides"):
        ds.split(0.99)


def test_label_stats_are_reduced_on_each_replicas_rows(replicas):
    replicas(2)
    y = {"kind": np.array([0, 3, 1, 7, 7, 2, 9]), "score": np.array([0, 1, 2, 3.5, 4, 5, 6])}
    ds = ShardedResidentDataset(np.zeros((7, 1), np.float32), y, per_replica_batch_size=2,
                                shuffle=False)  # rows [0, 4) and [4, 7): 3 rows and a padding row
    kind = ds.label_stats(("kind",))
    np.testing.assert_array_equal(np.stack(kind), [[0, 7, 0], [2, 9, 0]])
    np.testing.assert_array_equal(ds.label_stats(("kind",), ignore=9)[1], [0, 7, 0])
    np.testing.assert_array_equal(np.stack(ds.label_stats(("score",))), [[0, 3.5, 1], [4, 6, 0]])
    assert ds.label_stats(("kind",)) is kind  # cached
    with pytest.raises(ValueError, match="`target` must lead to one array of `y`"):
        ds.label_stats(("nothing",))


def test_the_exchange_compiles_once_over_epochs(replicas):
    world = replicas(4)
    ds = ShardedResidentDataset(np.ones((4000, 3), np.float32), np.arange(4000),
                                per_replica_batch_size=10, seed=0)
    exchange = _exchange._exchange_fn(world.mesh)
    sizes = []
    for e in range(8):
        ds.epoch(e)
        sizes.append(exchange._cache_size())
    # `send_rows` rounded: every epoch's moves fit one compiled shape (earlier tests'
    # shapes may be in the cache too).
    assert sizes == [sizes[0]] * 8


@pytest.mark.parametrize("moved", [False, True])  # the local gather, the all-to-all
def test_the_epoch_copy_overwrites_the_donated_copy_without_a_scatter(replicas, moved):
    """The compiled copy writes into the donated closed epoch's copy (its
    buffers alias the outputs) and never as `copy.at[:].set(rows)`: inside
    `jax.shard_map` over 2 or more devices that scatter segfaulted JAX 0.11.2's
    CPU compiler (every sharded epoch on 2 devices crashed the process)."""
    world = replicas(2)
    per_replica = [np.zeros((10, 3), np.float32), np.zeros(10, np.int32)]  # x and y columns
    tables = tuple(_exchange.local_array(world, [column] * 2) for column in per_replica)
    out = _exchange.new_copy(world, tables, 8)
    if moved:
        plan = moves([np.arange(8), np.arange(10, 18)], [0, 10], 8)
        send = _exchange.local_array(world, [plan.send[s].reshape(-1) for s in range(2)])
        take = _exchange.local_array(world, list(plan.take))
        lowered = _exchange._exchange_fn(world.mesh).lower(tables, send, take, out)
    else:
        slots = _exchange.local_array(world, [np.arange(8, dtype=np.int32)] * 2)
        lowered = _exchange._gather_fn(world.mesh).lower(tables, slots, out)
    assert "scatter" not in lowered.as_text()
    # "HloModule ..., input_output_alias={ {0}: (3, {}, may-alias), {1}: (4, {}, ...) }, ..."
    header = lowered.compile().as_text().splitlines()[0]
    assert header.count("-alias)") == len(tables), header  # each column's donated buffer


def test_moves_bring_each_replica_its_rows():
    rng = np.random.default_rng(0)
    starts, n = [0, 10, 20], 30
    order = rng.permutation(n)
    rows = [order[:9], order[9:18], order[18:27]]
    plan = moves(rows, starts, 10)
    for dst in range(3):
        sent = np.concatenate([plan.send[s, dst] + starts[s] for s in range(3)])
        np.testing.assert_array_equal(sent[plan.take[dst, :9]], rows[dst])
