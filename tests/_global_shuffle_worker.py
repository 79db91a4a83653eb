"""One worker of the multi-process global-shuffle tests (not a test module).

Trains a dict-input model with sample weights on 1,001 rows for 3 epochs,
records the weights after each epoch, then walks 3 epochs of an id-only
dataset (with and without drop_remainder) and records the row ids each
replica's device data held at its epoch's slots (`--in-order`: shuffle=False,
and each replica's ids per epoch). With `--npy DIR` the
float column comes from two .npy shard files and every file read is counted.
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
    p.add_argument("--placement", default="shard")
    p.add_argument("--npy")
    p.add_argument("--in-order", action="store_true", help="shuffle=False")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import keras
    import tensorflow as tf
    from _helpers_global_shuffle import build_model, data, scale

    import shardfeed
    from shardfeed import LoadOptions, ShardedResidentDataset, files
    from shardfeed._data.formats import base as formats_base

    reads = []
    original = formats_base.RawArray._read_into

    def counting(self, start, stop, out):
        reads.append((start, stop))
        return original(self, start, stop, out)

    formats_base.RawArray._read_into = counting

    world = shardfeed.init()
    rows = 1001
    x, y, w = data(rows)
    if args.npy:
        x["a"] = files.concat([files.npy(os.path.join(args.npy, f"a{i}.npy")) for i in (0, 1)])

    small = LoadOptions(exchange_buffer_bytes=4_000)
    with world.scope():
        model = build_model()
        ds = ShardedResidentDataset(
            x, y, w, per_replica_batch_size=args.batch, seed=11, placement=args.placement,
            transform=scale, load_options=small, shuffle=not args.in_order,
        )
    loaded = list(reads)
    weights = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            weights.append(np.concatenate([v.ravel() for v in self.model.get_weights()]))

    shardfeed.fit(model, ds, epochs=3, verbose=0, callbacks=[Record()])
    out = {
        "weights": np.stack(weights),
        "reads_at_load": np.array(loaded, dtype=np.int64).reshape(-1, 2),
        "reads_after_fit": np.array(len(reads) - len(loaded)),
        "exchanges": np.array(len(ds.exchange.reports) if ds.exchange else 0),
        "rounds": np.array([r.rounds for r in ds.exchange.reports] if ds.exchange else []),
        "traces": np.array([r.traces for r in ds.exchange.reports] if ds.exchange else []),
    }
    ids = np.arange(rows)
    for drop in (False, True):
        idset = ShardedResidentDataset(
            {"id": ids.astype("int64"), "twice": (2 * ids).astype("float32")},
            per_replica_batch_size=40, seed=3, drop_remainder=drop, load_options=small,
            strategy=world.strategy, shuffle=not args.in_order,
        )
        plan = idset.plan
        out[f"dropped_{drop}"] = np.array(plan.dropped_rows_per_epoch)
        for epoch in range(3):
            order = idset.epoch_order(epoch, True)
            used = []
            for local, store in enumerate(idset.stores):
                real = plan.full_steps_per_epoch * 40 + (
                    plan.last_step_rows[store.replica] if plan.has_partial_step else 0
                )
                idx = tf.reshape(order.slice(0, plan.steps_per_epoch)[local], [-1])[:real]
                got, twice = (tf.gather(v, idx).numpy() for v in store.variables)
                assert np.array_equal(twice, 2 * got), "columns must move together"
                assert np.array_equal(order.rows(local)[:real], got)
                used.append(got)
            out[f"ids_{drop}_{epoch}"] = np.concatenate(used)
            for local, got in enumerate(used):
                out[f"replica_ids_{drop}_{epoch}_{idset.stores[local].replica}"] = got
    np.savez(f"{args.out}.rank{world.rank}.npz", **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
