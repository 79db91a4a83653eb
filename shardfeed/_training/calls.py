"""Keras' `steps_per_execution` grid over an epoch's steps (`epoch_calls`), for both backends.

Keras' epoch iterator (`keras/src/trainers/epoch_iterator.py`) counts an
epoch's steps in cells of `k` from its first step and runs one cell per
compiled call: the batch hooks get `begin_step` and `begin_step + k - 1`, also
for the epoch's shorter last cell. Each backend's loop runs a `Call` as the
compiled pieces it lists: a cell is cut where the partial last step starts
(a call of its own on its real rows) and at a streamed epoch's chunk starts
(rows resident one chunk at a time). The backend owns what a piece runs;
this module owns only the arithmetic.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class Call:
    """One cell of Keras' grid: what the batch hooks see, and what runs.

    Attributes:
        begin_step, end_step: The batch hooks' step numbers, Keras' own
            (counted from the epoch's first step, `step_offset`): call `j`
            ends at `j * k + k - 1`, also when it has fewer steps (the
            epoch's last), and begins at `j * k`, or at the step a resumed
            epoch starts from inside it.
        pieces: The data steps `[start, stop)` it runs, one compiled call
            each, in order.
    """

    begin_step: int
    end_step: int
    pieces: tuple[tuple[int, int], ...]

    @property
    def start(self) -> int:
        """The first data step this call runs."""
        return self.pieces[0][0]

    @property
    def stop(self) -> int:
        """The data step after the last one this call runs."""
        return self.pieces[-1][1]


def epoch_calls(
    first: int,
    last: int,
    steps_per_call: int,
    *,
    step_offset: int = 0,
    partial_step: int | None = None,
    bounds: Iterable[int] = (),
) -> list[Call]:
    """The calls over data steps `[first, last)`: cells of `steps_per_call`
    steps counted from `step_offset`, each cut into pieces at `partial_step`
    (the epoch's partial last step, if it has one) and at `bounds` (a
    streamed epoch's chunk starts).

    Example:
        >>> [(c.begin_step, c.end_step, c.pieces) for c in epoch_calls(0, 7, 3, partial_step=6)]
        [(0, 2, ((0, 3),)), (3, 5, ((3, 6),)), (6, 8, ((6, 7),))]
        >>> [c.pieces for c in epoch_calls(0, 5, 2, bounds=[0, 3])]
        [((0, 2),), ((2, 3), (3, 4)), ((4, 5),)]
        >>> [(c.begin_step, c.end_step, c.pieces) for c in epoch_calls(3, 8, 3, step_offset=1)]
        [(2, 2, ((3, 4),)), (3, 5, ((4, 7),)), (6, 8, ((7, 8),))]
    """
    k = steps_per_call
    if k < 1:
        raise ValueError(f"steps_per_call must be at least 1. Received: steps_per_call={k}.")
    cuts = set(bounds)
    if partial_step is not None:
        cuts.add(partial_step)
    out: list[Call] = []
    cell = (first - step_offset) // k
    while first < last and step_offset + cell * k < last:
        begin = step_offset + cell * k
        a, b = max(begin, first), min(begin + k, last)
        edges = sorted({a, b, *(x for x in cuts if a < x < b)})
        out.append(
            Call(a - step_offset, begin - step_offset + k - 1, tuple(itertools.pairwise(edges)))
        )
        cell += 1
    return out
