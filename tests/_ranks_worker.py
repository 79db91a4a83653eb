"""One worker of the rank-agreement tests (not a test module).

`data MODE CALL`: builds this rank's arrays (`same`: identical on every rank;
`rows`: 1,000 rows on rank 0 and 1,037 others on rank 1; `permuted`: the same
1,000 rows in a per-rank order) and calls `fit`, `evaluate` or `predict`.
`save WHAT PATH`: `save_model` to PATH, or `fit` with a `BackupAndRestore`
writing to PATH. Either way each rank records what it raised (or "ok") in
`OUT.rankN.txt`, so the test sees every rank's error, not only the first.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def _arrays(mode: str, rank: int) -> tuple[np.ndarray, np.ndarray]:
    rows = 1037 if mode == "rows" and rank == 1 else 1000
    rng = np.random.default_rng(1 if mode == "rows" and rank == 1 else 0)
    x = rng.normal(size=(rows, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    if mode == "permuted":  # an unseeded shuffle before building the dataset
        order = np.random.default_rng(100 + rank).permutation(rows)
        x, y = x[order], y[order]
    return x, y


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("task", choices=["data", "save"])
    p.add_argument("mode")
    p.add_argument("arg")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import keras

    import shardfeed

    world = shardfeed.init()
    with world.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    x, y = _arrays(args.mode if args.mode in ("rows", "permuted") else "same", world.rank)
    try:
        if args.task == "data":
            if args.arg == "fit":
                # "seed": another seed on rank 1, replicated (each rank draws its own
                # share of the order: some rows trained twice, some never).
                other = args.mode == "seed" and world.rank == 1
                ds = shardfeed.ShardedResidentDataset(
                    x, y, per_replica_batch_size=50, seed=1 if other else 0,
                    placement="replicate" if args.mode == "seed" else "shard",
                    strategy=world.strategy,
                )
                shardfeed.fit(model, ds, epochs=1, verbose=0)
            elif args.arg == "evaluate":
                shardfeed.evaluate(model, x, y, verbose=0)
            else:
                shardfeed.predict(model, x)
        elif args.mode == "save_model":
            shardfeed.save_model(model, args.arg)
        else:
            ds = shardfeed.ShardedResidentDataset(
                x, y, per_replica_batch_size=50, seed=0, strategy=world.strategy
            )
            backup = keras.callbacks.BackupAndRestore(args.arg)
            shardfeed.fit(model, ds, epochs=1, verbose=0, callbacks=[backup])
        outcome = "ok"
    except Exception as err:  # recorded for the test, whatever it is
        outcome = f"{type(err).__name__}: {err}"
    with open(f"{args.out}.rank{world.rank}.txt", "w") as f:
        f.write(outcome)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
