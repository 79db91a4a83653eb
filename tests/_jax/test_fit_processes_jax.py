"""`fit`, `evaluate` and `predict` over two `jax.distributed` processes on
127.0.0.1 (2 CPU devices each, 4 replicas, sharded rows in the global order):
every process ends with the weights, history and results of one process
with the same 4 replicas, `predict` returns every row on both and
`save_model` writes one file from the chief; a fit
preempted on both resumes from its `BackupAndRestore` like an uninterrupted
one.
"""

from __future__ import annotations

import keras
import numpy as np
from _helpers_fit import backup_fit, replicas, train_and_predict
from _helpers_jax import run_jax_processes

import shardfeed

BACKUP_CHILD = """
import json, sys
sys.path[:0] = ["tests/_jax", "tests"]
import jax
port, pid, backup, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, coordinator_bind_address=f"127.0.0.1:{port}",
                           initialization_timeout=60)
import keras
import shardfeed
from _helpers_fit import backup_fit, train_and_predict
from _helpers_resume import Preempt
callbacks = [keras.callbacks.BackupAndRestore(backup, save_freq=4)]
if mode == "preempt":
    try:
        backup_fit(shardfeed, callbacks + [Preempt(1, 9)])
    except KeyboardInterrupt:
        print("RESULT " + json.dumps({"preempted": True}))
else:
    # The resumed job also runs the fit/evaluate/predict/save check: one 2-process
    # job fewer (CI time); each run builds its own seeded model and dataset.
    resumed = backup_fit(shardfeed, callbacks)
    print("RESULT " + json.dumps({"resumed": resumed,
                                  "trained": train_and_predict(shardfeed, save_to=sys.argv[5])}))
"""


def test_two_processes_train_like_one_process_and_resume_a_preempted_fit(tmp_path):
    """Both workers preempted after step 10 of epoch 1 (the chief's backup at
    step 8 on the shared directory), then two fresh workers resume there like
    an uninterrupted fit, and then train, evaluate, predict and save like one
    process with the same 4 replicas."""
    backup, saved = str(tmp_path / "backup"), tmp_path / "model" / "model.keras"
    saved.parent.mkdir()
    assert run_jax_processes(BACKUP_CHILD, [backup, "preempt"]) == [{"preempted": True}] * 2
    results = run_jax_processes(BACKUP_CHILD, [backup, "resume", str(saved)])
    with replicas(4):
        expected = backup_fit(shardfeed, [])
    for result in (r["resumed"] for r in results):
        assert sorted(result["history"]) == sorted(expected["history"])
        for key, value in expected["history"].items():
            np.testing.assert_allclose(result["history"][key], value[1:], rtol=1e-5, err_msg=key)
        for ours, theirs in zip(result["weights"], expected["weights"], strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert results[0]["resumed"]["weights"] == results[1]["resumed"]["weights"]
    assert not (tmp_path / "backup").exists()  # the chief deleted it at the end

    with replicas(4):
        expected = train_and_predict(shardfeed)
    for result in (r["trained"] for r in results):
        assert result["replicas"] == 4
        for name in ("history", "evaluate"):
            for key, value in expected[name].items():
                np.testing.assert_allclose(result[name][key], value, rtol=1e-5, err_msg=key)
        np.testing.assert_allclose(result["predict"], expected["predict"], rtol=1e-5, atol=1e-6)
        for ours, theirs in zip(result["weights"], expected["weights"], strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    # Both processes hold the same weights (replicated state, not two copies that drift).
    trained = [r["trained"] for r in results]
    assert trained[0]["weights"] == trained[1]["weights"]
    # `save_model` on both: the chief wrote one complete file of those weights.
    loaded = keras.models.load_model(saved)
    assert [w.tolist() for w in loaded.get_weights()] == trained[0]["weights"]
    assert sorted(p.name for p in saved.parent.iterdir()) == ["model.keras"]
