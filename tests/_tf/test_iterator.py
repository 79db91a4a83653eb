"""Custom training loops over `ShardedResidentDataset.epoch()` equal `shardfeed.fit`.

The proof: the same seeded model on the same rows (203: a partial last step
on 1, 2 and 3 replicas; shuffle on), trained for 3 epochs by a custom loop --
the `tf.distribute` tutorial's `strategy.run` step with
`tf.nn.compute_average_loss(..., global_batch_size=epoch.global_rows(step))`,
eagerly iterated or all full steps in one `tf.function` -- ends at `fit`'s
weights (rtol 1e-5) on 1 device, 3 logical devices, 2 workers and 2 Horovod
ranks. Every row is handed out once per epoch (row ids) for every sharding
mode; a resumed loop (state restored mid-epoch, by `set_state` or by
`tf.train.Checkpoint`) equals an uninterrupted one; misuse is refused with
the fix. The loops themselves live in `_custom_loop.py` (also the workers).
"""

from __future__ import annotations

import _custom_loop as cl
import numpy as np
import pytest
import tensorflow as tf
from _helpers import mirrored_strategy
from _helpers_horovod import TWO_WORKER_ENGINES
from _helpers_resume import assert_bad_states_refused
from _helpers_workers import ROOT, run_checked, two_workers

import shardfeed
from shardfeed import LoadOptions, ResidentEpoch, ShardedResidentDataset
from shardfeed._tf.world import current_world

RTOL, ATOL = 1e-5, 1e-6


def _world(replicas):
    """The default strategy, or MirroredStrategy over `replicas` logical CPUs."""
    return current_world(None if replicas == 1 else mirrored_strategy(replicas))


REPLICAS = [1, pytest.param(3, marks=pytest.mark.multi_device)]

# CI time: the references (fit's weights; the uninterrupted eager loop's) are
# computed once per replica count, each on a world of its own, and shared by
# the cases that compare against them (both are seeded: the same run gives the
# same weights).
_REFERENCES: dict[tuple[str, int], np.ndarray] = {}


def _fit_reference(replicas):
    if ("fit", replicas) not in _REFERENCES:
        _REFERENCES["fit", replicas] = cl.fit_weights(_world(replicas))
    return _REFERENCES["fit", replicas]


def _uninterrupted_reference(replicas):
    if ("uninterrupted", replicas) not in _REFERENCES:
        world = _world(replicas)
        m = cl.model(world)
        it = cl.dataset(world).iterator()
        cl.train_eagerly(world, m, it.epochs(cl.EPOCHS))
        _REFERENCES["uninterrupted", replicas] = cl.weights(m)
    return _REFERENCES["uninterrupted", replicas]


@pytest.mark.parametrize("replicas", REPLICAS)
@pytest.mark.parametrize("form", ["eager", "in_graph"])
def test_custom_loop_ends_at_fits_weights(replicas, form):
    world = _world(replicas)
    expected = _fit_reference(replicas)
    loop = cl.custom_weights if form == "eager" else cl.in_graph_weights
    np.testing.assert_allclose(loop(world), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("replicas", REPLICAS)
@pytest.mark.parametrize("mode", sorted(cl.MODES))
def test_every_row_once_per_epoch(replicas, mode):
    world = _world(replicas)
    epochs = cl.row_ids(world, epochs=2, **cl.MODES[mode])
    for ids in epochs:
        assert sorted(ids.tolist()) == list(range(cl.ROWS))
    assert epochs[0].tolist() != epochs[1].tolist()  # shuffled per epoch


@pytest.mark.multi_device
def test_partial_step_rows_and_attributes():
    world = _world(3)
    epoch = cl.dataset(world).epoch(0)  # 203 rows on 3 replicas: 68, 68, 67
    assert isinstance(epoch, ResidentEpoch)
    assert (epoch.steps, epoch.full_steps, epoch.has_partial_step) == (5, 4, True)
    assert (epoch.per_replica_batch_size, epoch.global_batch_size) == (16, 48)
    assert epoch.num_replicas_in_sync == 3 and len(epoch) == 5
    assert epoch.replica_rows(4) == (4, 4, 3) and epoch.global_rows(4) == 11
    assert epoch.global_rows(0) == 48
    shapes = [
        [int(t.shape[0]) for t in world.strategy.experimental_local_results(batch.x)]
        for _, batch in epoch
    ]
    assert shapes == [[16, 16, 16]] * 4 + [[4, 4, 3]]
    evaluation = cl.dataset(world).epoch(0, training=False, first_step=2)
    assert [s for s, _ in evaluation] == [2, 3, 4] and len(evaluation) == 3


def _resumed(world, restore):
    """Trains to epoch 1, step 2 (mid-epoch), 'preempts', rebuilds model,
    dataset and iterator as a new process would, restores, finishes."""
    m = cl.model(world)
    # `model=`: the workers' check before the first step (one worker here:
    # nothing to compare; two JAX processes: tests/_jax/test_rank_agreement_jax.py).
    it = cl.dataset(world).iterator(model=m)
    cl.train_eagerly(world, m, it.epochs(cl.EPOCHS), stop=(1, 2))
    state, saved = it.get_state(), [w.copy() for w in m.get_weights()]
    assert state == {"epoch": 1, "step": 3, "seed": cl.SEED, "num_rows": cl.ROWS,
                     "global_batch_size": cl.BATCH * world.num_replicas_in_sync}
    path = restore(None, m, it) if restore else None
    m2 = cl.model(world)
    m2.set_weights([w * 0 for w in saved])  # a fresh model whose weights must come back
    it2 = cl.dataset(world).iterator()
    assert it2.get_state()["epoch"] == 0
    if restore:
        restore(path, m2, it2)
    else:
        m2.set_weights(saved)
        it2.set_state(state)
    assert it2.get_state() == state
    cl.train_eagerly(world, m2, it2.epochs(cl.EPOCHS))
    assert it2.get_state()["epoch"] == cl.EPOCHS
    return cl.weights(m2)


@pytest.mark.parametrize("replicas", REPLICAS)
@pytest.mark.parametrize("how", ["set_state", "checkpoint"])
def test_resumed_custom_loop_equals_uninterrupted(replicas, how, tmp_path):
    world = _world(replicas)
    uninterrupted = _uninterrupted_reference(replicas)

    def checkpoint(path, model, iterator):
        ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, data=iterator)
        if path is None:
            return ckpt.save(str(tmp_path / "ckpt"))
        ckpt.restore(path).assert_consumed()
        return path

    resumed = _resumed(world, checkpoint if how == "checkpoint" else None)
    np.testing.assert_allclose(resumed, uninterrupted, rtol=RTOL, atol=ATOL)


def test_a_closed_epoch_refuses_batches_with_the_fix():
    world = _world(1)
    ds = cl.dataset(world)
    epoch = ds.epoch(0)
    epoch.close()
    with pytest.raises(RuntimeError) as err:
        next(iter(epoch))
    assert str(err.value) == (
        "This epoch is closed: a later epoch of the dataset moved its rows (the global "
        "shuffle's exchange, a streamed ring), or it was closed. Received: epoch=0, "
        "training=True. Open the epoch again with `dataset.epoch(...)` (or use the "
        "iterator's `epochs()`); keep one training epoch open at a time."
    )


@pytest.mark.multi_device
def test_an_epoch_that_moves_rows_closes_the_open_one():
    world = _world(3)
    ds = cl.dataset(world)  # sharded, shuffle=True on 3 replicas: the exchange
    first = ds.epoch(0)
    evaluation = ds.epoch(0, training=False)  # reads the slots as they are
    assert not first.closed
    ds.epoch(1)  # moves the rows
    assert first.closed and evaluation.closed
    with pytest.raises(RuntimeError, match="This epoch is closed"):
        first.batch(0)
    resident = cl.dataset(world, shuffle="local")
    a = resident.epoch(0)
    resident.epoch(1)
    assert not a.closed  # rows that never move keep every epoch valid


def test_bad_steps_and_streamed_batch_are_refused():
    world = _world(1)
    epoch = cl.dataset(world).epoch(0)  # 13 steps
    with pytest.raises(ValueError) as err:
        epoch.batch(13)
    assert str(err.value) == (
        "`step` must be a step of this epoch, an integer in [0, 13). Received: step=13. "
        "Ask for `range(epoch.steps)`; a tensor step works in `batch()` for full steps only."
    )
    with pytest.raises(ValueError, match=r"`first_step` must be an integer in \[0, 13\]"):
        cl.dataset(world).epoch(0, first_step=14)
    with pytest.raises(ValueError, match="Only training epochs augment"):
        cl.dataset(world).epoch(0, training=False, augment=True)
    x, y = cl.data()
    streamed = ShardedResidentDataset(
        x, y, per_replica_batch_size=16, seed=0, shuffle="local",
        load_options=LoadOptions(streaming=True, stream_chunk_bytes=16 * 24 * 4),
    )
    epoch = streamed.epoch(0)
    with pytest.raises(RuntimeError) as err:
        epoch.batch(0)
    assert str(err.value).startswith(
        "`ResidentEpoch.batch` reads rows already on the device; streamed rows are uploaded "
        "from the host between steps, by eager iteration only. Received: streaming=True."
    )
    ids = np.concatenate([np.asarray(b.y).ravel() for _, b in epoch])
    assert sorted(ids.tolist()) == sorted(y.ravel().tolist())  # eager iteration streams


@pytest.mark.parametrize("step", [12, 13, -1])  # the partial step; past the epoch; negative
def test_a_tensor_step_that_is_not_a_full_step_is_refused(step):
    """A tensor step of the partial last step trained its padding slots as
    rows (-1 wrapped to it); under XLA TensorFlow refuses it itself."""
    epoch = cl.dataset(_world(1)).epoch(0)
    assert (epoch.full_steps, epoch.steps) == (12, 13)
    total = tf.function(lambda s: tf.reduce_sum(epoch.batch(s).y))
    assert int(total(tf.constant(11))) == int(np.sum(np.asarray(epoch.batch(11).y)))
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        total(tf.constant(step))
    assert (
        "assertion failed: [A tensor `step` of `ResidentEpoch.batch` must be a full step of "
        "the epoch, in [0, full_steps): the slots of the partial last step past its real rows "
        f"are padding, which a tensor step trained as data. Received: step=] [{step}] [, "
        "full_steps=12. Loop over `tf.range(epoch.full_steps)` in the compiled step and take "
        "the partial last step with a Python int (`epoch.batch(epoch.steps - 1)`), as "
        "`shardfeed.fit` does.]"
    ) in str(err.value)
    epoch = cl.dataset(_world(1)).epoch(0)
    xla = tf.function(lambda s: tf.reduce_sum(epoch.batch(s).y), jit_compile=True)
    if step >= 12:  # XLA drops asserts; the slice of full steps is out of bounds
        with pytest.raises(tf.errors.InvalidArgumentError, match="out of bounds"):
            xla(tf.constant(step))


def test_bad_states_are_refused_with_the_fix():
    world = _world(1)
    it = cl.dataset(world).iterator()
    good = it.get_state()
    assert good == {"epoch": 0, "step": 0, "seed": cl.SEED, "num_rows": cl.ROWS,
                    "global_batch_size": cl.BATCH}
    assert_bad_states_refused(it, good, steps=13, num_rows=203)


@pytest.mark.multi_process
@pytest.mark.slow
@pytest.mark.parametrize("engine", TWO_WORKER_ENGINES)
def test_two_workers_custom_loop_ends_at_fits_weights(engine, tmp_path):
    out = tmp_path / "res"
    run_checked(two_workers(engine, ROOT / "tests" / "_custom_loop.py", "--out", str(out)), ROOT)
    results = [dict(np.load(f"{out}.rank{r}.npz")) for r in range(2)]
    for res in results:
        np.testing.assert_allclose(res["custom"], res["fit"], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(res["in_graph"], res["fit"], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(res["fit"], results[0]["fit"], rtol=RTOL, atol=ATOL)
    for mode in cl.MODES:
        for epoch in range(2):
            ids = np.concatenate([res[f"ids_{mode}_{epoch}"] for res in results])
            # Every row once per epoch across both workers (203 rows on 2 replicas:
            # the training plan drops none).
            assert sorted(ids.tolist()) == list(range(cl.ROWS)), (mode, epoch)


def test_a_model_that_is_not_a_model_is_refused_with_the_fix():
    # Was a raw AttributeError from inside the check (`model.trainable_variables`).
    world = _world(1)
    want = (
        "`model` must be a Keras model: its variables are compared across workers. "
        "Received: type(model)=str. Pass the `keras.Model` your loop trains."
    )
    for call in (lambda: cl.dataset(world).iterator(model="m"), lambda: shardfeed.sync_model("m")):
        with pytest.raises(TypeError) as err:
            call()
        assert str(err.value) == want
