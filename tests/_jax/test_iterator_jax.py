"""`ResidentIterator` on JAX: a resumable position over training epochs, as on TensorFlow.

The proof (after tests/_tf/test_iterator.py and Grain's resume test): a loop
stopped mid-epoch, its state saved as JSON, then a fresh dataset and
iterator given the state, hand out exactly the batches an uninterrupted
loop hands out, on 1 and 2 devices, shuffle global/local/off, with and
without an epoch copy (the global order of sharded rows moves rows in place
between epochs). Every `set_state` refusal gives the TensorFlow side's text;
`epochs()` advances as there (an epoch left early or at its end moves the
position to the next one's start, and the left epoch is closed);
`augment=True` draws `shardfeed.fit`'s keys.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from _helpers_fit import mlp, regression_data
from _helpers_fit import replicas as world_of
from _helpers_jax import run_python
from _helpers_resume import assert_bad_states_refused
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardfeed
from shardfeed._data.options import LoadOptions
from shardfeed._jax.dataset import ShardedResidentDataset
from shardfeed._jax.epoch import augment_key
from shardfeed._jax.iterator import ResidentIterator

ROWS, BATCH, SEED, EPOCHS = 103, 4, 7, 3  # 103 rows: a partial last step on 1 and 2 devices
GATHER = LoadOptions(epoch_copy=False, exchange_buffer_bytes=64)  # rows moved in place
COPY = LoadOptions(epoch_copy=True)


def _dataset(options=COPY, **kwargs):
    x = np.arange(ROWS * 2, dtype=np.float32).reshape(ROWS, 2)
    kwargs = {"per_replica_batch_size": BATCH, "seed": SEED, "load_options": options, **kwargs}
    return ShardedResidentDataset(x, np.arange(ROWS), **kwargs)


def _take(epochs, stop=None):
    """`[(epoch, step, y, x)]` of every batch handed out; with `stop` =
    (epoch, step), returns right after that step, as a preempted run would."""
    out = []
    for epoch in epochs:
        for step, batch in epoch:
            out.append((epoch.epoch, step, np.asarray(batch.y), np.asarray(batch.x)))
            if stop == (epoch.epoch, step):
                return out
    return out


def _assert_same(got, expected):
    assert [(e, s) for e, s, _, _ in got] == [(e, s) for e, s, _, _ in expected]
    for (_, _, y, x), (_, _, y0, x0) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(y, y0)
        np.testing.assert_array_equal(x, x0)


@pytest.mark.parametrize("num_devices", [1, 2])
@pytest.mark.parametrize("shuffle", [True, "local", False])
@pytest.mark.parametrize("options", [COPY, GATHER], ids=["copy", "gather"])
def test_resumed_loop_yields_the_uninterrupted_batches(replicas, num_devices, shuffle, options):
    replicas(num_devices)
    _check_resumes(num_devices, options, shuffle)


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "gather"])
def test_resumed_loop_with_a_partial_exchange(replicas, copy):
    # A partial exchange's holdings carry over from epoch to epoch: a fresh
    # dataset resumed at epoch 1 must replay them (`order_is_replayable`).
    replicas(2)
    options = LoadOptions(epoch_copy=copy, exchange_fraction=0.5, exchange_buffer_bytes=64)
    _check_resumes(2, options, True)


def _check_resumes(num_devices, options, shuffle):
    uninterrupted = _take(_dataset(options, shuffle=shuffle).iterator().epochs(EPOCHS))
    steps = -(-ROWS // (BATCH * num_devices))
    assert len(uninterrupted) == EPOCHS * steps

    it = _dataset(options, shuffle=shuffle).iterator()
    before = _take(it.epochs(EPOCHS), stop=(1, 2))
    state = json.loads(json.dumps(it.get_state()))  # saved as a file would keep it
    assert state == {"epoch": 1, "step": 3, "seed": SEED, "num_rows": ROWS,
                     "global_batch_size": BATCH * num_devices}
    fresh = _dataset(options, shuffle=shuffle).iterator()  # a new process, as after preemption
    assert fresh.get_state()["epoch"] == 0
    fresh.set_state(state)
    assert fresh.get_state() == state
    after = _take(fresh.epochs(EPOCHS))
    assert fresh.get_state()["epoch"] == EPOCHS
    _assert_same(before + after, uninterrupted)


def _sgd_step(model):
    """A jitted stateless SGD step of `model`'s architecture (any model of
    it: the values are arguments), compiled once for every run of a test."""

    @jax.jit
    def train_step(trainable, non_trainable, x, y):
        def loss(trainable):
            pred, _ = model.stateless_call(trainable, non_trainable, x, training=True)
            return ((pred - y) ** 2).mean()  # a partial step holds its real rows only

        return [v - 0.05 * g for v, g in zip(trainable, jax.grad(loss)(trainable), strict=True)]

    return train_step


def _recipe(world, directory, train_step, stop=None):
    """docs/custom_loops.md's resume recipe on JAX, with `train_step` on a
    fresh seeded model; with `stop` = (epoch, step), saves the weights and
    `get_state()` as JSON after that step and returns None, as a preempted
    run would; resumes from `directory` when they are there."""
    model = mlp(features=8)  # seeded: the same initial weights every call
    ds = ShardedResidentDataset(*regression_data(ROWS), per_replica_batch_size=BATCH, seed=SEED)
    it = ds.iterator()
    if (directory / "data.json").exists():
        model.load_weights(directory / "model.weights.h5")
        it.set_state(json.loads((directory / "data.json").read_text()))
    replicated = NamedSharding(world.mesh, P())
    trainable = [jax.device_put(v.value, replicated) for v in model.trainable_variables]
    non_trainable = [jax.device_put(v.value, replicated) for v in model.non_trainable_variables]

    def write_back():
        for variable, value in zip(model.trainable_variables, trainable, strict=True):
            variable.assign(value)

    for epoch in it.epochs(EPOCHS):
        for step, batch in epoch:
            trainable = train_step(trainable, non_trainable, batch.x, batch.y)
            if (epoch.epoch, step) == stop:
                write_back()
                model.save_weights(directory / "model.weights.h5")
                (directory / "data.json").write_text(json.dumps(it.get_state()))
                return None
    write_back()
    return np.concatenate([w.ravel() for w in model.get_weights()])


def test_the_documented_resume_recipe_ends_at_the_uninterrupted_weights(replicas, tmp_path):
    world = replicas(2)  # sharded rows in the global order: they move between epochs
    step = _sgd_step(mlp(features=8))
    uninterrupted = _recipe(world, tmp_path / "unused", step)
    assert _recipe(world, tmp_path, step, stop=(1, 2)) is None  # preempted mid-epoch
    assert json.loads((tmp_path / "data.json").read_text())["step"] == 3
    resumed = _recipe(world, tmp_path, step)  # a fresh model, dataset and iterator
    np.testing.assert_allclose(resumed, uninterrupted, rtol=1e-5, atol=1e-6)


def test_the_public_name_and_the_dataset_method_give_the_jax_iterator(replicas):
    replicas(1)
    ds = _dataset()
    it = ds.iterator()
    assert isinstance(it, shardfeed.ResidentIterator) and shardfeed.ResidentIterator is (
        ResidentIterator
    )
    assert repr(it) == "ResidentIterator(epoch=0, step=0)"
    assert it.get_state() == shardfeed.ResidentIterator(ds).get_state()


def test_a_model_that_is_not_a_model_is_refused_with_the_fix(replicas):
    # Was a raw AttributeError from inside the check (`model.trainable_variables`).
    replicas(1)
    want = (
        "`model` must be a Keras model: its variables are compared across workers. "
        "Received: type(model)=str. Pass the `keras.Model` your loop trains."
    )
    for call in (lambda: _dataset().iterator(model="model"), lambda: shardfeed.sync_model("m")):
        with pytest.raises(TypeError) as err:
            call()
        assert str(err.value) == want


def test_bad_states_are_refused_with_the_fix(replicas):
    replicas(1)
    it = _dataset().iterator()  # 103 rows, batch 4: 26 steps
    good = it.get_state()
    assert good == {"epoch": 0, "step": 0, "seed": SEED, "num_rows": ROWS,
                    "global_batch_size": BATCH}
    assert_bad_states_refused(it, good, steps=26, num_rows=ROWS)
    with pytest.raises(ValueError) as err:
        it.set_state([("epoch", 0)])
    assert "Received: state keys=list." in str(err.value)
    with pytest.raises(ValueError, match=r"Received: state\['epoch'\]=-1\. "):
        it.set_state({**good, "epoch": -1})
    with pytest.raises(ValueError, match=r"Received: state\['step'\]=True\. "):
        it.set_state({**good, "step": True})
    for key, value in [("seed", 8), ("seed", None), ("global_batch_size", 8),
                       ("global_batch_size", "4")]:
        with pytest.raises(ValueError, match=(
            rf"Received: state\['{key}'\]={value!r}, this dataset's {key}="
        )):
            it.set_state({**good, key: value})
    with pytest.raises(ValueError) as err:
        it.epochs(-1)
    assert str(err.value) == (
        "`num_epochs` must be an integer in [0, 4611686018427387904]. Received: "
        "num_epochs=-1. Pass e.g. `epochs(10)`."
    )
    assert it.get_state() == good  # a refused state moves nothing


def test_a_dataset_without_a_seed_has_seed_none(replicas):
    replicas(1)
    it = _dataset(shuffle=False, seed=None).iterator()
    state = it.get_state()
    assert state["seed"] is None
    with pytest.raises(ValueError, match=r"Received: state\['seed'\]=7, this dataset's seed=None"):
        it.set_state({**state, "seed": SEED})
    it.set_state({**state, "step": 5})
    assert next(iter(it.epochs(1))).first_step == 5


def test_each_step_advances_and_an_epochs_end_moves_to_the_next(replicas):
    replicas(1)
    it = _dataset().iterator()
    epochs = it.epochs(2)
    first = next(epochs)
    assert (first.epoch, first.first_step, first.training) == (0, 0, True)
    steps = iter(first)
    next(steps)
    assert (it.get_state()["epoch"], it.get_state()["step"]) == (0, 1)
    for _ in range(first.steps - 1):  # to the partial last step
        next(steps)
    assert (it.get_state()["epoch"], it.get_state()["step"]) == (1, 0)  # its end: next epoch
    second = next(epochs)
    assert (second.epoch, second.first_step) == (1, 0)
    assert first.closed  # left: its device data let go of
    assert [s for s, _ in second] == list(range(second.steps))
    assert next(epochs, None) is None  # epochs(2) ends after epoch 1
    assert (it.get_state()["epoch"], it.get_state()["step"]) == (2, 0)
    assert list(it.epochs(2)) == [] and list(it.epochs(0)) == []


@pytest.mark.parametrize("options", [COPY, GATHER], ids=["copy", "gather"])
def test_an_epoch_left_early_is_left_and_the_next_starts_at_its_first_step(replicas, options):
    replicas(2)  # the global order of sharded rows: opening an epoch moves rows
    ds = _dataset(options)
    it = ds.iterator()
    handed = []
    for epoch in it.epochs(3):
        for step, _batch in epoch:
            handed.append((epoch.epoch, step))
            if epoch.epoch == 0 and step == 4:
                break  # left early
        if epoch.epoch == 1:
            break
    assert handed[:5] == [(0, s) for s in range(5)]
    assert handed[5:] == [(1, s) for s in range(epoch.steps)]  # from its first step
    assert it.get_state()["epoch"] == 2  # epoch 1 ran to its end
    assert not epoch.closed  # leaving `epochs()` itself closes nothing
    np.testing.assert_array_equal(np.sort(np.concatenate(
        [np.asarray(b.y) for _, b in epoch])), np.arange(ROWS))  # each row once


def test_a_left_epoch_refuses_batches_with_the_fix(replicas):
    replicas(2)
    it = _dataset(GATHER).iterator()
    epochs = it.epochs(2)
    first = next(epochs)
    first.batch(0)
    next(epochs)
    with pytest.raises(RuntimeError) as err:
        first.batch(0)
    assert str(err.value) == (
        "This epoch is closed: its device data was let go of (`close()`, or the dataset "
        "moved its rows in place for a training epoch opened later). Received: epoch=0, "
        "training=True. Open the epoch again with `dataset.epoch(...)`, after the others "
        "are done."
    )


def test_moving_on_writes_the_next_epoch_into_the_left_ones_copy(replicas):
    replicas(2)
    ds = _dataset(COPY)
    it = ds.iterator()
    epochs = it.epochs(3)
    first = next(epochs)
    pointers = [s.data.unsafe_buffer_pointer() for s in first.arrays.columns[0].addressable_shards]
    second = next(epochs)  # left after no step at all
    assert [s.data.unsafe_buffer_pointer()
            for s in second.arrays.columns[0].addressable_shards] == pointers


def test_augment_draws_the_keys_fit_draws(replicas):
    replicas(2)

    def noise(x, key):
        return x + jax.random.uniform(key, x.shape)

    ds = _dataset(shuffle=False, augment=noise)
    it = ds.iterator(augment=True)
    it.set_state({**it.get_state(), "epoch": 1, "step": 10})
    plain = [b for b in _take(ds.iterator().epochs(2)) if b[:2] >= (1, 10)]
    augmented = _take(it.epochs(2))
    assert [(e, s) for e, s, _, _ in augmented] == [(1, s) for s in range(10, 13)]
    for (e, s, _, x), (_, _, _, x_aug) in zip(plain, augmented, strict=True):
        key = augment_key(SEED, e, s)  # what `fit`'s `batch_fn` folds in
        np.testing.assert_allclose(x_aug - x, np.asarray(jax.random.uniform(key, x.shape)),
                                   atol=1e-4)
    with pytest.raises(ValueError, match="`augment=True` applies the dataset's `augment`"):
        next(_dataset().iterator(augment=True).epochs(1))


CLOSED = (
    "A closed epoch's `arrays` cannot go into a compiled call or `batch_fn`: `close()` let go "
    "of their device data (the dataset writes a later epoch's rows into it, or moved its rows "
    "in place), so they may hold deleted buffers. Received: EpochArrays of epoch=0, "
    "training=True (closed). Pass `epoch.arrays` (a streamed epoch's `epoch.call_arrays(start, "
    "stop)`) of an open epoch to each call: `dataset.epoch(n)`, or the epoch "
    "`iterator.epochs()` is on now."
)


def closed_arrays_refusal(options: str, reopened: bool) -> str:
    """The error a compiled call gives a closed epoch's `arrays` ("copy" or
    "gathered"; `reopened`: the next epoch opened first), on 2 devices."""
    with world_of(2):
        ds = _dataset(COPY if options == "copy" else GATHER)
        epoch = ds.epoch(0)
        arrays = epoch.arrays
        total = jax.jit(lambda a, i: epoch.batch_fn(a, i).x.sum())
        total(arrays, np.int32(0))  # traced and compiled while open
        epoch.close()
        if reopened:
            ds.epoch(1)  # writes into the closed copy, or moves the rows in place
        with pytest.raises(RuntimeError) as raised:
            total(arrays, np.int32(1))
        with pytest.raises(RuntimeError, match="A closed epoch's `arrays`"):
            epoch.batch_fn(arrays, 1)  # eagerly too
        with pytest.raises(RuntimeError, match="This epoch is closed"):
            epoch.call_arrays(0, 1)
        # The same compiled call takes an open epoch's arrays.
        again = ds.epoch(2)
        assert float(total(again.arrays, np.int32(1))) == float(again.batch(1).x.sum())
    return str(raised.value)


@pytest.mark.parametrize("options", ["copy", "gathered"])
def test_a_closed_epochs_arrays_are_refused_before_a_compiled_call(options):
    # Used to run: the closed epoch's buffers were still there.
    assert closed_arrays_refusal(options, reopened=False) == CLOSED


def test_overwritten_arrays_are_refused_before_the_call_that_killed_the_process():
    # Once the next epoch wrote into the copy or moved the rows in place, the
    # call got deleted buffers: "Buffer has been deleted or donated", or
    # SIGSEGV (JAX 0.10.2, 2 devices, either case). In a child process, so a
    # crash cannot take the other tests with it.
    code = (
        "import sys; sys.path[:0] = ['tests/_jax', 'tests']\n"
        "from test_iterator_jax import closed_arrays_refusal\n"
        "print(closed_arrays_refusal('copy', reopened=True))\n"
        "print(closed_arrays_refusal('gathered', reopened=True))\n"
    )
    result = run_python(code, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-2:] == [CLOSED, CLOSED]
