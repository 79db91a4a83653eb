"""The JAX side of tests/test_order_backends.py (not a test module).

Run with a Keras-on-JAX Python (`SHARDFEED_JAX_PYTHON`): records every case
of `_helpers_order.CASES` on JAX devices and writes them as JSON to argv[1].
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    import jax
    from _helpers_order import CASES, data, dataset_kwargs, record

    from shardfeed._data.options import LoadOptions
    from shardfeed._jax import world as _world
    from shardfeed._jax.dataset import ShardedResidentDataset

    def replica_ys(epoch, step, batch):
        ys = np.asarray(batch.y)  # every replica's real rows, in global replica order
        return np.split(ys, np.cumsum(epoch.replica_rows(step))[:-1])

    out = {}
    for name, (replicas, *_, fraction, _) in CASES.items():
        # The first `replicas` devices as the world (what `shardfeed.init` sets).
        _world.remember_initialized(_world.World(0, 1, 0, tuple(jax.devices()[:replicas])))
        for copy in (False, True):  # rows gathered where they sit (moved in place), or copied
            # A small staging buffer: several exchange rounds an epoch.
            options = LoadOptions(
                exchange_fraction=fraction, exchange_buffer_bytes=64, epoch_copy=copy
            )
            ds = ShardedResidentDataset(*data(), **dataset_kwargs(name), load_options=options)
            out[f"{name}, epoch_copy={copy}"] = record(
                lambda e, t, ds=ds: ds.epoch(e, training=t), replica_ys
            )
    with open(sys.argv[1], "w") as f:
        json.dump({"backend": jax.default_backend(), "records": out}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
