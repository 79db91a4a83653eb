"""The exchange's arithmetic (`_data/exchange.py`), without TensorFlow.

Every rank computes the same moves from the permutation and the layout; the
moves must put each row where the epoch needs it, keep every row resident
exactly once, and never stage more than one round per replica.
"""

from __future__ import annotations

import numpy as np
import pytest

from shardfeed._data import exchange as ex
from shardfeed._data.plan import plan_shards


def _run(held, dest, k):
    held = [h.copy() for h in held]
    rounds = list(ex.iter_rounds(held, dest, k))
    for rnd in rounds:
        sent, received = rnd.counts.sum(axis=1), rnd.counts.sum(axis=0)
        np.testing.assert_array_equal(sent, received)  # arrivals fill the freed slots
        assert sent.max(initial=0) <= k
        assert np.all(np.diag(rnd.counts) == 0)
        ex.apply_round(held, rnd)
    return held, rounds


@pytest.mark.parametrize(
    ("rows", "replicas", "b", "drop"),
    [
        (1001, 2, 64, False),  # uneven shards, partial last step
        (1001, 3, 100, False),
        (1001, 4, 64, True),  # 233 rows dropped, they stay resident
        (10, 4, 1, False),  # one-row replicas
        (5, 4, 1, False),  # a replica would have no row: the last step is dropped
    ],
)
def test_moves_put_each_epoch_row_on_its_replica_and_keep_every_row_once(
    rows, replicas, b, drop
):
    plan = plan_shards(rows, replicas, b, "shard", drop)
    held = ex.initial_layout(plan)
    for epoch in range(3):
        perm = np.random.default_rng(epoch).permutation(rows)
        needed = ex.epoch_rows(plan, perm)
        dest = ex.global_destinations(held, needed, rows)
        held, _ = _run(held, dest, k=7)
        assert sorted(np.concatenate(held).tolist()) == list(range(rows))  # each row once
        for r in range(replicas):
            assert len(held[r]) == plan.shard_rows(r)
            assert set(needed[r].tolist()) <= set(held[r].tolist())
        used = np.concatenate(needed)
        assert len(set(used.tolist())) == len(used) == rows - plan.dropped_rows_per_epoch


def test_epoch_rows_are_the_replicated_slices_of_the_global_steps():
    plan = plan_shards(10, 2, 2)
    assert [r.tolist() for r in ex.epoch_rows(plan, np.arange(10))] == [
        [0, 1, 4, 5, 8],
        [2, 3, 6, 7, 9],
    ]


def test_rows_already_in_place_do_not_move():
    plan = plan_shards(12, 3, 2)
    held = ex.initial_layout(plan)
    # Step s gives replica r rows 4r + 2s and 4r + 2s + 1: the rows it already holds.
    perm = np.array([4 * r + 2 * s + i for s in range(2) for r in range(3) for i in range(2)])
    needed = ex.epoch_rows(plan, perm)
    assert [n.tolist() for n in needed] == [h.tolist() for h in held]
    dest = ex.global_destinations(held, needed, 12)
    assert list(ex.iter_rounds(held, dest, 1)) == []


def test_rounds_respect_the_staging_bound():
    plan = plan_shards(1000, 4, 10)
    held = ex.initial_layout(plan)
    needed = ex.epoch_rows(plan, np.random.default_rng(0).permutation(1000))
    dest = ex.global_destinations(held, needed, 1000)
    _, small = _run(held, dest, k=5)
    _, large = _run(held, dest, k=10_000)
    moved = sum(int(r.counts.sum()) for r in small)
    assert moved == sum(int(r.counts.sum()) for r in large)
    assert 0.6 * 1000 < moved < 0.9 * 1000  # about (1 - 1/R) of the rows move
    assert len(large) <= 4 and len(small) >= moved // 4 // 5


@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0])
def test_partial_exchange_moves_a_fraction_and_keeps_counts(fraction):
    plan = plan_shards(1001, 4, 16)
    held = ex.initial_layout(plan)
    dest = ex.partial_destinations(held, fraction, seed=3, epoch=0, num_rows=1001)
    np.testing.assert_array_equal(np.bincount(dest, minlength=4), [len(h) for h in held])
    held2, rounds = _run(held, dest, k=50)
    moved = sum(int(r.counts.sum()) for r in rounds)
    expected = fraction * 1001 * 3 / 4  # pool rows dealt to another replica
    assert abs(moved - expected) < 0.15 * 1001
    assert sorted(np.concatenate(held2).tolist()) == list(range(1001))


def test_a_buffer_too_small_for_one_row_is_refused():
    with pytest.raises(ValueError) as err:
        ex.round_rows(100, 64, 2)
    assert str(err.value) == (
        "`LoadOptions.exchange_buffer_bytes` must hold one round of at least one row per "
        "replica. Received: exchange_buffer_bytes=100, row_bytes=64, staged_rows_per_row=2. "
        "Use exchange_buffer_bytes >= 128."
    )
    assert ex.round_rows(1000, 64, 2) == 7


@pytest.mark.parametrize(
    ("replicas", "workers", "backend", "staged"),
    [
        (4, 1, "tf.distribute", 2),  # one process: device copies, a send and a receive buffer
        (4, 1, None, 2),  # memory_plan on one worker: the same
        (8, 2, "horovod", 2),  # hvd.alltoall: a send and a receive buffer
        (8, 2, "tf.distribute", 9),  # an all-gather: every replica's send buffer and its own
        (8, 2, None, 9),  # memory_plan, backend unknown: the larger
    ],
)
def test_one_staging_factor_for_the_fit_check_the_rounds_and_the_memory_plan(
    replicas, workers, backend, staged
):
    assert ex.staged_rows_per_row(replicas, workers, backend) == staged
    plan = plan_shards(1001, replicas, 10)
    largest = max(plan.shard_rows(r) for r in range(replicas)) * 8
    assert ex.staging_bytes(plan, 8, 10**9, staged) == staged * largest  # whole shards
    assert ex.staging_bytes(plan, 8, 1000, staged) == 1000  # the buffer caps it


def test_the_default_buffer_is_an_eighth_of_the_largest_shard_within_bounds():
    # Before: 256 MiB whatever the shard (2 x 256 MiB staged beside 366 MiB of
    # rows on 2 devices: a peak of 2.56x the rows).
    from shardfeed import LoadOptions

    mib = 2**20
    plan = plan_shards(2**20 + 1, 2, 256, "shard", False)  # shards of 524,289 and 524,288 rows
    assert LoadOptions().exchange_buffer_bytes == "auto"
    assert ex.buffer_bytes("auto", plan, 512) == 524_289 * 512 // 8  # the larger shard's eighth
    assert ex.buffer_bytes("auto", plan, 4) == 16 * mib  # small shards: the floor
    assert ex.buffer_bytes("auto", plan, 8192) == 256 * mib  # large shards: the old default
    assert ex.buffer_bytes(12_345, plan, 4) == 12_345  # a number given is kept
    with pytest.raises(ValueError, match=r'must be "auto" or a positive integer.*'
                       r"Received: exchange_buffer_bytes='big'"):
        LoadOptions(exchange_buffer_bytes="big")  # type: ignore[arg-type]
