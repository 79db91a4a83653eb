"""`shardfeed.save_model` on JAX, one process: one complete file, no partial
left, the same refusals as on TensorFlow (the checks: tests/_helpers_saving.py).
Two processes: tests/_jax/test_fit_processes_jax.py."""

from __future__ import annotations

from _helpers_fit import mlp, regression_data
from _helpers_saving import (
    check_refuses_other_suffixes_before_writing,
    check_sigterm_during_a_save_leaves_no_partial_file,
    check_writes_one_complete_file,
)

import shardfeed


def test_save_model_writes_one_complete_file_and_leaves_no_partial(tmp_path):
    x, y = regression_data(200)
    model = mlp()
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=20, seed=0)
    shardfeed.fit(model, ds, verbose=0)
    check_writes_one_complete_file(shardfeed, model, x, tmp_path)


def test_sigterm_during_a_save_leaves_no_partial_file(tmp_path):
    check_sigterm_during_a_save_leaves_no_partial_file(tmp_path)


def test_save_model_refuses_other_suffixes_before_writing(tmp_path):
    check_refuses_other_suffixes_before_writing(shardfeed, mlp(), tmp_path)
