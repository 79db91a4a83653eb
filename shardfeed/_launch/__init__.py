"""The launcher: start N workers of a script or function, locally or through another launcher.

Separation of concerns: the dataset owns sharding, shuffling and batching; the
engine owns the strategy, the step loop and allreduce; the launcher owns
processes and their environment. It never imports TensorFlow: workers pay for
it, the launcher process does not.

Layout, one module per job (as horovod/runner):
- `cli.py`: the `shardfeed launch` subcommand, a thin shell over `run`.
- `local.py`: the `multiworker` engine, local workers with TF_CONFIG.
- `delegate.py`: the `horovod` and `mpi` engines, argv for horovodrun/mpirun.
- `process.py`: starting, output tagging, signal forwarding, reaping and
  failure propagation, shared by every engine.
- `ports.py`: free ports for TF_CONFIG.
- `netns.py`: the local workers' private network namespace.

This module holds `run`, which chooses among the engines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from shardfeed._common import errors as _errors
from shardfeed._launch import delegate, local
from shardfeed._launch.local import IsolateNetwork
from shardfeed._launch.process import System, WorkerSpec, run_workers

Engine = Literal["multiworker", "horovod", "mpi"]
ENGINES: tuple[str, ...] = ("multiworker", "horovod", "mpi")


def _require(ok: bool, constraint: str, received: str, fix: str) -> None:
    if not ok:
        raise ValueError(_errors.message(constraint, received, fix))


def _is_seconds(value: object, *, zero_ok: bool = False) -> bool:
    """Whether `value` is a finite number of seconds, > 0 (or >= 0 with `zero_ok`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and (value >= 0 if zero_ok else value > 0)


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """How many workers to start, with which engine, and how long to wait.

    Attributes:
        num_workers: Number of worker processes.
        engine: "multiworker" (local processes with TF_CONFIG for
            MultiWorkerMirroredStrategy), "horovod" (`horovodrun`) or "mpi"
            (`mpirun`).
        timeout_s: Stop all workers after this many seconds (None: no limit).
        grace_s: Seconds between asking workers to stop (SIGTERM) and killing
            them (SIGKILL), after a failure, a timeout or a forwarded signal.
        startup_timeout_s: Seconds the `multiworker` workers that reached
            `shardfeed.init()` wait for the others; then the launch stops,
            naming the missing ranks (None: wait forever).
        isolate_network: For `multiworker`: True runs the workers in a
            private network namespace, unreachable from other hosts, and fails
            where the system does not permit one; "auto" (default) does so
            where permitted; False runs them on the host's network.

    Raises:
        ValueError: If a value is out of range.

    Example:
        >>> LaunchOptions(num_workers=2, engine="mpi", timeout_s=600.0)
    """

    num_workers: int
    engine: Engine = "multiworker"
    timeout_s: float | None = None
    grace_s: float = 60.0
    startup_timeout_s: float | None = 300.0
    isolate_network: IsolateNetwork = "auto"

    def __post_init__(self) -> None:
        _require(
            isinstance(self.num_workers, int)
            and not isinstance(self.num_workers, bool)
            and self.num_workers >= 1,
            "`num_workers` must be a positive integer.",
            f"num_workers={self.num_workers!r}",
            "Pass the number of worker processes, e.g. `--num-workers 2`.",
        )
        _require(
            self.engine in ENGINES,
            f"`engine` must be one of {', '.join(ENGINES)}.",
            f"engine={self.engine!r}",
            "Use `multiworker` for local TF_CONFIG workers, `horovod` or `mpi` to delegate.",
        )
        _require(
            self.timeout_s is None or _is_seconds(self.timeout_s),
            "`timeout_s` must be a finite positive number of seconds, or None for no limit.",
            f"timeout_s={self.timeout_s!r}",
            "Pass the longest the whole launch may take, in seconds.",
        )
        _require(
            _is_seconds(self.grace_s, zero_ok=True),
            "`grace_s` must be a finite number of seconds, zero or positive.",
            f"grace_s={self.grace_s!r}",
            "Pass how many seconds stopping workers get before SIGKILL, e.g. 60.",
        )
        _require(
            self.startup_timeout_s is None or _is_seconds(self.startup_timeout_s),
            "`startup_timeout_s` must be a finite positive number of seconds, or None to "
            "wait forever.",
            f"startup_timeout_s={self.startup_timeout_s!r}",
            "Pass how long workers in shardfeed.init() may wait for the others, e.g. 300.",
        )
        _require(
            self.isolate_network in ("auto", True, False),
            '`isolate_network` must be "auto", True or False.',
            f"isolate_network={self.isolate_network!r}",
            'Use True to require a private network for the workers, "auto" to use one '
            "where the system permits it, False to run them on the host's network.",
        )


def run(
    fn_or_script: Callable[..., object] | str | os.PathLike[str],
    *,
    num_workers: int,
    engine: Engine = "multiworker",
    args: Sequence[object] = (),
    timeout_s: float | None = None,
    grace_s: float = 60.0,
    startup_timeout_s: float | None = 300.0,
    isolate_network: IsolateNetwork = "auto",
    env: Mapping[str, str] | None = None,
    system: System | None = None,
) -> int:
    """Runs a script or a function in `num_workers` processes and waits for all of them.

    The Python twin of `shardfeed launch`. Each worker's output lines are
    prefixed with `[rank K] ` (delegated engines use their launcher's own
    tagging). When a worker fails the others are stopped (SIGTERM, then
    SIGKILL after `grace_s`) and a message names the rank and its exit code.

    Args:
        fn_or_script: A Python script path (run as `python script *args`), or a
            module-level function (run as `fn(*args)` in each worker, with
            multiprocessing spawn semantics: the caller's `__main__` is
            re-imported, not re-run, so guard launching code with
            `if __name__ == "__main__":`). A function's return value is
            ignored; an exception makes the worker exit 1, `SystemExit(n)`
            exits n.
        num_workers: Number of worker processes.
        engine: "multiworker" (default), "horovod" or "mpi"; see `LaunchOptions`.
        args: Script arguments (converted with `str`), or the function's
            positional arguments (pickled).
        timeout_s: Stop all workers after this many seconds (None: no limit).
        grace_s: Seconds between SIGTERM and SIGKILL when stopping workers.
        startup_timeout_s: See `LaunchOptions` (`multiworker` only).
        isolate_network: See `LaunchOptions` (`multiworker` only).
        env: Environment the workers start from (default: this process's).
        system: Operating-system calls; tests pass fakes (default: real ones).

    Returns:
        0 when every worker exited 0; otherwise the first failed worker's exit
        code (128 + N for death by signal N), 128 + N when the launcher got
        signal N (forwarded to the workers), or 124 after `timeout_s` or the
        start-up timeout.

    Raises:
        ValueError: If an option is out of range or `fn` is not picklable.
        NetworkIsolationError: (an OSError) If `isolate_network` is True and
            the system permits no private network namespace.
        FileNotFoundError: If the script, or `horovodrun`/`mpirun` for a
            delegated engine, does not exist.
        OSError: If a worker cannot be started.

    Example:
        >>> from shardfeed import launch
        >>> launch.run("examples/train.py", num_workers=2, args=["--epochs", "3"])
        0
    """
    options = LaunchOptions(
        num_workers, engine, timeout_s, grace_s, startup_timeout_s, isolate_network
    )
    system = system or System()
    base_env = dict(os.environ if env is None else env)
    with contextlib.ExitStack() as stack:
        if callable(fn_or_script):
            # The payload must outlive every worker, so it lives until run() returns.
            payload_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="shardfeed-"))
            program = local.function_program(fn_or_script, args, payload_dir, system.python)
        else:
            script = os.fspath(fn_or_script)
            if not Path(script).is_file():
                raise FileNotFoundError(
                    _errors.message(
                        "The script to launch must be an existing file.",
                        f"script={script!r}",
                        f"Check the path (it is relative to the current directory {os.getcwd()}).",
                    )
                )
            program = [system.python, script, *(str(arg) for arg in args)]
        if options.engine == "multiworker":
            return local.run_multiworker(
                program,
                num_workers=options.num_workers,
                base_env=base_env,
                grace_s=options.grace_s,
                timeout_s=options.timeout_s,
                system=system,
                startup_timeout_s=options.startup_timeout_s,
                isolate_network=options.isolate_network,
            )
        command, notes = delegate.delegated_command(
            options.engine, options.num_workers, program, system
        )
        spec = WorkerSpec(Path(command[0]).name, tuple(command), base_env, output_prefix=None)
        return run_workers(
            [spec],
            grace_s=options.grace_s,
            timeout_s=options.timeout_s,
            system=system,
            notes=notes,
        )
