"""An epoch's calls on TensorFlow, on Keras' grid (`_training/calls.py`'s `Call`):
`EpochInputs` (what the calls take), `EpochCalls` (what `Loop.epoch` returns; `run` runs
one call and keeps the epoch's running loss), and `gather_pieces`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from shardfeed._data.plan import ShardPlan
from shardfeed._distribute import progress as _progress
from shardfeed._tf.epoch import ResidentEpoch
from shardfeed._tf.functions import Mode
from shardfeed._training.calls import Call, epoch_calls

if TYPE_CHECKING:
    from shardfeed._tf.model_steps import ModelSteps


@dataclasses.dataclass(frozen=True)
class EpochInputs:
    """What the compiled calls of one epoch take (`Loop.run`).

    Attributes:
        order: The open epoch: its steps' slots, and the gather the calls trace.
        plan: The epoch's plan (steps, the partial last step's rows).
        epoch: The epoch's number (seeds augmentation).
        handles: The columns' handles per local replica.
        replicas: Each local replica's global id, placed on it (None: unused).
    """

    order: ResidentEpoch
    plan: ShardPlan
    epoch: int
    handles: Any
    replicas: Any


class CallingLoop(Protocol):
    """What an epoch's calls read of their loop (`Loop`, above this module:
    typed here, so `calls` never imports `loop`)."""

    @property
    def model_steps(self) -> ModelSteps: ...
    def steps_per_call(self, num_steps: int) -> int: ...
    def run(self, inputs: EpochInputs, mode: Mode, start: int, stop: int) -> tuple[Any, int]: ...
    def logs(self, loss: float) -> dict[str, float]: ...
    def own_logs(self, value: Any) -> dict[str, Any]: ...


class EpochCalls:
    """One epoch's calls (see `Loop.epoch`): an iterable of `Call`s and the
    `run` that executes one, holding the epoch open until `close`."""

    def __init__(
        self,
        loop: CallingLoop,
        inputs: EpochInputs,
        training: bool,
        first: int,
        last: int,
        step_offset: int,
        totals: tuple[float, int],
    ) -> None:
        self._loop = loop
        self._inputs = inputs
        self._mode: Mode = "train" if training else "test"
        self._own = loop.model_steps.own(self._mode)
        self.totals = totals  # the epoch's running (loss sum, rows)
        plan = inputs.plan
        self.steps_per_call = loop.steps_per_call(plan.full_steps_per_epoch)
        self.calls = epoch_calls(
            first, last, self.steps_per_call, step_offset=step_offset,
            partial_step=plan.full_steps_per_epoch if plan.has_partial_step else None,
            bounds=inputs.order.call_bounds or (),
        )

    def __iter__(self) -> Iterator[Call]:
        return iter(self.calls)

    def __enter__(self) -> EpochCalls:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._inputs.order.close()

    def logs(self) -> dict[str, Any]:
        """The epoch's logs so far (empty before its first step)."""
        loss_sum, rows = self.totals
        return self._loop.logs(loss_sum / rows) if rows else {}

    def run(self, call: Call) -> dict[str, Any]:
        """Runs `call`; returns the epoch's logs after it: our exact loss and
        the compiled metrics, or what the model's own step returned."""
        value: Any = None
        # Counted for `shardfeed launch`'s progress watch, which also sees a
        # rank stuck inside it (e.g. in a `py_function` that never returns).
        with _progress.call(f"a compiled {self._mode} call"):
            for start, stop in call.pieces:
                value, rows = self._loop.run(self._inputs, self._mode, start, stop)
                if not self._own:
                    self.totals = (self.totals[0] + float(value), self.totals[1] + rows)
        return self._loop.own_logs(value) if self._own else self.logs()


# Pieces a one-replica XLA training call's rows are gathered in
# (`gather_pieces`): `Loop.train_gathered` gathers the next piece while XLA
# trains on this one. One: on the 2-core VM more pieces showed no gain in
# `fit` and cost an XLA compile (shardfeed/_commands/bench/NOTES.md, "W2's gap per step");
# a call whose rows exceed half the counted bytes still comes in pieces.
GATHER_PIECES = 1


def gather_pieces(
    steps: int, steps_per_gather: int, pieces: int | None = None
) -> list[tuple[int, int]]:
    """The `(start, stop)` steps of a call of `steps` steps whose rows are
    gathered at once: about `pieces` (default `GATHER_PIECES`) pieces, two of which (the one
    trained on, the next one gathered) fit the `steps_per_gather` steps the
    memory plan counts (`ResidentEpoch.steps_per_gather`); one step each when only
    one step fits (then gathered one after the other).

    Example:
        >>> gather_pieces(118, 992), gather_pieces(118, 992, pieces=4)
        ([(0, 118)], [(0, 30), (30, 60), (60, 90), (90, 118)])
        >>> gather_pieces(5, 1)
        [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    """
    piece = max(1, min(math.ceil(steps / (pieces or GATHER_PIECES)), steps_per_gather // 2))
    return [(a, min(steps, a + piece)) for a in range(0, steps, piece)]
