"""`fit`, `evaluate` and `predict` over two `jax.distributed` processes on
127.0.0.1 (2 CPU devices each, 4 replicas, sharded rows in the global order):
every process ends with the weights, history and results of one process
with the same 4 replicas, and `predict` returns every row on both.
"""

from __future__ import annotations

import numpy as np
from _helpers_fit import replicas, train_and_predict
from _helpers_jax import run_jax_processes

import shardfeed

CHILD = """
import json, sys
sys.path.insert(0, "tests/jax_tier")
import jax
port, pid = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, coordinator_bind_address=f"127.0.0.1:{port}",
                           initialization_timeout=60)
import shardfeed
from _helpers_fit import train_and_predict
print("RESULT " + json.dumps(train_and_predict(shardfeed)))
"""


def test_two_processes_train_like_one_process_with_the_same_replicas():
    results = run_jax_processes(CHILD)
    with replicas(4):
        expected = train_and_predict(shardfeed)
    for result in results:
        assert result["replicas"] == 4
        for name in ("history", "evaluate"):
            for key, value in expected[name].items():
                np.testing.assert_allclose(result[name][key], value, rtol=1e-5, err_msg=key)
        np.testing.assert_allclose(result["predict"], expected["predict"], rtol=1e-5, atol=1e-6)
        for ours, theirs in zip(result["weights"], expected["weights"], strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    # Both processes hold the same weights (replicated state, not two copies that drift).
    assert results[0]["weights"] == results[1]["weights"]
