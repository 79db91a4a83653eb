"""`ResidentIterator` on TensorFlow: the position in two int64 variables a
`tf.train.Checkpoint` saves with the weights; state, checks and `epochs()` are
`_data/position.py`'s. See docs/custom_loops.md."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from shardfeed._data.position import EpochPosition, OpensEpochs
from shardfeed._tf.epoch import ResidentEpoch


class ResidentIterator(tf.Module, EpochPosition[ResidentEpoch]):
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

    def __init__(self, dataset: OpensEpochs[ResidentEpoch], *, augment: bool = False) -> None:
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

    def _position(self) -> tuple[int, int]:
        epoch, step = (int(v) for v in self.position.numpy())
        return epoch, step

    def _move(self, epoch: int, step: int) -> None:
        self.position.assign([epoch, step])

    def _stored_identity(self) -> list[int]:
        return [int(v) for v in self.identity.numpy()]
