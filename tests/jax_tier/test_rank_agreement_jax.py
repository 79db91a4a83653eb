"""Ranks that disagree, on two `jax.distributed` processes on 127.0.0.1.

`fit`'s own arguments: one `fit` per case of `tests/_ranks_worker.FIT_CASES`,
each with one argument other on rank 1 (epochs, steps per epoch,
validation data, steps per call); both ranks raise the same words
(`_common/agreement.py`), then train together. Before, such a rank waited in
a collective the other never joined.
"""

from __future__ import annotations

from _helpers_jax import run_jax_processes
from _ranks_worker import assert_fit_case_outcomes  # the cases, shared with TensorFlow's tier

FIT_ARGS_CHILD = """
import json, sys
sys.path[:0] = ["tests/jax_tier", "tests"]
import jax
port, pid = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, coordinator_bind_address=f"127.0.0.1:{port}",
                           initialization_timeout=60)
import keras
import shardfeed
from _ranks_worker import _arrays, fit_setting_outcomes
world = shardfeed.init()
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x, y = _arrays("same", world.rank)
ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=50, seed=0)
outcomes = fit_setting_outcomes(shardfeed, model, ds, x, y, world.rank)
print("RESULT " + json.dumps("\\n".join(outcomes)))
"""


def test_two_processes_with_other_fit_arguments_both_raise():
    assert_fit_case_outcomes(run_jax_processes(FIT_ARGS_CHILD))

