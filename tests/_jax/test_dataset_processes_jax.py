"""The JAX dataset over two `jax.distributed` processes on 127.0.0.1 (2 CPU
devices each, 4 replicas): each process uploads only its devices' rows; the
global order (sharded rows moved by the all-to-all across processes, or
replicated rows) is the one a single replica with the global batch takes,
also when an epoch is written into the previous epoch's closed copy, and
without a copy (rows moved in place in bounded rounds, then gathered), where
an evaluation epoch after them still emits every row once. A partial
exchange moves rows across the processes to the replicas the neutral
`_data/exchange.py` names.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _helpers_jax import run_jax_processes

from shardfeed._data import exchange as _exchange
from shardfeed._data.plan import plan_shards

# One job runs every case (argv[3]: JSON [placement, copy, fraction] triples), each
# on its own dataset: one jax.distributed job, not one per case (CI time).
CHILD = """
import json, sys
import jax, numpy as np
port, pid, cases = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, coordinator_bind_address=f"127.0.0.1:{port}",
                           initialization_timeout=60)
from jax.experimental import multihost_utils
from shardfeed._data.options import LoadOptions
from shardfeed._jax.dataset import ShardedResidentDataset
n = 103

def run(placement, copy, fraction):
    # 16 bytes of staging a round: one row per pair, many rounds across the processes.
    options = LoadOptions(epoch_copy=copy == "copy", exchange_buffer_bytes=16,
                          exchange_fraction=fraction)
    ds = ShardedResidentDataset(np.arange(n, dtype=np.float32)[:, None], np.arange(n),
                                per_replica_batch_size=3, seed=4, placement=placement,
                                load_options=options)
    out = {"replicas": ds.world.num_replicas_in_sync, "held": ds.nbytes_on_device, "epochs": []}
    for e in range(2):
        epoch = ds.epoch(e)
        rows = [np.asarray(multihost_utils.process_allgather(b.y, tiled=True)).tolist()
                for _, b in epoch]
        out["epochs"].append({"rows": rows, "slot_rows": epoch.slot_rows().tolist()})
        epoch.close()  # epoch 1 is written into epoch 0's copy (donated, on every process)
    evaluation = ds.epoch(0, training=False)
    out["evaluation"] = [np.asarray(multihost_utils.process_allgather(b.y, tiled=True)).tolist()
                         for _, b in evaluation]
    out["evaluation_slot_rows"] = evaluation.slot_rows().tolist()
    out["copy"] = ds.epoch_copy
    return out

print("RESULT " + json.dumps([run(*case) for case in cases]))
"""
# The cases the tests below check: (placement, copy, exchange_fraction).
CASES = [
    ("shard", "copy", 1.0), ("shard", "gather", 1.0), ("replicate", "copy", 1.0),
    ("replicate", "gather", 1.0), ("shard", "copy", 0.5), ("shard", "gather", 0.5),
]  # fmt: skip


@pytest.fixture(scope="module")
def two_processes() -> dict[tuple[str, str, float], list[dict]]:
    """Each case's results, one list per process, from one 2-process job."""
    results = run_jax_processes(CHILD, [json.dumps(CASES)])
    return {case: [r[i] for r in results] for i, case in enumerate(CASES)}


@pytest.mark.parametrize("copy", ["copy", "gather"])
@pytest.mark.parametrize("placement", ["shard", "replicate"])
def test_global_order_across_two_processes(two_processes, placement, copy):
    results = two_processes[placement, copy, 1.0]
    assert [r["copy"] for r in results] == [copy == "copy"] * 2
    assert [r["replicas"] for r in results] == [4, 4]
    # Each process holds only its own replicas' rows: 2 shards of 26 rows (x and y, 4 bytes each).
    assert results[0]["held"] == (2 * 26 * 8 if placement == "shard" else 2 * 103 * 8)
    for e in range(2):
        emitted = [np.concatenate(r["epochs"][e]["rows"]) for r in results]
        np.testing.assert_array_equal(emitted[0], emitted[1])  # the same global batches
        # One replica with the global batch of 12 takes the epoch's permutation in order.
        np.testing.assert_array_equal(emitted[0], np.random.default_rng((4, e)).permutation(103))
        np.testing.assert_array_equal(emitted[0], results[0]["epochs"][e]["slot_rows"])
        assert [len(b) for b in results[0]["epochs"][e]["rows"]] == [12] * 8 + [7]
    evaluated = np.concatenate(results[0]["evaluation"])
    np.testing.assert_array_equal(np.sort(evaluated), np.arange(103))  # each row once
    np.testing.assert_array_equal(evaluated, results[0]["evaluation_slot_rows"])
    np.testing.assert_array_equal(evaluated, np.concatenate(results[1]["evaluation"]))


@pytest.mark.parametrize("copy", ["copy", "gather"])
def test_a_partial_exchange_across_two_processes(two_processes, copy):
    results = two_processes["shard", copy, 0.5]
    loaded = _exchange.initial_layout(plan_shards(103, 4, 3))
    for e in range(2):
        emitted = [np.concatenate(r["epochs"][e]["rows"]) for r in results]
        np.testing.assert_array_equal(emitted[0], emitted[1])  # the same global batches
        np.testing.assert_array_equal(np.sort(emitted[0]), np.arange(103))  # each row once
        held = _exchange.holdings(_exchange.partial_targets(loaded, 0.5, 4, range(e + 1), 103), 4)
        for batch in results[0]["epochs"][e]["rows"][:8]:  # full steps: 3 rows a replica
            for g in range(4):
                assert set(batch[3 * g : 3 * g + 3]) <= set(held[g].tolist())
    evaluated = np.concatenate(results[0]["evaluation"])
    np.testing.assert_array_equal(np.sort(evaluated), np.arange(103))


REFUSED_STEP_CHILD = """
import json, sys
import jax
port, pid = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, coordinator_bind_address=f"127.0.0.1:{port}",
                           initialization_timeout=60)
import jax.numpy as jnp, numpy as np, shardfeed
shardfeed.init()
ds = shardfeed.ShardedResidentDataset(np.arange(90, dtype=np.float32), np.arange(90),
                                      per_replica_batch_size=4, seed=2)
epoch = ds.epoch(0)
total = jax.jit(lambda arrays, i: jnp.sum(epoch.batch_fn(arrays, i).x))
result = {"full": float(total(epoch.arrays, jnp.int32(0)))}
try:
    float(total(epoch.arrays, jnp.int32(epoch.full_steps)))
except jax.errors.JaxRuntimeError as err:
    result["refused"] = "must be a full step of the epoch" in str(err)
print("RESULT " + json.dumps(result))
"""


def test_a_traced_step_past_the_full_steps_is_refused_on_both_processes():
    """`batch_fn`'s check (a `pure_callback` on every device, `_jax/epoch.py`)
    raises on each process, and both exit cleanly. Before, as a
    `jax.debug.callback` (an effect), both raised too, but rank 0 then died
    at exit with SIGABRT ("the JAX distributed service detected fatal
    errors"), its caught refusal failing the job."""
    results = run_jax_processes(REFUSED_STEP_CHILD)
    assert results[0]["full"] == results[1]["full"]  # one global batch, 16 of the 90 rows
    assert [r["refused"] for r in results] == [True, True]


def test_a_childs_stderr_never_lands_inside_its_result_line():
    """XLA logs to fd 2 unbuffered (`jax.pure_callback failed` above); on one
    merged pipe that text landed inside a RESULT line, and CI failed parsing
    it."""
    code = (
        "import os, sys\n"
        "sys.stdout.write('RESULT {\"rank\": ' + sys.argv[2]); sys.stdout.flush()\n"
        "os.write(2, b'a C++ log line')\n"
        "print('}', flush=True)\n"
    )
    assert run_jax_processes(code) == [{"rank": 0}, {"rank": 1}]
