"""`ResidentIterator`: a resumable position over a dataset's training epochs.

Owns the position (epoch, step) a custom loop resumes from, as plain
integers (`get_state`/`set_state`, Grain-style) and as variables a
`tf.train.Checkpoint` saves with the weights; the epochs themselves are
`epoch.ResidentEpoch`s. See docs/custom_loops.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from shardfeed._common import errors as _errors
from shardfeed._data.epoch import ResidentEpoch, check_int

if TYPE_CHECKING:
    from shardfeed._data.dataset import ShardedResidentDataset


class ResidentIterator(tf.Module):
    """A resumable position over a dataset's training epochs, Grain-style.

    `for epoch in it.epochs(n): for step, batch in epoch: ...`; each step
    handed out advances the position, an epoch's end makes it
    `(epoch + 1, 0)`. `get_state()`/`set_state()` are plain integers; as a
    `tf.Module` it is trackable by `tf.train.Checkpoint(data=it)`, its
    position in two int64 variables on the CPU (restored with the weights).

    Args:
        dataset: The training dataset.
        augment: Apply the dataset's `augment` to training batches.
    """

    def __init__(self, dataset: ShardedResidentDataset, *, augment: bool = False) -> None:
        super().__init__(name="resident_iterator")
        self._dataset = dataset
        self._augment = augment
        # Constructed directly, as the resident rows are (`storage.py`): a
        # `tf.Variable` in a strategy's scope would become mirrored (and under
        # MultiWorkerMirroredStrategy its creation a collective).
        with tf.device("/CPU:0"):
            self.position = resource_variable_ops.ResourceVariable(
                tf.zeros([2], tf.int64), trainable=False, name="position"
            )
            # What the position is a position in: checked when restored.
            self.identity = resource_variable_ops.ResourceVariable(
                tf.constant(self._identity(), tf.int64), trainable=False, name="identity"
            )

    def _identity(self) -> list[int]:
        ds = self._dataset
        return [-1 if ds.seed is None else ds.seed, ds.num_rows, ds.plan.global_batch_size]

    def get_state(self) -> dict[str, Any]:
        """`{"epoch", "step", "seed", "num_rows", "global_batch_size"}`, plain ints
        (`seed` None without one)."""
        epoch, step = (int(v) for v in self.position.numpy())
        seed, num_rows, global_batch = (int(v) for v in self.identity.numpy())
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
        keys = ("epoch", "step", "seed", "num_rows", "global_batch_size")
        if not isinstance(state, dict) or set(state) != set(keys):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                _errors.message(
                    f"The state must be a dict with exactly the keys {list(keys)}.",
                    f"state keys={got}",
                    "Pass what `ResidentIterator.get_state()` returned.",
                )
            )
        steps = self._dataset.plan.steps_per_epoch
        epoch = check_int("state['epoch']", state["epoch"], 0, 2**62, "Pass a saved state.")
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
        self.position.assign([epoch, step])

    def epochs(self, num_epochs: int) -> Iterator[ResidentEpoch]:
        """The training epochs from the current position up to `num_epochs`;
        the first starts at the position's step. Moving on to the next epoch
        moves the position to its start."""
        num_epochs = check_int("num_epochs", num_epochs, 0, 2**62, "Pass e.g. `epochs(10)`.")
        # A checkpoint restore may have replaced the identity: check it first.
        self.set_state(self.get_state())
        while True:
            epoch, step = (int(v) for v in self.position.numpy())
            if epoch >= num_epochs:
                return
            opened = self._dataset.epoch(epoch, first_step=step, augment=self._augment)
            opened._on_step = self._advance
            try:
                yield opened
            finally:
                opened._on_step = None
            if int(self.position.numpy()[0]) == epoch:
                self.position.assign([epoch + 1, 0])

    def _advance(self, epoch: ResidentEpoch, step: int) -> None:
        if step + 1 < epoch.steps:
            self.position.assign([epoch.epoch, step + 1])
        else:
            self.position.assign([epoch.epoch + 1, 0])
