"""Train a small MLP on a resident dataset: one script, every way of running it.

    python examples/train.py                             # one device (the fallback)
    python examples/train.py --cpu-devices 2             # several local devices (MirroredStrategy)
    shardfeed launch --num-workers 2 examples/train.py   # 2 workers (MultiWorkerMirroredStrategy)
    mpirun -np 2 python examples/train.py                # 2 workers, cluster built from MPI ranks
    horovodrun -np 2 --gloo python examples/train.py     # Horovod, one process per device

On GPUs, several local GPUs are used automatically. With `--data DIR` the
rows come from `DIR/x.npy` and `DIR/y.npy` (write them with
`python examples/train.py --write-data DIR`): each worker reads only the rows
its replicas own. Lines that differ from a plain Keras script say why in a
`# shardfeed:` comment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--per-replica-batch-size", type=int, default=64)
    p.add_argument("--placement", choices=["shard", "replicate"], default="shard")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", help="directory holding x.npy and y.npy")
    p.add_argument("--write-data", metavar="DIR", help="write the synthetic data as .npy, exit")
    p.add_argument("--cpu-devices", type=int, default=0, help="split the CPU into N devices")
    p.add_argument("--engine", default="auto")
    p.add_argument("--out", help="write this rank's results to OUT.rank<K>.npz")
    return p.parse_args(argv)


def synthetic(rows, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 16)).astype("float32")
    w = rng.normal(size=(16, 1)).astype("float32")
    y = (np.tanh(x @ w) + 0.05 * rng.normal(size=(rows, 1))).astype("float32")
    return x, y


def main(argv=None):
    args = parse_args(argv)
    if args.write_data:
        os.makedirs(args.write_data, exist_ok=True)
        x, y = synthetic(args.rows + 2_000, args.seed)
        np.save(os.path.join(args.write_data, "x.npy"), x[:-2000])
        np.save(os.path.join(args.write_data, "y.npy"), y[:-2000])
        return 0

    import keras

    import shardfeed
    from shardfeed import files

    # shardfeed: picks the engine from how we were started; --cpu-devices N splits
    # the CPU into N logical devices to try several replicas on a CPU-only machine.
    world = shardfeed.init(args.engine, cpu_devices=args.cpu_devices or None)
    if world.is_chief:
        print(
            f"engine={world.backend} workers={world.world_size} "
            f"replicas={world.num_replicas_in_sync}"
        )

    x_all, y_all = synthetic(args.rows + 2_000, args.seed)
    x, y, x_val, y_val = x_all[:-2000], y_all[:-2000], x_all[-2000:], y_all[-2000:]
    if args.data:
        # shardfeed: lazy readers; each worker reads only its replicas' rows.
        x = files.npy(os.path.join(args.data, "x.npy"))
        y = files.npy(os.path.join(args.data, "y.npy"))

    with world.scope():  # shardfeed: model and data live on the engine's devices
        keras.utils.set_random_seed(args.seed)
        model = keras.Sequential(
            [
                keras.Input((16,)),
                keras.layers.Dense(32, activation="relu", kernel_regularizer="l2"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", metrics=["mae"])
        # shardfeed: uploaded once; batches are gathered on the device.
        train = shardfeed.ShardedResidentDataset(
            x,
            y,
            # shardfeed: the global batch is this times the number of replicas.
            per_replica_batch_size=args.per_replica_batch_size,
            seed=args.seed,
            placement=args.placement,
        )

    history = model.fit(  # shardfeed: Keras' own fit, on the resident dataset
        train,
        epochs=args.epochs,
        validation_data=(x_val, y_val),
        verbose=1 if world.is_chief else 0,
    )
    scores = shardfeed.evaluate(model, x_val, y_val, return_dict=True)  # shardfeed: exact, global
    predictions = shardfeed.predict(model, x_val)  # shardfeed: original row order, every rank
    if world.is_chief:
        print(json.dumps({"final": {k: v[-1] for k, v in history.history.items()}, "eval": scores}))
    if args.out:
        np.savez(
            f"{args.out}.rank{world.rank}.npz",
            weights=np.concatenate([w.ravel() for w in model.get_weights()]),
            loss=np.array(history.history["loss"]),
            val_loss=np.array(history.history["val_loss"]),
            eval_loss=np.array(scores["loss"]),
            eval_mae=np.array(scores["mae"]),
            predictions=predictions,
            dropped=np.array(history.params["dropped_rows_per_epoch"]),
            num_replicas=np.array(world.num_replicas_in_sync),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
