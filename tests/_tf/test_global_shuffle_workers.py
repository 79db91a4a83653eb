"""The global shuffle of sharded rows across 2 worker processes on 127.0.0.1.

Under `shardfeed launch` (MultiWorkerMirroredStrategy: rows cross in bounded
all-gathers) and under Horovod (`hvd.alltoall` with splits), 2 workers with
per-replica batch b, each holding half the rows, end each of 3 epochs where
one process with batch 2b ends on the same global order; every row is used
exactly once per epoch (with and without drop_remainder); rows loaded from
.npy shards are read once, never again while training; the exchange's
compiled functions trace in its first epoch only, however many rounds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers_horovod import TWO_WORKER_ENGINES
from _helpers_workers import ROOT, run_checked, two_workers

from shardfeed._data import agreement

pytestmark = [pytest.mark.multi_process, pytest.mark.slow]

WORKER = Path(__file__).resolve().parents[1] / "_global_shuffle_worker.py"
ROWS = 1001


def _launch(engine, *args):
    return two_workers(engine, WORKER, *args)


def _load(prefix, ranks):
    return [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(ranks)]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "res"
    run_checked([sys.executable, str(WORKER), "--batch", "64", "--out", str(out)], ROOT)
    return _load(out, 1)[0]


def test_two_workers_sharded_rows_in_order_equal_one_process(tmp_path):
    """`shuffle=False` across 2 workers (each loads half the rows): each
    global batch is one process's batch of 2b, so the weights are its
    weights; the workers agree that the rows may move (one all-gather)."""
    single_out = tmp_path / "single"
    run_checked([sys.executable, str(WORKER), "--batch", "64", "--in-order", "--out",
          str(single_out)], ROOT)
    (one,) = _load(single_out, 1)
    out = tmp_path / "res"
    run_checked(_launch("multiworker", "--batch", "32", "--in-order", "--out", str(out)), ROOT)
    results = _load(out, 2)
    for res in results:
        np.testing.assert_allclose(res["weights"], one["weights"], rtol=1e-5, atol=1e-6)
        assert int(res["exchanges"]) == 3
    # Replica r takes rows [80k + 40r, 80k + 40r + 40) of step k, every epoch.
    for epoch in range(3):
        ids = results[1]["replica_ids_True_" + f"{epoch}_1"]
        np.testing.assert_array_equal(ids[:80], np.r_[40:80, 120:160])


@pytest.mark.parametrize("engine", TWO_WORKER_ENGINES)
def test_two_workers_sharded_global_order_equal_one_process(engine, single, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    a = rng.normal(size=(ROWS, 6)).astype("float32")  # the worker's column "a"
    np.save(data / "a0.npy", a[:501])
    np.save(data / "a1.npy", a[501:])
    out = tmp_path / "res"
    run_checked(_launch(engine, "--batch", "32", "--npy", str(data), "--out", str(out)), ROOT)
    results = _load(out, 2)
    for rank, res in enumerate(results):
        np.testing.assert_allclose(res["weights"], single["weights"], rtol=1e-5, atol=1e-6)
        # Each worker read its own shard file's rows once, then never again
        # (beside the agreement check's few seeded rows of the whole array).
        reads = res["reads_at_load"]
        sampled = len(agreement.sample_rows(ROWS))
        assert int((reads[:, 1] - reads[:, 0]).sum()) == (501, 500)[rank] + sampled
        assert int(res["reads_after_fit"]) == 0 and int(res["exchanges"]) == 3
        if engine == "multiworker":
            # Packing, the all-gather and unpacking trace once, in the first
            # exchange; no round of any epoch traces again.
            assert res["rounds"].min() > 5
            assert res["traces"].tolist() == [3, 0, 0]
    for drop in (False, True):
        dropped = int(results[0][f"dropped_{drop}"])
        for epoch in range(3):
            used = np.concatenate([res[f"ids_{drop}_{epoch}"] for res in results])
            counts = np.bincount(used, minlength=ROWS)
            assert counts.max() == 1 and counts.sum() == ROWS - dropped
