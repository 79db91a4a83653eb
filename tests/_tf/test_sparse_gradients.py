"""Sparse gradients (an `Embedding`'s `tf.IndexedSlices`) across replicas.

The proof: under MirroredStrategy an embedding model's step sends every
sparse gradient in one all-gather (its length, then one packed vector: two
collectives per step, where TensorFlow's own all-reduce of `IndexedSlices`
sends three per gradient) and no dense all-reduce of a table; the packed sum
equals the dense sum also when replicas touch different numbers of rows;
2 replicas end with the weights of 1 replica with the global batch (a
partial last step included), and so does `FitOptions(sparse_as_dense=True)`,
which all-reduces the densified table instead.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _helpers import mirrored_strategy
from _helpers_sparse import ITEMS, USERS, WIDTH, ratings, towers

import shardfeed
from shardfeed import FitOptions, ShardedResidentDataset
from shardfeed._tf import compiled as _compiled
from shardfeed._tf.engines import gradients as _gradients

pytestmark = pytest.mark.multi_device

def _train_chunk_ops(model, dataset, in_xla=None):
    """(op type, input shapes) of every op in the traced training call's step
    loop; `in_xla`: only those inside (True) or outside (False) a function
    compiled with XLA (one called with `_XlaMustCompile`, and what it calls)."""
    (loop,) = _compiled._COMPILED.of(model).loops[dataset].values()
    graph = loop.traces.call("train", "steps")._list_all_concrete_functions()[0].graph
    graphs = {"": graph}  # every function graph, by name

    def collect(g):
        for name, fn in getattr(g, "_functions", {}).items():
            if hasattr(fn, "graph") and name not in graphs:
                graphs[name] = fn.graph
                collect(fn.graph)

    collect(graph)

    def called(op):  # the functions an op runs (a call, a loop's body, a branch)
        return [a.func.name for a in op.node_def.attr.values() if a.func.name] + [
            f.name for a in op.node_def.attr.values() for f in a.list.func
        ]

    xla = set()
    todo = [
        f
        for g in graphs.values()
        for op in g.get_operations()
        if "_XlaMustCompile" in op.node_def.attr and op.get_attr("_XlaMustCompile")
        for f in called(op)
    ]
    while todo:
        name = todo.pop()
        if name in graphs and name not in xla:
            xla.add(name)
            todo += [f for op in graphs[name].get_operations() for f in called(op)]
    return [
        (op.type, [tuple(t.shape.as_list()) for t in op.inputs if t.shape.rank])
        for name, g in graphs.items()
        if in_xla is None or (name in xla) == in_xla
        for op in g.get_operations()
    ]


def _fit_two_replicas(options, rows=256, with_dense=False):
    x, y = ratings(rows)
    with mirrored_strategy(2).scope():
        model = towers(with_dense)
        dataset = ShardedResidentDataset(
            x, y, per_replica_batch_size=16, shuffle=False, placement="replicate"
        )
    history = shardfeed.fit(model, dataset, epochs=2, verbose=0, options=options)
    return model, dataset, history


@pytest.fixture(scope="module")
def fitted_without_xla():
    """The dataset of one 2-replica fit, 4 steps per call, no XLA: made once
    (CI time), its traced calls read by the two tests that check that fit."""
    model, dataset, _ = _fit_two_replicas(FitOptions(steps_per_execution=4, jit_compile=False))
    return model, dataset  # the model kept alive with its traced calls


def test_embedding_gradients_cross_sparse_in_one_all_gather(fitted_without_xla):
    ops = _train_chunk_ops(*fitted_without_xla)
    per_step = [t for t, _ in ops if t.startswith("Collective")]
    # Two replicas, each: the vector's length, then the vector (four sparse
    # gradients; TensorFlow's per-gradient all-reduce needed 3 each).
    assert sorted(per_step) == ["CollectiveGatherV2"] * 4
    tables = {(USERS, WIDTH), (ITEMS, WIDTH), (USERS, 1), (ITEMS, 1)}
    assert not [
        (t, s) for t, s in ops if t.startswith("CollectiveReduce") and tables & set(s)
    ]


def test_sparse_as_dense_all_reduces_the_tables():
    model, dataset, _ = _fit_two_replicas(
        FitOptions(steps_per_execution=4, jit_compile=False, sparse_as_dense=True)
    )
    ops = _train_chunk_ops(model, dataset)
    assert not [t for t, _ in ops if t == "CollectiveGatherV2"]
    # One all-reduce per replica: TensorFlow packs the four densified tables.
    table_words = (USERS + ITEMS) * (WIDTH + 1)
    reduced = [shapes for t, shapes in ops if t.startswith("CollectiveReduce")]
    assert reduced == [[(table_words,)]] * 2


# Every pair of the three settings, both ways (an orthogonal array of 4 of the 8
# cases, all three on in one): the 8 took 113 s of CI's 2 cores, these 4 about 58.
@pytest.mark.parametrize(
    ("with_dense", "sparse_as_dense", "jit_compile"),
    [(True, True, True), (False, False, True), (False, True, False), (True, False, False)],
)
def test_two_replicas_equal_one_with_the_global_batch(with_dense, sparse_as_dense, jit_compile):
    rows = 250  # 7 full global steps of 32 and a partial one of 26 rows
    x, y = ratings(rows)
    options = FitOptions(
        steps_per_execution=3, jit_compile=jit_compile, sparse_as_dense=sparse_as_dense
    )
    reference = towers(with_dense)
    ref_history = shardfeed.fit(
        reference,
        ShardedResidentDataset(x, y, per_replica_batch_size=32, shuffle=False),
        epochs=2,
        verbose=0,
        options=options,
    )
    model, _, history = _fit_two_replicas(options, rows, with_dense)
    for a, b in zip(reference.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=1e-5)


def test_packed_sum_equals_the_dense_sum_when_replicas_touch_different_rows():
    strategy = mirrored_strategy(2)
    table = tf.zeros([ITEMS, 3])
    with strategy.scope():
        variable = tf.Variable(table)
    rng = np.random.default_rng(1)
    # Replica 0 touches 5 rows (one twice), replica 1 two: a partial last step.
    rows = [np.array([4, 9, 4, 0, 96]), np.array([9, 50])]
    values = [rng.normal(size=(len(r), 3)).astype("float32") for r in rows]
    dense = tf.Variable(tf.ones([2, 2]))

    def step(ctx_values, ctx_rows):
        ctx = tf.distribute.get_replica_context()
        grad = tf.IndexedSlices(ctx_values, ctx_rows, tf.constant([ITEMS, 3], tf.int64))
        summed = _gradients.summed(ctx, [grad, None, tf.ones([2, 2])], [variable, None, dense])
        assert isinstance(summed[0], tf.IndexedSlices) and summed[1] is None
        return tf.convert_to_tensor(summed[0]), summed[2]

    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: (
            tf.constant(values[ctx.replica_id_in_sync_group]),
            tf.constant(rows[ctx.replica_id_in_sync_group], tf.int64),
        )
    )
    sparse_sum, dense_sum = tf.function(
        lambda v: strategy.run(step, args=v)
    )(per_replica)
    expected = np.zeros([ITEMS, 3], "float32")
    for r, v in zip(rows, values, strict=True):
        np.add.at(expected, r, v)
    for local in strategy.experimental_local_results(sparse_sum):
        np.testing.assert_allclose(local.numpy(), expected, rtol=1e-6)
    for local in strategy.experimental_local_results(dense_sum):
        np.testing.assert_array_equal(local.numpy(), np.full([2, 2], 2.0))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_with_xla_each_replicas_update_of_the_tables_is_compiled(jit_compile, request):
    """A loop of two replicas is not one XLA cluster; with XLA on, each
    device's update of each table (Keras' dense Adam: a dozen passes over
    the table outside XLA) is compiled on its own; without, it is not."""
    if jit_compile:
        model, dataset, _ = _fit_two_replicas(
            FitOptions(steps_per_execution=4, jit_compile=True)
        )
    else:  # the fit test_embedding_gradients_cross_sparse_in_one_all_gather reads
        model, dataset = request.getfixturevalue("fitted_without_xla")
    tables = [(USERS, WIDTH), (ITEMS, WIDTH), (USERS, 1), (ITEMS, 1)]

    def weight_updates(in_xla):
        ops = _train_chunk_ops(model, dataset, in_xla)
        return sorted(s[0] for t, s in ops if t == "AssignSubVariableOp" and s and s[0] in tables)

    compiled, plain = weight_updates(True), weight_updates(False)
    every = sorted(tables * 2)  # each table on each of the two devices
    assert (compiled, plain) == ((every, []) if jit_compile else ([], every))


def test_sparse_as_dense_must_be_a_bool():
    with pytest.raises(ValueError) as err:
        FitOptions(sparse_as_dense=1)
    assert str(err.value) == (
        "`sparse_as_dense` must be True or False. Received: sparse_as_dense=1. "
        "Use False (sparse gradients stay sparse) or True (densified, as Horovod's option)."
    )


def test_keras_optimizer_is_restored_after_replicas_traced_in_threads():
    """MirroredStrategy traces each replica in its own thread; their blocks
    overlap, and an unbalanced patch once leaked one run's `sparse_as_dense`
    into the next model's trace."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    keras_sum = TFOptimizer._all_reduce_sum_gradients
    keras_update = TFOptimizer._distributed_tf_update_step
    _fit_two_replicas(FitOptions(steps_per_execution=4, sparse_as_dense=True), rows=64)
    assert TFOptimizer._all_reduce_sum_gradients is keras_sum
    assert TFOptimizer._distributed_tf_update_step is keras_update
