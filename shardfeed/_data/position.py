"""A resumable position over a dataset's training epochs, on either backend (`EpochPosition`).

Owns the position's state as plain integers (`get_state`/`set_state`), its
checks and `epochs()`' semantics; a backend's `ResidentIterator` stores the
position and opens and leaves its epochs.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from shardfeed._common import errors as _errors

STATE_KEYS = ("epoch", "step", "seed", "num_rows", "global_batch_size")
MAX_EPOCH = 2**62


def check_int(name: str, value: Any, low: int, high: int, fix: str) -> int:
    """`value` as an int if it is an integer (not a bool) in `[low, high]`;
    else a `ValueError` naming `name`, the range and `fix`."""
    if not (_errors.is_integer(value) and low <= value <= high):
        raise ValueError(
            _errors.message(f"`{name}` must be an integer in [{low}, {high}].",
                            f"{name}={value!r}", fix)
        )
    return int(value)


class SteppedEpoch(Protocol):
    """What the position needs of an epoch (either backend's `ResidentEpoch`):
    its number and steps, and the hook its eager iteration calls with each
    step it hands out."""

    epoch: int
    _on_step: Callable[[Any, int], None] | None

    @property
    def steps(self) -> int: ...


E = TypeVar("E", bound=SteppedEpoch)
E_co = TypeVar("E_co", bound=SteppedEpoch, covariant=True)


class OpensEpochs(Protocol[E_co]):
    """What a backend's iterator is given: a dataset that opens its training
    epochs (typed so, the iterator needs no import of its dataset's module,
    which imports it)."""

    def epoch(
        self, epoch: int, *, training: bool = True, first_step: int = 0, augment: bool = False
    ) -> E_co: ...


class EpochPosition(abc.ABC, Generic[E]):
    """`get_state`/`set_state`/`epochs` over a backend's storage of the position.

    A backend's iterator sets `_dataset` (an `OpensEpochs`) and `_augment`
    and provides `_position`/`_move` (the stored (epoch, step)), and may
    override `_stored_identity` (what a restore wrote) and `_leave` (an epoch
    the loop moved on from).
    """

    _dataset: Any
    _augment: bool

    # -- the backend's part --------------------------------------------------------

    @abc.abstractmethod
    def _position(self) -> tuple[int, int]:
        """The stored (epoch, step)."""

    @abc.abstractmethod
    def _move(self, epoch: int, step: int) -> None:
        """Stores (epoch, step)."""

    def _open(self, epoch: int, first_step: int) -> E:
        """The training epoch `epoch`, iteration starting at `first_step`."""
        opened: E = self._dataset.epoch(epoch, first_step=first_step, augment=self._augment)
        return opened

    def _stored_identity(self) -> list[int]:
        """(seed or -1, rows, global batch) as stored: this dataset's unless a
        checkpoint restore replaced it."""
        return self._identity()

    def _leave(self, epoch: E) -> None:
        """Called when the loop moves on from `epoch` to the next one (optional)."""

    # -- the position ------------------------------------------------------------------

    def _identity(self) -> list[int]:
        ds = self._dataset
        return [-1 if ds.seed is None else ds.seed, ds.num_rows, ds.plan.global_batch_size]

    def get_state(self) -> dict[str, Any]:
        """`{"epoch", "step", "seed", "num_rows", "global_batch_size"}`, plain ints
        (`seed` None without one)."""
        epoch, step = self._position()
        seed, num_rows, global_batch = self._stored_identity()
        return {
            "epoch": epoch,
            "step": step,
            "seed": None if seed < 0 else seed,
            "num_rows": num_rows,
            "global_batch_size": global_batch,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Moves the position to `state` (from `get_state`), checking that it
        is a position in this dataset.

        Raises:
            ValueError: For a missing or extra key, a value of the wrong type
                or range, or a state of another dataset (seed, rows, global batch).
        """
        if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                _errors.message(
                    f"The state must be a dict with exactly the keys {list(STATE_KEYS)}.",
                    f"state keys={got}",
                    "Pass what `ResidentIterator.get_state()` returned.",
                )
            )
        steps = self._dataset.plan.steps_per_epoch
        epoch = check_int("state['epoch']", state["epoch"], 0, MAX_EPOCH, "Pass a saved state.")
        step = check_int(
            "state['step']", state["step"], 0, steps - 1,
            f"Pass a saved state of this dataset (its epochs have {steps} steps).",
        )
        seed, num_rows, global_batch = self._identity()
        mine = {"seed": None if seed < 0 else seed, "num_rows": num_rows,
                "global_batch_size": global_batch}
        for key, value in mine.items():
            if state[key] != value or isinstance(state[key], bool):
                raise ValueError(
                    _errors.message(
                        "The state is a position in another dataset: its seed, rows and "
                        "global batch must be this dataset's.",
                        f"state[{key!r}]={state[key]!r}, this dataset's {key}={value!r}",
                        "Restore into an iterator of the dataset the state was saved from "
                        "(same rows, seed and global batch).",
                    )
                )
        self._move(epoch, step)

    def epochs(self, num_epochs: int) -> Iterator[E]:
        """The training epochs from the current position up to `num_epochs`;
        the first starts at the position's step. Moving on to the next epoch
        moves the position to its start.

        Raises:
            ValueError: For `num_epochs` not an integer in range (at the call);
                for a restored position of another dataset (when iteration starts).
        """
        num_epochs = check_int("num_epochs", num_epochs, 0, MAX_EPOCH, "Pass e.g. `epochs(10)`.")
        return self._epochs(num_epochs)

    def _epochs(self, num_epochs: int) -> Iterator[E]:
        # A checkpoint restore may have replaced the identity: check it first.
        self.set_state(self.get_state())
        while True:
            epoch, step = self._position()
            if epoch >= num_epochs:
                return
            opened = self._open(epoch, step)
            opened._on_step = self._advance
            try:
                yield opened
            finally:
                opened._on_step = None
            # Reached only when the loop asks for the next epoch (not when it
            # stops iterating): the epoch is left, early or at its end.
            if self._position()[0] == epoch:
                self._move(epoch + 1, 0)
            self._leave(opened)

    def _advance(self, epoch: E, step: int) -> None:
        if step + 1 < epoch.steps:
            self._move(epoch.epoch, step + 1)
        else:
            self._move(epoch.epoch + 1, 0)
