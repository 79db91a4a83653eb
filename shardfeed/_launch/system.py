"""What the launcher starts (`WorkerSpec`), the operating-system calls it makes (`System`,
the one place that touches the OS), and where workers report (`StartupWatch`)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from shardfeed._distribute import launch_env, progress
from shardfeed._launch import netns


def _has_exited(pid: int) -> bool:
    """Whether child `pid` has exited, without reaping it (see module docstring)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # already reaped
    return info is not None


@dataclasses.dataclass(frozen=True)
class System:
    """The operating-system calls the launcher makes; tests pass fakes.

    Attributes:
        popen: Starts a process; called like `subprocess.Popen` with an argv
            list, `env`, `stdin`, `stdout`, `stderr` and `start_new_session`.
        killpg: Sends a signal to a process group, like `os.killpg`.
        has_exited: Whether a started child exited, without reaping it.
        check_output: Runs a short command and returns its output, like
            `subprocess.check_output` (used for `mpirun --version`).
        which: Finds an executable, like `shutil.which(name, path=...)`.
        geteuid: The effective user id, like `os.geteuid`.
        private_network: Makes the local workers' private network namespace,
            like `netns.open_private_network(python)`; raises OSError where
            the system does not permit one.
        python: The interpreter workers run (default: this one).
        stdout: Binary stream for tagged worker stdout (default: this
            process's stdout).
        stderr: Binary stream for tagged worker stderr and launcher messages
            (default: this process's stderr).
        poll_interval_s: How often the launcher checks on its workers.

    Example:
        >>> System(stdout=io.BytesIO(), stderr=io.BytesIO())
    """

    popen: Callable[..., Any] = subprocess.Popen
    killpg: Callable[[int, int], None] = os.killpg
    has_exited: Callable[[int], bool] = _has_exited
    check_output: Callable[..., bytes] = subprocess.check_output
    which: Callable[..., str | None] = shutil.which
    geteuid: Callable[[], int] = os.geteuid
    private_network: Callable[[str], netns.PrivateNetwork] = netns.open_private_network
    python: str = sys.executable
    stdout: IO[bytes] | None = None
    stderr: IO[bytes] | None = None
    poll_interval_s: float = 0.05


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """One process to start.

    Attributes:
        label: How messages name it, e.g. "worker rank 1" or "mpirun".
        argv: The command as a list (never run through a shell).
        env: Its complete environment.
        output_prefix: Prefix for each line of its stdout and stderr, e.g.
            "[rank 1] "; None passes its output through untouched (delegated
            engines tag their own output).
        pass_fds: Descriptors it inherits (e.g. a network namespace to enter).
    """

    label: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    output_prefix: str | None = None
    pass_fds: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class StartupWatch:
    """Where workers report their way through `shardfeed.init()`, and how long to wait.

    The worker of spec `i`, rank `first_rank + i`, creates `arrived<rank>` in
    `ready_dir` when it calls `shardfeed.init()` and `initialized<rank>` when
    `init` returns (`shardfeed._distribute.launch_env.announce`).

    Attributes:
        ready_dir: The directory, made by the launcher, in the workers'
            `SHARDFEED_READY_DIR`.
        timeout_s: Seconds the workers that arrived wait for the others before
            the launch stops (None: forever).
        first_rank: The rank of the first spec (a host's first rank in a
            multi-host job; 0 on one host).
        progress_timeout_s: Seconds the workers' positions (files
            `progress<rank>`, `shardfeed._distribute.progress`) may stand
            still while some ranks wait for others, or every rank is inside
            one call, before the launch stops (None: not watched).
    """

    ready_dir: str
    timeout_s: float | None
    first_rank: int = 0
    progress_timeout_s: float | None = None

    def ranks(self, stage: str, count: int) -> set[int]:
        """The spec indexes below `count` whose `<stage><rank>` file exists."""
        try:
            names = set(os.listdir(self.ready_dir))
        except OSError:
            return set()
        return {i for i in range(count) if f"{stage}{self.first_rank + i}" in names}

    def exit_start(self, index: int) -> int | None:
        """When the spec at `index` began to exit (`time.monotonic_ns()`, file
        `exiting<rank>`, `launch_env.record_exit_start`), or None: it wrote
        none (it never finished `shardfeed.init()`, or a signal or a native
        abort ended it)."""
        return launch_env.read_exit_start(
            os.path.join(self.ready_dir, f"{launch_env.EXITING}{self.first_rank + index}")
        )

    def positions(self, indexes: Iterable[int]) -> dict[int, progress.Position]:
        """Where the specs at `indexes` stand (files `progress<rank>`,
        `progress.Position`); count 0 in their own code before their first
        report or where the file is unreadable."""
        positions = {}
        for i in indexes:
            path = os.path.join(self.ready_dir, f"{progress.PROGRESS}{self.first_rank + i}")
            positions[i] = progress.read_position(path) or progress.Position(0)
        return positions

    def stacks(self, index: int) -> str:
        """The Python stacks the spec at `index` wrote on `progress.STACKS_SIGNAL`
        (file `stacks<rank>`), or "" if none yet."""
        path = os.path.join(self.ready_dir, f"{progress.STACKS}{self.first_rank + index}")
        try:
            with open(path, errors="replace") as stacks_file:
                return stacks_file.read()
        except OSError:
            return ""
