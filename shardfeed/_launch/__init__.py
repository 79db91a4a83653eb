"""The launcher: start N workers of a script or function, locally or through another launcher.

Owns `run` and `LaunchOptions`, and chooses among the engines (`local`,
`multihost`, `delegate`); `process` starts and watches the workers. Never
imports TensorFlow: workers pay for it, the launcher process does not.
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
from shardfeed._distribute.credentials import (
    INSECURE_NETWORK_VARIABLE,
    MTLS_DIR_VARIABLE,
    load_credentials,
)
from shardfeed._distribute.startup import HEARTBEAT_TIMEOUT_VARIABLE, SHUTDOWN_TIMEOUT_VARIABLE
from shardfeed._launch import delegate, local, multihost
from shardfeed._launch.local import IsolateNetwork
from shardfeed._launch.process import System, WorkerSpec, run_workers

Engine = Literal["multiworker", "horovod", "mpi"]
DEFAULT_PROGRESS_TIMEOUT_S = 300.0
_NONE_MEANS = {
    "shutdown_timeout_s": "the workers' default",
    "heartbeat_timeout_s": "the workers' default",
    "progress_timeout_s": "no progress watch",
}
ENGINES: tuple[str, ...] = ("multiworker", "horovod", "mpi")


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
            where permitted; False runs them on the host's network. A
            multi-host job (`hosts`) runs on the host's network ("auto" and
            False; True is refused).
        hosts: For a `multiworker` job across hosts: every host, in the same
            order on every host, as "h1,h2" (workers split evenly) or
            "h1:4,h2:2" (workers per host), or a sequence of such entries;
            None (default): every worker on this host.
        host_index: With `hosts`: this host's position in it (each host runs
            the same launch with its own index); it starts that host's ranks.
        port_base: With `hosts`: worker s of each host listens on
            `port_base + s` (None: 8888), on every host.
        shutdown_timeout_s: JAX workers: `shardfeed.init(shutdown_timeout_s=)`
            for every worker, through SHARDFEED_SHUTDOWN_TIMEOUT_S (None:
            the variable as it is, else the default of 60 s).
        heartbeat_timeout_s: JAX workers: `shardfeed.init(heartbeat_timeout_s=)`
            for every worker, through SHARDFEED_HEARTBEAT_TIMEOUT_S (None:
            as above).
        progress_timeout_s: `multiworker`: stop the launch (exit 124) when
            no worker's position (`shardfeed._distribute.progress`: calls
            counted, and whether it is inside one, in `fit`/`evaluate`/
            `predict` between them, in a callback or in its own code) moved
            this long while some ranks wait for others, or every rank is
            inside one compiled call; names those ranks and prints each
            rank's Python stacks (None: never). Every rank inside one call
            is stopped only past 3 times the longest call of its kind that
            completed (at least this bound; 4 bounds for its first call).
        mtls_dir: A job's credentials directory (`shardfeed credentials DIR`),
            checked before any worker starts and passed to the workers as
            SHARDFEED_MTLS_DIR: a JAX job's `jax.distributed` coordinator then
            admits only processes holding them (mutual TLS, JAX >= 0.11.2).
            TensorFlow and Horovod workers refuse it (no authentication there).
        insecure_network: Accept a multi-host JAX job without credentials
            (SHARDFEED_INSECURE_NETWORK=1), on a network you trust.

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
    hosts: str | Sequence[str] | None = None
    host_index: int | None = None
    port_base: int | None = None
    shutdown_timeout_s: float | None = None
    heartbeat_timeout_s: float | None = None
    progress_timeout_s: float | None = DEFAULT_PROGRESS_TIMEOUT_S
    mtls_dir: str | None = None
    insecure_network: bool = False

    def __post_init__(self) -> None:
        _errors.require(
            isinstance(self.num_workers, int)
            and not isinstance(self.num_workers, bool)
            and self.num_workers >= 1,
            "`num_workers` must be a positive integer.",
            f"num_workers={self.num_workers!r}",
            "Pass the number of worker processes, e.g. `--num-workers 2`.",
        )
        _errors.require(
            self.engine in ENGINES,
            f"`engine` must be one of {', '.join(ENGINES)}.",
            f"engine={self.engine!r}",
            "Use `multiworker` for local TF_CONFIG workers, `horovod` or `mpi` to delegate.",
        )
        _errors.require(
            self.timeout_s is None or _is_seconds(self.timeout_s),
            "`timeout_s` must be a finite positive number of seconds, or None for no limit.",
            f"timeout_s={self.timeout_s!r}",
            "Pass the longest the whole launch may take, in seconds.",
        )
        _errors.require(
            _is_seconds(self.grace_s, zero_ok=True),
            "`grace_s` must be a finite number of seconds, zero or positive.",
            f"grace_s={self.grace_s!r}",
            "Pass how many seconds stopping workers get before SIGKILL, e.g. 60.",
        )
        _errors.require(
            self.startup_timeout_s is None or _is_seconds(self.startup_timeout_s),
            "`startup_timeout_s` must be a finite positive number of seconds, or None to "
            "wait forever.",
            f"startup_timeout_s={self.startup_timeout_s!r}",
            "Pass how long workers in shardfeed.init() may wait for the others, e.g. 300.",
        )
        for name in ("shutdown_timeout_s", "heartbeat_timeout_s", "progress_timeout_s"):
            value = getattr(self, name)
            _errors.require(
                value is None or _is_seconds(value),
                f"`{name}` must be a finite positive number of seconds, or None.",
                f"{name}={value!r}",
                f"Pass e.g. {name}=60, or None for {_NONE_MEANS[name]}.",
            )
        _errors.require(
            self.isolate_network in ("auto", True, False),
            '`isolate_network` must be "auto", True or False.',
            f"isolate_network={self.isolate_network!r}",
            'Use True to require a private network for the workers, "auto" to use one '
            "where the system permits it, False to run them on the host's network.",
        )
        _errors.require(
            not (self.mtls_dir is not None and self.insecure_network),
            "A job either authenticates its workers (`mtls_dir`) or accepts an "
            "unauthenticated network (`insecure_network`), not both.",
            f"mtls_dir={self.mtls_dir!r}, insecure_network=True",
            "Drop `--insecure-network`.",
        )
        if self.hosts is None:
            _errors.require(
                self.host_index is None and self.port_base is None,
                "`host_index` and `port_base` belong to a multi-host job, which `hosts` names.",
                f"host_index={self.host_index!r}, port_base={self.port_base!r}, hosts=None",
                "Pass every host with `--hosts h1,h2` (and this host's `--host-index`), or drop "
                "them to run every worker on this host.",
            )
            return
        _errors.require(
            self.engine == "multiworker",
            "`hosts` lays out `multiworker` workers (TF_CONFIG); horovodrun and mpirun take "
            "their own host lists.",
            f"engine={self.engine!r}, hosts={self.hosts!r}",
            "Use launch/horovodrun-multihost.sh (horovodrun -H) or launch/mpirun-hostfile.sh "
            "(mpirun --hostfile), or `--engine multiworker`.",
        )
        _errors.require(
            self.isolate_network is not True,
            "A multi-host job's workers must reach the other hosts, which a private network "
            "namespace (holding only loopback) cannot.",
            f"isolate_network=True, hosts={self.hosts!r}",
            "Drop `--isolate-network on`: the workers run on the host's network, and the "
            "launcher names the ports they expose (firewall them; docs/engines.md, Security).",
        )
        layout = multihost.parse_hosts(self.hosts, self.num_workers, self.port_base)
        _errors.require(
            _errors.is_integer(self.host_index) and 0 <= self.host_index < len(layout.hosts),  # type: ignore[operator]
            "A multi-host job needs `host_index`: this host's position in `hosts`, from 0.",
            f"host_index={self.host_index!r}, hosts={','.join(layout.hosts)}",
            "Run the same launch on every host, each with its own `--host-index` (0 on "
            f"{layout.hosts[0]}, 1 on the next, ...).",
        )

    @property
    def host_layout(self) -> multihost.HostLayout | None:
        """`hosts` read as a layout (`multihost.parse_hosts`), or None on one host."""
        if self.hosts is None:
            return None
        return multihost.parse_hosts(self.hosts, self.num_workers, self.port_base)


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
    hosts: str | Sequence[str] | None = None,
    host_index: int | None = None,
    port_base: int | None = None,
    shutdown_timeout_s: float | None = None,
    heartbeat_timeout_s: float | None = None,
    progress_timeout_s: float | None = DEFAULT_PROGRESS_TIMEOUT_S,
    mtls_dir: str | os.PathLike[str] | None = None,
    insecure_network: bool = False,
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
        hosts: Every host of a multi-host job, "h1,h2" or "h1:4,h2:2"; run the
            same call on each host with its own `host_index` (see
            `LaunchOptions`). None: every worker on this host.
        host_index: With `hosts`: this host's position in it.
        port_base: With `hosts`: worker s of a host listens on `port_base + s`
            (None: 8888).
        shutdown_timeout_s: JAX workers' `shardfeed.init(shutdown_timeout_s=)`;
            see `LaunchOptions`.
        heartbeat_timeout_s: JAX workers' `shardfeed.init(heartbeat_timeout_s=)`;
            see `LaunchOptions`.
        progress_timeout_s: `multiworker`: seconds no worker may move while
            some ranks wait for others, or every rank is inside one compiled
            call, before the launch stops, naming those ranks (default 300;
            None: never); see `LaunchOptions`.
        mtls_dir: The job's credentials directory; see `LaunchOptions`.
        insecure_network: Accept a multi-host JAX job without credentials;
            see `LaunchOptions`.
        env: Environment the workers start from (default: this process's).
        system: Operating-system calls; tests pass fakes (default: real ones).

    Returns:
        0 when every worker exited 0; otherwise the first failed worker's exit
        code (128 + N for death by signal N), 128 + N when the launcher got
        signal N (forwarded to the workers), or 124 after `timeout_s` or the
        start-up timeout.

    Raises:
        ValueError: If an option is out of range or `fn` is not picklable; with
            `hosts`, also if a host name does not resolve here or `host_index`
            names another host (`multihost.check_this_host`).
        NetworkIsolationError: (an OSError) If `isolate_network` is True and
            the system permits no private network namespace.
        PermissionError: If `mtls_dir`'s key is readable by others, or unreadable.
        FileNotFoundError: If `mtls_dir` lacks a file; if the script, or `horovodrun`/`mpirun` for a
            delegated engine, does not exist.
        OSError: If a worker cannot be started, or (with `hosts`) one of this
            host's ports is in use.

    Example:
        >>> from shardfeed import launch
        >>> launch.run("examples/train.py", num_workers=2, args=["--epochs", "3"])
        0
        >>> # on 10.0.0.1 (and the same with host_index=1 on 10.0.0.2):
        >>> launch.run("examples/train.py", num_workers=2, hosts="10.0.0.1,10.0.0.2",
        ...            host_index=0)
        0
    """
    options = LaunchOptions(
        num_workers,
        engine,
        timeout_s,
        grace_s,
        startup_timeout_s,
        isolate_network,
        hosts,
        host_index,
        port_base,
        shutdown_timeout_s,
        heartbeat_timeout_s,
        progress_timeout_s,
        None if mtls_dir is None else os.fspath(mtls_dir),
        insecure_network,
    )
    system = system or System()
    base_env = dict(os.environ if env is None else env)
    for variable, value in (
        (SHUTDOWN_TIMEOUT_VARIABLE, options.shutdown_timeout_s),
        (HEARTBEAT_TIMEOUT_VARIABLE, options.heartbeat_timeout_s),
    ):
        if value is not None:
            base_env[variable] = f"{value:g}"
    if options.mtls_dir is not None:
        # Checked here, on each host, before any worker starts: a host without
        # them is refused at once, naming itself.
        base_env[MTLS_DIR_VARIABLE] = load_credentials(options.mtls_dir).directory
    if options.insecure_network:
        base_env[INSECURE_NETWORK_VARIABLE] = "1"
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
        layout = options.host_layout
        if layout is not None:
            return multihost.run_multihost(
                program,
                layout=layout,
                host_index=options.host_index,  # type: ignore[arg-type]
                base_env=base_env,
                grace_s=options.grace_s,
                timeout_s=options.timeout_s,
                system=system,
                startup_timeout_s=options.startup_timeout_s,
                progress_timeout_s=options.progress_timeout_s,
            )
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
                progress_timeout_s=options.progress_timeout_s,
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
