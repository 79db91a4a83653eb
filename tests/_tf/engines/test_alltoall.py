"""The engines' all-to-all of rows (`_tf/engines/alltoall.py`) in one process.

Rows of any dtype cross as int32 words and come back byte-exact; the
all-gather path that several workers use (`GatheredAllToAll`, run here over
a MirroredStrategy of 2 logical CPUs, whose `strategy.gather` it calls the
same way) delivers what device copies deliver and traces once for every
round, whatever the round's row counts.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _helpers import mirrored_strategy

from shardfeed._tf.engines import alltoall

pytestmark = pytest.mark.multi_device


@pytest.mark.parametrize(
    ("dtype", "row_shape"),
    [
        ("float32", (6,)),
        ("uint8", (3,)),  # 3 bytes: padded to one word
        ("bool", (5, 2)),  # bool travels as uint8
        ("int64", ()),  # scalar rows, two words each
        ("float16", (1,)),  # half a word
    ],
)
def test_words_round_trip_byte_exact_with_a_symbolic_row_count(dtype, row_shape):
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 256, size=(7, *row_shape)).astype(dtype)
    if dtype == "float32":
        rows = rng.normal(size=(7, *row_shape)).astype(dtype)
    like = tf.constant(rows)
    width = alltoall.words_per_row(row_shape, like.dtype)

    @tf.function(input_signature=[tf.TensorSpec([None, *row_shape], like.dtype)])
    def round_trip(t):
        words = alltoall.to_words(t)
        return words, alltoall.from_words(words, like)

    for n in (7, 3, 0):
        words, back = round_trip(like[:n])
        assert words.dtype == tf.int32 and words.shape == (n, width)
        assert back.dtype == like.dtype
        np.testing.assert_array_equal(back.numpy(), rows[:n])
    assert round_trip.experimental_get_tracing_count() == 1
    np.testing.assert_array_equal(  # the host packing agrees with the device one
        alltoall.array_to_words(rows), alltoall.to_words(like).numpy()
    )


def test_gathered_all_to_all_equals_device_copies_and_traces_once_for_every_round():
    strategy = mirrored_strategy(2)
    devices = ["/CPU:0", "/CPU:1"]
    gathered = alltoall.GatheredAllToAll(strategy, [0, 1], devices)
    rng = np.random.default_rng(1)
    width = 3
    rounds = [
        np.array([[0, 5], [5, 0]]),
        np.array([[0, 1], [1, 0]]),  # a smaller round (the last of an exchange)
        np.array([[0, 0], [0, 0]]),  # nothing moves
        np.array([[2, 4], [3, 1]]),  # replicas keep some rows, send unequal counts
        np.array([[0, 17], [17, 0]]),  # a larger one
    ]
    for counts in rounds * 4:
        send = []
        for s, device in enumerate(devices):
            with tf.device(device):
                send.append(tf.constant(
                    rng.integers(-(2**31), 2**31 - 1, size=(counts[s].sum(), width)), tf.int32
                ))
        got = gathered(send, counts)
        expected = alltoall.local_all_to_all(send, counts, devices)
        for d in range(2):
            assert got[d].shape == (counts[:, d].sum(), width)
            np.testing.assert_array_equal(got[d].numpy(), expected[d].numpy())
    assert gathered.tracing_count == 1
