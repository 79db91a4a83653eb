"""Multi-host training over two simulated hosts (network namespaces joined by a veth pair).

A hand-written TF_CONFIG names each worker by its host's private address, as
on a real cluster (same port on both hosts); the two train one tiny model
together and must end with the same weights. The same through
launch/mpirun-hostfile.sh (with a stand-in for ssh), and a link cut
mid-training, named on both sides. The chief, and only the chief,
says what the job exposes. Every process has a timeout and is reaped; the
namespaces are deleted afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import _helpers_two_hosts as hosts
import numpy as np
import pytest

pytestmark = [
    pytest.mark.multi_process,
    pytest.mark.skipif(hosts.why_not() is not None, reason=str(hosts.why_not())),
]

REPO = Path(__file__).resolve().parents[1]
PORT = 23456  # free in a fresh namespace
TIMEOUT_S = 150

WORKER = r"""
import sys
import keras, numpy as np
import shardfeed

world = shardfeed.init()
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
keras.utils.set_random_seed(0)
with world.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    train = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
shardfeed.fit(model, train, epochs=2, verbose=0)
weights = np.concatenate([w.ravel() for w in model.get_weights()])
np.savez(f"{sys.argv[1]}.rank{world.rank}.npz", weights=weights,
         num_replicas=world.num_replicas_in_sync)
"""


# Trains until stopped, marking each finished epoch, so the test can cut the
# link mid-training.
ENDLESS = r"""
import sys, pathlib
import keras, numpy as np
import shardfeed

world = shardfeed.init()
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
with world.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    train = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)

class Mark(keras.callbacks.Callback):
    shardfeed_all_ranks = True
    def on_epoch_end(self, epoch, logs=None):
        pathlib.Path(sys.argv[1]).write_text(str(epoch))

shardfeed.fit(model, train, epochs=100000, callbacks=[Mark()], verbose=0)
"""


def _run_workers(
    two: hosts.TwoHosts, tmp_path: Path, argv_for_rank, during=None
) -> list[tuple[int, str]]:
    addresses = [f"{address}:{PORT}" for address in two.addresses]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDFEED_", "OMPI_", "PMI"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), SHARDFEED_STARTUP_TIMEOUT_S="60")
    workers = []
    try:
        for rank in range(2):
            config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}}
            workers.append(
                subprocess.Popen(
                    two.argv(rank, argv_for_rank(rank)),
                    env={**env, "TF_CONFIG": json.dumps(config)},
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                )
            )
        if during is not None:
            during(workers)
        outputs = [w.communicate(timeout=TIMEOUT_S)[0] for w in workers]
        return [(w.returncode, output) for w, output in zip(workers, outputs, strict=True)]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.communicate()


def _assert_same_weights(prefix: Path) -> None:
    first, second = (np.load(f"{prefix}.rank{rank}.npz") for rank in range(2))
    assert int(first["num_replicas"]) == 2  # one job of two workers
    np.testing.assert_array_equal(first["weights"], second["weights"])


@pytest.fixture
def two():
    with hosts.two_hosts() as made:
        yield made


def test_tf_config_workers_on_two_hosts_train_to_the_same_weights(two, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    results = _run_workers(
        two, tmp_path, lambda rank: [sys.executable, str(script), str(tmp_path / "r")]
    )
    for rc, output in results:
        assert rc == 0, output[-3000:]
    _assert_same_weights(tmp_path / "r")
    # The chief (and only it) says once what the job exposes, naming the ports.
    exposure = "servers listen on every interface"
    assert results[0][1].count(exposure) == 1, results[0][1][-3000:]
    assert f"worker 1 at 10.231.0.2:{PORT}" in results[0][1]
    assert exposure not in results[1][1]


@pytest.mark.slow
def test_a_cut_link_names_the_peer_on_both_hosts(two, tmp_path):
    script = tmp_path / "endless.py"
    script.write_text(ENDLESS)
    marks = [tmp_path / f"epoch{rank}" for rank in range(2)]

    def cut_after_an_epoch(workers):
        deadline = time.monotonic() + TIMEOUT_S
        while not all(m.exists() for m in marks):
            assert all(w.poll() is None for w in workers), "a worker ended before training"
            assert time.monotonic() < deadline, "no epoch finished"
            time.sleep(0.2)
        subprocess.run(
            ["ip", "-n", two.namespaces[1], "link", "set", two.interface, "down"],
            check=True, timeout=30,
        )

    started = time.monotonic()
    results = _run_workers(
        two, tmp_path, lambda rank: [sys.executable, str(script), str(marks[rank])],
        during=cut_after_an_epoch,
    )
    assert time.monotonic() - started < TIMEOUT_S
    (rc0, out0), (rc1, out1) = results
    assert rc0 == 1 and rc1 == 1, (out0 + out1)[-3000:]
    # Each side names the other: its TF_CONFIG task, address and rank.
    assert f"Lost contact with worker 1 at 10.231.0.2:{PORT} (rank 1)" in out0, out0[-3000:]
    assert f"Lost contact with worker 0 at 10.231.0.1:{PORT} (rank 0)" in out1, out1[-3000:]


MPI_BIN = Path(sys.executable).parent


@pytest.mark.slow
@pytest.mark.skipif(
    not (MPI_BIN / "mpirun").exists(), reason="needs an mpirun (Open MPI 5) next to the interpreter"
)
def test_mpirun_recipe_across_two_hosts_trains_to_the_same_weights(two, tmp_path):
    """launch/mpirun-hostfile.sh as written, run on host 0 with a stand-in for ssh.

    Both namespaces share this machine's host name, so what each rank announces
    by default would not reach the other; NETWORK_INTERFACE makes them announce
    their veth addresses (what the recipe says to set).
    """
    pytest.importorskip("mpi4py", reason="the MPI ranks exchange addresses with mpi4py")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{address} slots=1\n" for address in two.addresses))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SHARDFEED_", "OMPI_", "PMI", "PRTE_", "TF_CONFIG"))
    }
    env.update(
        PATH=f"{MPI_BIN}{os.pathsep}{env['PATH']}", PYTHONPATH=str(REPO), LD_LIBRARY_PATH="",
        TF_CPP_MIN_LOG_LEVEL="2", SHARDFEED_STARTUP_TIMEOUT_S="60",
        HOSTFILE=str(hostfile), NUM_WORKERS="2", PYTHON=sys.executable, SCRIPT=str(script),
        NETWORK_INTERFACE=two.interface,
        PRTE_MCA_plm_ssh_agent=two.ssh_stand_in(str(tmp_path / "ssh")),
        # One machine underneath: keep Open MPI off shared memory and on the veth.
        OMPI_MCA_pml="ob1", OMPI_MCA_btl="self,tcp", OMPI_MCA_coll="basic,libnbc,self",
        OMPI_MCA_btl_tcp_if_include=two.interface,
    )
    result = subprocess.run(
        two.argv(0, ["bash", str(REPO / "launch" / "mpirun-hostfile.sh"), str(tmp_path / "m")]),
        cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    _assert_same_weights(tmp_path / "m")
    assert f"worker 1 at {two.addresses[1]}:" in output  # the chief's exposure line
