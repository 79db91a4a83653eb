"""The launcher with real TensorFlow workers: network isolation, SIGTERM, start-up, busy ports.

What only real MultiWorkerMirroredStrategy workers show:
- their servers listen on every interface, so isolation is checked from the
  launcher's own network namespace while the workers train together;
- creating the strategy installs TensorFlow's SIGTERM handler, so a stop that
  begins with SIGTERM must still end promptly (checked against a grace period
  far longer than the test waits);
- a worker that never reaches `shardfeed.init()` leaves the others waiting
  in the strategy's set-up, deaf to SIGTERM;
- a taken port is named at once instead of TensorFlow's failure a minute
  later.

Every launch has a timeout and every process is reaped. The grace period is
120 s everywhere, and every wait is shorter, so a stop that needs SIGKILL
after the grace period fails the test instead of passing slowly.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers_procs import assert_all_gone

from shardfeed import _launch
from shardfeed._launch import local, netns
from shardfeed._launch.process import System

pytestmark = [pytest.mark.multi_process, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 120.0
WAIT_S = 100.0  # every wait ends before the grace period would
LAUNCH_TIMEOUT_S = 400.0

# argv: out_dir, then one mode per rank: "train" (train until stopped),
# "hang" (never reach shardfeed.init()), "stuck" (sleep in a callback after step 1),
# "before-fit" (sleep after building the dataset, while the others enter `fit`),
# "epoch-end" (sleep in `on_epoch_end`, while the others open the next epoch) or
# "step" (sleep in a `tf.py_function` inside the third compiled step, while the
# others wait in that step's allreduce) or "stop-early" (set `model.stop_training`
# after step 1, on that rank alone).
WORKER = r"""
import json, os, sys, time
from pathlib import Path
out, modes = Path(sys.argv[1]), sys.argv[2:]
rank = int(os.environ["SHARDFEED_RANK"])
(out / f"pid{rank}").write_text(str(os.getpid()))
if modes[rank] == "hang":
    time.sleep(3600)
import keras, numpy as np, shardfeed
world = shardfeed.init()
import tensorflow as tf
address = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][rank]
(out / f"port{rank}").write_text(address.rsplit(":", 1)[1])
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)

def nap():
    nap.calls = getattr(nap, "calls", 0) + 1
    if modes[rank] == "step" and nap.calls == 3:  # alive, inside the compiled call
        time.sleep(3600)
    return np.float32(0)

class Nap(keras.layers.Layer):
    def call(self, x):
        return x + tf.ensure_shape(tf.py_function(nap, [], tf.float32), [])

with world.scope():
    layers = [Nap()] if "step" in modes else []  # the same model on every rank
    model = keras.Sequential([keras.Input((4,)), *layers, keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    train = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)

class Mark(keras.callbacks.Callback):
    shardfeed_all_ranks = True
    def on_epoch_end(self, epoch, logs=None):
        (out / f"epoch{rank}").write_text(str(epoch))
        if modes[rank] == "epoch-end":  # alive, outside the next epoch's collectives
            time.sleep(3600)

class Stuck(keras.callbacks.Callback):
    shardfeed_all_ranks = True
    def on_train_batch_end(self, batch, logs=None):
        if modes[rank] == "stuck" and batch == 1:  # alive, outside the next call's collective
            time.sleep(3600)
        if modes[rank] == "stop-early" and batch == 1:  # this rank alone leaves `fit`
            self.model.stop_training = True

if modes[rank] == "before-fit":  # alive, outside fit's first collective (its arguments')
    time.sleep(3600)
shardfeed.fit(model, train, epochs=100000, callbacks=[Mark(), Stuck()], verbose=0,
              options=shardfeed.FitOptions(steps_per_execution=1,
                                           jit_compile=False if layers else "auto"))
"""

# The launcher in its own process, so the test can signal it.
LAUNCHER = """
import argparse, sys
from shardfeed._launch import cli
parser = argparse.ArgumentParser()
cli.add_arguments(parser)
sys.exit(cli.run(parser.parse_args(sys.argv[1:])))
"""


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
    return env


def _assert_all_gone(out: Path) -> None:
    assert_all_gone(out, ["pid*"], within_s=10, poll_s=0.1)


def _wait_for(paths: list[Path], process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not all(p.exists() for p in paths):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"waited 300 s for {paths}"
        time.sleep(0.2)


def _listening_ports() -> set[int]:
    """Ports in LISTEN state in this process's network namespace (IPv4 and IPv6)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _can_isolate() -> bool:
    try:
        netns.open_private_network(sys.executable).close()
    except netns.NetworkIsolationError:
        return False
    return True


@pytest.mark.skipif(
    not _can_isolate(), reason="this system permits no network namespace (no CAP_SYS_ADMIN, "
    "no unprivileged user namespaces); the launcher falls back to the host's network"
)  # fmt: skip
def test_isolated_workers_train_unreachable_and_stop_promptly_on_sigterm(worker, tmp_path):
    launcher = subprocess.Popen(
        [
            *(sys.executable, "-c", LAUNCHER, "--num-workers", "2", "--isolate-network", "on"),
            *("--grace-s", str(GRACE_S), "--timeout-s", str(LAUNCH_TIMEOUT_S)),
            *(str(worker), str(tmp_path), "train", "train"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        start_new_session=True,
        cwd=REPO,
    )
    try:
        # Both ranks finished an epoch: they train together (all-reduce every step).
        _wait_for([tmp_path / f"epoch{r}" for r in (0, 1)], launcher)
        ports = [int((tmp_path / f"port{r}").read_text()) for r in (0, 1)]
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in (0, 1)]
        # Outside the workers' namespace (here, the launcher's) nothing listens
        # on their ports, and a connection is refused.
        assert not set(ports) & _listening_ports()
        for port in ports:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=10).close()
        ours = os.readlink("/proc/self/ns/net")
        assert {os.readlink(f"/proc/{pid}/ns/net") for pid in pids} - {ours} == {
            os.readlink(f"/proc/{pids[0]}/ns/net")
        }  # one namespace, shared by both workers, not ours
        # Mid-training SIGTERM: the workers must end long before the grace period.
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=WAIT_S)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate(timeout=60)
            # Its workers live in sessions of their own: a SIGKILLed launcher leaves them.
            for pid_file in tmp_path.glob("pid*"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert launcher.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "shardfeed launch: received SIGTERM; forwarding it to 2 worker(s)." in err
    assert "sending SIGKILL" not in err and "sent them SIGKILL" not in err
    assert "reach them" not in err  # no exposure note: they were isolated
    _assert_all_gone(tmp_path)


def test_worker_that_never_reaches_init_is_named(worker, tmp_path):
    out, err = io.BytesIO(), io.BytesIO()
    code = _launch.run(
        worker,
        num_workers=2,
        args=[tmp_path, "train", "hang"],
        grace_s=GRACE_S,
        timeout_s=WAIT_S,  # fires only if the start-up timeout does not
        startup_timeout_s=5.0,
        env=_env(),
        system=System(stdout=out, stderr=err),
    )
    text = err.getvalue().decode()
    assert code == 124, text[-3000:]
    assert "worker rank(s) 1 did not reach shardfeed.init() within 5 s" in text
    assert "timed out after" not in text  # the start-up timeout, not the overall one
    assert "still running" not in text  # rank 0, in TF's set-up, got SIGKILL at once
    _assert_all_gone(tmp_path)


def test_busy_port_without_isolation_is_named_at_once(worker, tmp_path, monkeypatch):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    busy = holder.getsockname()[1]

    class BusyFirstPort(local.PortReservation):
        # As if another program took rank 0's port between release and bind.
        def __init__(self, count, host):
            super().__init__(count, host)
            self.ports = (busy, *self.ports[1:])

    monkeypatch.setattr(local, "PortReservation", BusyFirstPort)
    out, err = io.BytesIO(), io.BytesIO()
    try:
        code = _launch.run(
            worker,
            num_workers=2,
            args=[tmp_path, "train", "train"],
            grace_s=GRACE_S,
            timeout_s=WAIT_S,
            isolate_network=False,
            env=_env(),
            system=System(stdout=out, stderr=err),
        )
    finally:
        holder.close()
    text = err.getvalue().decode()
    assert code == 1, text[-3000:]
    assert f"Port 127.0.0.1:{busy} of worker rank 0 is in use" in text
    assert "worker rank 0 exited with code 1" in text
    assert "timed out after" not in text and "still running" not in text
    _assert_all_gone(tmp_path)


@pytest.mark.parametrize(
    ("mode", "named"),
    [
        ("stuck",
         "worker rank(s) 1 made no progress for 5 s: they stand at shardfeed call 3 while "
         "rank(s) 0 wait for them in call 4 (in the callback hook on_train_batch_end)"),
        # Used to run into the launch's timeout: the ranks' agreement on fit's
        # arguments is a collective but counted no call, so both stood at 0.
        ("before-fit",
         "worker rank(s) 1 made no progress for 5 s: they stand at shardfeed call 0 while "
         "rank(s) 0 wait for them in call 1 (in their own code, outside shardfeed's calls)"),
        # These two used to run into the launch's timeout: every rank's count
        # stood still and agreed.
        ("epoch-end",
         "worker rank(s) 1 made no progress for 5 s: they stand in the callback hook "
         "on_epoch_end while rank(s) 0 wait for them in shardfeed's fit, in a collective "
         "between its counted calls"),
        ("step",
         # Past 3 x the longest train call that completed (at least 5 s).
         "every one stands inside shardfeed call 4 (a compiled train call): a rank stuck "
         "inside the call"),
    ],
)  # fmt: skip
def test_a_stuck_worker_is_named_by_the_progress_watch(worker, tmp_path, mode, named):
    out, err = io.BytesIO(), io.BytesIO()
    start = time.monotonic()
    code = _launch.run(
        worker,
        num_workers=2,
        args=[tmp_path, "train", mode],
        grace_s=GRACE_S,
        timeout_s=WAIT_S,  # fires only if the progress watch does not
        progress_timeout_s=5.0,
        env=_env(),
        system=System(stdout=out, stderr=err),
    )
    text = err.getvalue().decode()
    assert code == 124, text[-3000:]
    assert named in text, text[-3000:]  # after "shardfeed launch: worker rank(s) ..."
    # Where each rank stood, from its own stacks, before they were stopped.
    for rank in (0, 1):
        assert f"shardfeed launch: Python stacks of worker rank {rank} " in text
    sleeping = {"stuck": "on_train_batch_end", "epoch-end": "on_epoch_end", "step": "nap"}
    if mode in sleeping:
        assert f"in {sleeping[mode]}\n" in text  # the sleeping rank's frame
    assert "timed out after" not in text
    assert "still running" not in text  # SIGTERM ended both, rank 0 inside a collective
    assert time.monotonic() - start < WAIT_S
    _assert_all_gone(tmp_path)


def test_a_rank_that_stops_training_alone_is_named(worker, tmp_path):
    # Rank 0 leaves `fit` after step 1 (the epoch's sync check next) while rank
    # 1 trains on: their collectives differ and TensorFlow fails rank 1 first
    # ("Collective instance 124 expected type 0 ..."). Used to name rank 1 only.
    err = io.BytesIO()
    code = _launch.run(
        worker,
        num_workers=2,
        args=[tmp_path, "stop-early", "train"],
        grace_s=GRACE_S,
        timeout_s=WAIT_S,
        progress_timeout_s=5.0,
        env=_env(),
        system=System(stdout=io.BytesIO(), stderr=err),
    )
    text = err.getvalue().decode()
    assert code not in (0, 124), text[-3000:]
    assert (
        "rank(s) 0 stopped training at shardfeed call 3 (a callback set `model.stop_training` "
        "there) while rank(s) 1 trained on, so the ranks ran different collectives." in text
    ), text[-3000:]
    _assert_all_gone(tmp_path)
