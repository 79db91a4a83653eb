"""One worker of the multi-process `train_step` test (not a test module).

Trains the guide's custom-`train_step` model on 100 rows for 2 epochs in
the global order (`placement="replicate"`, no shuffle) and writes its
weights, its custom metric's History and the step count (summed over every
replica) to `<out>.rank<r>.npz`. With `--assign-updates` its step updates
the weights without an optimizer (Horovod refuses it).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--assign-updates", action="store_true",
                   help="a train_step that updates weights with assign_sub, no optimizer")
    args = p.parse_args()

    from _helpers_model_steps import AssignUpdates, custom_train_step_model, regression_data

    import shardfeed
    from shardfeed import ShardedResidentDataset

    world = shardfeed.init()
    x, y = regression_data()
    with world.scope():
        model = AssignUpdates.built() if args.assign_updates else custom_train_step_model()
        ds = ShardedResidentDataset(
            x, y, per_replica_batch_size=args.batch, shuffle=False, placement="replicate"
        )
    history = shardfeed.fit(model, ds, epochs=2, verbose=0)
    step_calls = int(model.step_calls.numpy())  # every rank reads: a collective
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    np.savez(
        f"{args.out}.rank{world.rank}.npz",
        weights=weights,
        my_custom_metric=np.asarray(history.history["my_custom_metric"]),
        step_calls=step_calls,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
