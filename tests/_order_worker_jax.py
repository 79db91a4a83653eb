"""The JAX side of tests/_data/test_order.py (not a test module).

Run with a Keras-on-JAX Python (`SHARDFEED_JAX_PYTHON`). `records OUT`:
records every case of `_helpers_order.CASES` on JAX devices and writes them
as JSON to OUT. `resume BACKUP EPOCHS OUT`: resumes a fit of
`_helpers_order.regression_model` from the `BackupAndRestore` directory
BACKUP (written on TensorFlow), trains to EPOCHS and writes the weights to
OUT (`.npz`).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    if sys.argv[1] == "resume":
        return resume(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    if sys.argv[1] == "interrupt":
        return interrupt(sys.argv[2], int(sys.argv[3]))
    return records(sys.argv[2])


def _replicas(n: int) -> None:
    """The first `n` devices as the world (what `shardfeed.init` sets)."""
    import jax

    from shardfeed._jax import world as _world

    _world.remember_initialized(_world.World(0, 1, 0, tuple(jax.devices()[:n])))


def _regression_fit(epochs: int, callbacks: list) -> tuple:
    from _helpers_order import CASES, RESUME_CASE, dataset_kwargs, regression, regression_model

    import shardfeed
    from shardfeed._jax.dataset import ShardedResidentDataset

    _replicas(CASES[RESUME_CASE][0])
    ds = ShardedResidentDataset(*regression(), **dataset_kwargs(RESUME_CASE))
    model = regression_model()
    history = shardfeed.fit(model, ds, epochs=epochs, verbose=0, callbacks=callbacks)
    return model, history


def interrupt(backup: str, save_freq: int) -> int:
    """A fit of 2 epochs backed up every `save_freq` steps, preempted in epoch 1."""
    import keras
    from _helpers_resume import Preempt

    try:
        _regression_fit(
            2, [keras.callbacks.BackupAndRestore(backup, save_freq=save_freq), Preempt(1, 13)]
        )
    except KeyboardInterrupt:
        return 0
    raise AssertionError("not preempted")


def resume(backup: str, epochs: int, out: str) -> int:
    import keras

    backup_cb = keras.callbacks.BackupAndRestore(backup)
    model, history = _regression_fit(epochs, [backup_cb])
    losses = np.array(history.history["loss"])
    np.savez(out, *model.get_weights(), losses=losses)
    return 0


def records(path: str) -> int:
    import jax
    from _helpers_order import CASES, data, dataset_kwargs, record

    from shardfeed._data.options import LoadOptions
    from shardfeed._jax.dataset import ShardedResidentDataset

    def replica_ys(epoch, step, batch):
        ys = np.asarray(batch.y)  # every replica's real rows, in global replica order
        return np.split(ys, np.cumsum(epoch.replica_rows(step))[:-1])

    out = {}
    for name, (replicas, *_, fraction, _) in CASES.items():
        _replicas(replicas)
        for copy in (False, True):  # rows gathered where they sit (moved in place), or copied
            # A small staging buffer: several exchange rounds an epoch.
            options = LoadOptions(
                exchange_fraction=fraction, exchange_buffer_bytes=64, epoch_copy=copy
            )
            ds = ShardedResidentDataset(*data(), **dataset_kwargs(name), load_options=options)
            out[f"{name}, epoch_copy={copy}"] = record(
                lambda e, t, ds=ds: ds.epoch(e, training=t), replica_ys
            )
    with open(path, "w") as f:
        json.dump({"backend": jax.default_backend(), "records": out}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
