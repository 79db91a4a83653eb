"""The in-place exchange's arithmetic (`_data/relayout.py`): pure NumPy, checked
against what it must do for random layouts, plans and round sizes."""

import numpy as np
import pytest

from shardfeed._data import exchange as _exchange
from shardfeed._data.plan import plan_shards
from shardfeed._data.relayout import rounds, rows_per_pair, staging_bytes, targets


def _simulate(layout, moves, slots):
    """Runs the rounds on buffers of row numbers, as the device does (a round's
    sends are read before its writes), checking that each row lands in an
    emptied slot."""
    n_rep = len(layout)
    buffers = [np.full(slots, -1, np.int64) for _ in layout]
    for g, held in enumerate(layout):
        buffers[g][: len(held)] = held
    emptied = [np.zeros(slots, bool) for _ in layout]
    for r in moves:
        real = r.receive.transpose(1, 0, 2) < slots  # [src, dst, k]: real sends
        staged = [b[r.send[s]] for s, b in enumerate(buffers)]  # [dst, per_pair]
        for s in range(n_rep):
            emptied[s][r.send[s][real[s]]] = True
        for d, b in enumerate(buffers):
            into = r.receive[d].reshape(-1)
            rows = np.stack([staged[s][d] for s in range(n_rep)]).reshape(-1)
            keep = into < slots
            assert emptied[d][into[keep]].all(), "a row landed on a row still held"
            assert len(set(into[keep].tolist())) == int(keep.sum()), "two rows, one slot"
            b[into[keep]] = rows[keep]
            emptied[d][into[keep]] = False
    assert not any(e.any() for e in emptied), "a slot emptied and never filled"
    return buffers


CASES = [
    # (rows, replicas, batch, drop, per_pair)
    (1000, 2, 16, False, 10_000),  # everything in one round
    (1000, 2, 16, False, 7),  # many small rounds
    (1001, 3, 100, False, 13),  # uneven shards, a partial step
    (1001, 3, 100, True, 50),  # dropped rows stay resident somewhere
    (999, 4, 250, False, 1),  # one row per pair per round
    (5000, 5, 37, False, 64),
    (17, 8, 2, False, 3),  # replicas with one or two rows
]


@pytest.mark.parametrize(("num_rows", "n_rep", "batch", "drop", "per_pair"), CASES)
def test_rounds_bring_every_replica_its_rows_in_place(num_rows, n_rep, batch, drop, per_pair):
    plan = plan_shards(num_rows, n_rep, batch, "shard", drop, True)
    slots = max(b - a for a, b in plan.shards)
    layout = [np.arange(a, b) for a, b in plan.shards]
    for epoch in range(3):  # layouts after earlier epochs are permutations
        order = np.random.default_rng((0, epoch)).permutation(num_rows)
        rows = _exchange.epoch_rows(plan, order)
        target = targets(layout, rows)
        before = [held.copy() for held in layout]
        moves, after = rounds(layout, target, slots, per_pair)
        moves = list(moves)  # `after` is complete once every round is made
        buffers = _simulate(before, moves, slots)
        for g, b in enumerate(buffers):
            count = plan.shard_rows(g)
            assert (b[:count] == after[g]).all()  # the layout it reports is the real one
            assert (b[count:] == -1).all()  # padding slots never written
            assert set(rows[g].tolist()) <= set(after[g].tolist())  # what it takes is there
        assert sorted(np.concatenate(after).tolist()) == list(range(num_rows))  # each row once
        for r in moves:  # bounded, and no larger than the largest move needs
            k = r.send.shape[2]
            assert r.send.shape == r.receive.shape == (n_rep, n_rep, k)
            assert k <= per_pair and (k == per_pair or k & (k - 1) == 0)
        layout = after


def test_rows_that_do_not_move_stay_in_their_slots():
    layout = [np.array([0, 1, 2]), np.array([3, 4, 5])]
    target = np.array([0, 0, 1, 1, 1, 0])  # 2 <-> 5 swap, the rest stay
    moves, after = rounds(layout, target, 3, 4)
    assert len(list(moves)) == 1
    assert [a.tolist() for a in after] == [[0, 1, 5], [3, 4, 2]]


def test_a_round_never_receives_more_than_it_emptied():
    # Replica 0 sends 6 rows to 1; 1 sends 3 to 0 and 3 to 2; 2 sends 3 to 0.
    layout = [np.arange(0, 6), np.arange(6, 12), np.arange(12, 18)]
    target = np.array([1] * 6 + [0] * 3 + [2] * 3 + [0] * 3 + [2] * 3)
    for per_pair in (1, 2, 4):
        before = [held.copy() for held in layout]
        moves, after = rounds(before, target, 6, per_pair)
        _simulate(layout, list(moves), 6)
        for g in range(3):
            assert (target[after[g]] == g).all()


def test_targets_keep_unused_rows_where_they_are():
    layout = [np.array([0, 1, 2]), np.array([3, 4, 5])]
    target = targets(layout, [np.array([3, 4]), np.array([0, 1])])
    assert target.tolist() == [1, 1, 0, 0, 0, 1]  # 2 and 5 are nobody's: they stay


def test_rows_per_pair_bounds_a_rounds_staging():
    assert rows_per_pair(4, 100, 8 * 100 * 10) == 10
    assert rows_per_pair(4, 100, 1) == 1


def test_staging_bytes_count_no_more_than_the_largest_move_needs():
    assert staging_bytes(4, 100, 8 * 100 * 10, 10**6) == 8 * 100 * 10  # the buffer's rows
    assert staging_bytes(4, 100, 10**9, 100) == 8 * 128 * 100  # a 100-row shard: 128 a pair
    assert staging_bytes(2, 16, 10**9, 1) == 4 * 16  # one row


def test_staging_is_no_larger_than_the_moves():
    layout = [np.arange(0, 500), np.arange(500, 1000)]
    target = np.repeat([0, 1], 500)
    target[[0, 1, 2, 500, 501, 502]] = [1, 1, 1, 0, 0, 0]  # 3 rows each way
    moves, _ = rounds(layout, target, 500, 10**6)  # a budget of a million rows a pair
    assert [r.send.shape[2] for r in moves] == [4]  # stages 4, not a million


# -- the partial exchange (`exchange_fraction < 1`): which rows each replica holds --------


def test_partial_destinations_depend_on_the_rows_held_not_their_slots():
    """The backends' exchanges leave rows in different slots; the partial
    draw must give both the same holdings (it drew by slot before)."""
    plan = plan_shards(1001, 3, 16)
    layout = _exchange.initial_layout(plan)
    shuffled = [np.random.default_rng(g).permutation(h) for g, h in enumerate(layout)]
    for epoch in range(3):
        want = _exchange.partial_destinations(layout, 0.25, 7, epoch, 1001)
        got = _exchange.partial_destinations(shuffled, 0.25, 7, epoch, 1001)
        np.testing.assert_array_equal(got, want)


def test_holdings_are_each_replicas_rows_ascending():
    target = np.array([2, 0, 1, 0, 2, 2])
    assert [h.tolist() for h in _exchange.holdings(target, 4)] == [[1, 3], [2], [0, 4, 5], []]


@pytest.mark.parametrize(("n_rep", "fraction", "per_pair"), [(2, 0.25, 7), (4, 0.5, 1000)])
def test_partial_epochs_in_turn_through_the_rounds_equal_the_replay(n_rep, fraction, per_pair):
    """Epochs in sequence, rows moved by `rounds` (the layout carries over,
    in the rounds' slot order), hold what `partial_targets` replays from the
    loaded shards; each epoch about `fraction * (1 - 1/R)` of the rows change
    replica, none lost or duplicated, each replica keeps its count."""
    num_rows = 2003
    plan = plan_shards(num_rows, n_rep, 16)
    slots = max(b - a for a, b in plan.shards)
    loaded = [np.arange(a, b) for a, b in plan.shards]
    layout = [h.copy() for h in loaded]
    for epoch in range(4):
        target = _exchange.partial_destinations(layout, fraction, 11, epoch, num_rows)
        before = [h.copy() for h in layout]
        moves, layout = rounds(layout, target, slots, per_pair)
        buffers = _simulate(before, list(moves), slots)
        replay = _exchange.partial_targets(loaded, fraction, 11, range(epoch + 1), num_rows)
        for g, held in enumerate(_exchange.holdings(replay, n_rep)):
            assert sorted(layout[g].tolist()) == held.tolist()
            assert (buffers[g][: len(held)] == layout[g]).all()
            assert len(held) == plan.shard_rows(g)
        moved = sum(int((target[b] != g).sum()) for g, b in enumerate(before))
        expected = fraction * (1 - 1 / n_rep) * num_rows
        assert abs(moved - expected) < 0.1 * num_rows
        assert sorted(np.concatenate(layout).tolist()) == list(range(num_rows))


def test_partial_targets_replays_from_any_epochs_holdings():
    loaded = [np.arange(0, 50), np.arange(50, 100)]
    first = _exchange.partial_targets(loaded, 0.5, 3, range(2), 100)
    rest = _exchange.partial_targets(_exchange.holdings(first, 2), 0.5, 3, range(2, 4), 100)
    np.testing.assert_array_equal(
        rest, _exchange.partial_targets(loaded, 0.5, 3, range(4), 100)
    )
    with pytest.raises(ValueError, match="no epoch to replay"):
        _exchange.partial_targets(loaded, 0.5, 3, range(0), 100)
