"""Sparse gradients under Horovod: 2 ranks equal 1 process with the global batch.

An `Embedding`'s `IndexedSlices` is all-gathered by Horovod's allreduce, or
densified first with `FitOptions(sparse_as_dense=True)` (Horovod's option);
either way 2 ranks with per-replica batch b end with the weights of one
process with batch 2b run with the same option.
"""

from __future__ import annotations

import numpy as np
import pytest
from _helpers_horovod import NO_HOROVOD
from _helpers_sparse import ratings, towers
from _helpers_workers import ROOT, launch_command, run_checked

import shardfeed
from shardfeed import FitOptions, ShardedResidentDataset

pytestmark = [pytest.mark.multi_process, pytest.mark.horovod, pytest.mark.slow, NO_HOROVOD]

WORKER = r"""
import sys
import numpy as np
import shardfeed
sys.path[:0] = [sys.argv[1]]  # tests/: _helpers_sparse
from _helpers_sparse import ratings, towers

world = shardfeed.init()
x, y = ratings(250)
with world.scope():
    model = towers()
    ds = shardfeed.ShardedResidentDataset(
        x, y, per_replica_batch_size=16, shuffle=False, placement="replicate"
    )
options = shardfeed.FitOptions(steps_per_execution=3, sparse_as_dense=sys.argv[3] == "dense")
shardfeed.fit(model, ds, epochs=2, verbose=0, options=options)
np.savez(f"{sys.argv[2]}.rank{world.rank}.npz", *model.get_weights())
"""


@pytest.mark.parametrize("mode", ["sparse", "dense"])
def test_two_ranks_equal_one_process(mode, tmp_path):
    x, y = ratings(250)
    reference = towers()
    options = FitOptions(steps_per_execution=3, sparse_as_dense=mode == "dense")
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=32, shuffle=False)
    shardfeed.fit(reference, ds, epochs=2, verbose=0, options=options)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "res"
    args = (str(script), str(ROOT / "tests"), str(out), mode)
    run_checked(launch_command(2, *args, engine="horovod"), ROOT)
    for rank in range(2):
        weights = np.load(f"{out}.rank{rank}.npz")
        for i, expected in enumerate(reference.get_weights()):
            np.testing.assert_allclose(weights[f"arr_{i}"], expected, rtol=1e-5, atol=1e-6)
