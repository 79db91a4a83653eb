"""`ResidentIterator` on JAX: the position in two Python ints (`get_state()` is saved beside
the weights); leaving an epoch closes it, so its copy takes the next epoch's rows."""

from __future__ import annotations

from shardfeed._data.position import EpochPosition, OpensEpochs
from shardfeed._jax.epoch import ResidentEpoch


class ResidentIterator(EpochPosition[ResidentEpoch]):
    """A resumable position over a JAX dataset's training epochs, Grain-style.

    `for epoch in it.epochs(n): for step, batch in epoch: ...`; each step
    eager iteration hands out advances the position, an epoch's end makes it
    `(epoch + 1, 0)`. `get_state()`/`set_state()` are plain integers (save
    them beside the weights, docs/custom_loops.md). Moving on to the next
    epoch closes the one left (its device data is let go of; batches already
    taken stay valid).

    Args:
        dataset: The training dataset.
        augment: Apply the dataset's `augment` to training batches (the keys
            `shardfeed.fit` uses: from `(seed, epoch, step)`).
    """

    def __init__(self, dataset: OpensEpochs[ResidentEpoch], *, augment: bool = False) -> None:
        self._dataset = dataset
        self._augment = augment
        self._at = (0, 0)

    def __repr__(self) -> str:
        epoch, step = self._at
        return f"ResidentIterator(epoch={epoch}, step={step})"

    def _position(self) -> tuple[int, int]:
        return self._at

    def _move(self, epoch: int, step: int) -> None:
        self._at = (epoch, step)

    def _leave(self, epoch: ResidentEpoch) -> None:
        # Before the next epoch opens: a closed epoch's copy is where the
        # dataset writes the next one (one copy, as the memory check counts).
        epoch.close()
