"""Keras' `steps_per_execution` grid (`_training/calls.py`), the one both backends' loops run."""

from __future__ import annotations

import itertools

import pytest

from shardfeed._training.calls import epoch_calls


def _reference(first, last, k, offset, cuts):
    """Keras' rule written out step by step: step `s` belongs to cell
    `(s - offset) // k`; a piece ends at a cell's end, at a cut, or at `last`."""
    cells: dict[int, list[list[int]]] = {}
    for s in range(first, last):
        pieces = cells.setdefault((s - offset) // k, [])
        if not pieces or s in cuts:
            pieces.append([s, s + 1])
        else:
            pieces[-1][1] = s + 1
    return [
        (max(first, offset + c * k) - offset, c * k + k - 1, tuple(map(tuple, p)))
        for c, p in cells.items()
    ]


@pytest.mark.parametrize(
    ("first", "last", "k", "offset", "partial", "bounds", "expected"),
    [
        # 100 rows, batch 16: Keras' hooks 0-2, 3-5, 6-8; the partial step alone
        (0, 7, 3, 0, 6, (), [(0, 2, ((0, 3),)), (3, 5, ((3, 6),)), (6, 8, ((6, 7),))]),
        # the partial step joins the one short call as a piece of its own
        (0, 7, 101, 0, 6, (), [(0, 100, ((0, 6), (6, 7)))]),
        # a shorter last call keeps Keras' end hook
        (0, 6, 4, 0, None, (), [(0, 3, ((0, 4),)), (4, 7, ((4, 6),))]),
        # a streamed chunk starting at step 3 cuts a call into pieces, not its hooks
        (
            0,
            5,
            2,
            0,
            None,
            (0, 3),
            [(0, 1, ((0, 2),)), (2, 3, ((2, 3), (3, 4))), (4, 5, ((4, 5),))],
        ),
        # resumed at step 4 of a fit epoch starting at data step 1: the grid stays
        (5, 9, 3, 1, None, (), [(4, 5, ((5, 7),)), (6, 8, ((7, 9),))]),
    ],
)
def test_calls_follow_keras_grid(first, last, k, offset, partial, bounds, expected):
    calls = epoch_calls(first, last, k, step_offset=offset, partial_step=partial, bounds=bounds)
    assert [(c.begin_step, c.end_step, c.pieces) for c in calls] == expected


def test_every_layout_matches_the_rule_step_by_step():
    for first, span, k, offset, chunk in itertools.product(
        range(4), range(9), range(1, 5), range(3), range(1, 5)
    ):
        first, last = offset + first, offset + first + span
        cuts = set(range(offset, last + 1, chunk))
        calls = epoch_calls(first, last, k, step_offset=offset, bounds=cuts)
        got = [(c.begin_step, c.end_step, c.pieces) for c in calls]
        assert got == _reference(first, last, k, offset, cuts), (first, last, k, offset, chunk)
        assert [c.start for c in calls[:1]] == ([first] if span else [])


def test_steps_per_call_below_one_is_refused():
    with pytest.raises(ValueError, match="steps_per_call must be at least 1"):
        epoch_calls(0, 4, 0)
