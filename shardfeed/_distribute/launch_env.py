"""Which launcher started this process and its rank among the workers (`detect_launch_env`),
and the files `shardfeed launch` watches (ready, exit; progress in `progress.py`).

Reading is pure (an environment mapping in, a `LaunchEnv` out). Detection
order, first match wins: `shardfeed` (`SHARDFEED_RANK`...), a `TF_CONFIG`
with a cluster (refused when a launcher below started another number of
processes), `horovod`, `mpi` (Open MPI, then Hydra; before SLURM, whose step
variables describe mpirun's daemons), `slurm` (inside a job step only), else
`single`.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Literal

from shardfeed._common import errors as _errors

Launcher = Literal["shardfeed", "tf_config", "horovod", "mpi", "slurm", "single"]

# Task types that take part in MultiWorkerMirroredStrategy training, in rank order.
_TRAINING_TASK_TYPES = ("chief", "worker")


@dataclasses.dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits among the workers, as its launcher described it.

    Attributes:
        launcher: Which launcher's variables the values come from (see the
            module docstring for the precedence).
        rank: This process's index among `world_size` workers.
        world_size: Number of worker processes.
        local_rank: This process's index among the workers on its host; None
            when the launcher does not say (a hand-written TF_CONFIG).
        variables: Names of the environment variables the values were read from.

    Raises:
        ValueError: If the numbers are inconsistent.

    Example:
        >>> detect_launch_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
        LaunchEnv(launcher='mpi', rank=1, world_size=2, local_rank=None, variables=(...))
    """

    launcher: Launcher
    rank: int
    world_size: int
    local_rank: int | None
    variables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        received = (
            f"rank={self.rank!r}, world_size={self.world_size!r}, local_rank={self.local_rank!r}"
        )
        if self.variables:
            received += f" (from {', '.join(self.variables)})"
        ok = (
            self.world_size >= 1
            and 0 <= self.rank < self.world_size
            and (self.local_rank is None or 0 <= self.local_rank < self.world_size)
        )
        if not ok:
            raise ValueError(
                _errors.message(
                    "A worker's rank and local rank must lie in [0, world_size), with "
                    "world_size >= 1.",
                    received,
                    "Check the variables your launcher set for this process.",
                )
            )

    @property
    def is_chief(self) -> bool:
        """Whether this is rank 0, the worker that writes checkpoints and logs."""
        return self.rank == 0


def received(environ: Mapping[str, str], names: Sequence[str]) -> str:
    """`NAME='value', ...` for the `Received:` part of an error message (`<unset>` if unset)."""
    return ", ".join(f"{name}={environ.get(name, '<unset>')!r}" for name in names)


def read_int(environ: Mapping[str, str], name: str, together: Sequence[str], fix: str) -> int:
    """Reads `environ[name]` as an integer; on failure the error shows `together` and `fix`."""
    value = environ.get(name)
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(
            _errors.message(
                f"`{name}` must be set to an integer.",
                received(environ, together),
                fix,
            )
        ) from None


def _from_variables(
    environ: Mapping[str, str],
    launcher: Launcher,
    rank_var: str,
    size_var: str,
    local_var: str | None,
    fix: str,
) -> LaunchEnv:
    names = [rank_var, size_var] + ([local_var] if local_var else [])
    rank = read_int(environ, rank_var, names, fix)
    world_size = read_int(environ, size_var, names, fix)
    local_rank = None
    if local_var and local_var in environ:
        local_rank = read_int(environ, local_var, names, fix)
    used = tuple(name for name in names if name in environ)
    try:
        return LaunchEnv(launcher, rank, world_size, local_rank, used)
    except ValueError:
        raise ValueError(
            _errors.message(
                "A worker's rank and local rank must lie in [0, world_size).",
                received(environ, names),
                fix,
            )
        ) from None


def _parse_tf_config(environ: Mapping[str, str]) -> LaunchEnv | None:
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        return None
    fix = (
        'Set TF_CONFIG like {"cluster": {"worker": ["host1:port", "host2:port"]}, '
        '"task": {"type": "worker", "index": 0}}, or unset it to let shardfeed resolve '
        "the cluster from its launcher."
    )
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            _errors.message("TF_CONFIG must be JSON.", f"TF_CONFIG={text!r} ({err})", fix)
        ) from None
    if not isinstance(config, dict):
        raise ValueError(
            _errors.message("TF_CONFIG must be a JSON object.", f"TF_CONFIG={text!r}", fix)
        )
    cluster = config.get("cluster") or {}
    if not cluster:
        return None  # TensorFlow treats a TF_CONFIG without a cluster as a single process
    task = config.get("task") or {}
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type not in _TRAINING_TASK_TYPES or task_type not in cluster:
        raise ValueError(
            _errors.message(
                "shardfeed trains with MultiWorkerMirroredStrategy, whose tasks are a 'chief' "
                "and 'worker's listed in the cluster.",
                f"TF_CONFIG task={task!r}, cluster jobs={sorted(cluster)!r}",
                fix,
            )
        )
    counts = {kind: len(cluster.get(kind) or ()) for kind in _TRAINING_TASK_TYPES}
    offset = counts["chief"] if task_type == "worker" else 0
    if not isinstance(index, int) or not 0 <= index < counts[task_type]:
        raise ValueError(
            _errors.message(
                "TF_CONFIG's task index must point into its job's address list.",
                f"TF_CONFIG task={task!r}, {task_type} addresses={counts[task_type]}",
                fix,
            )
        )
    return LaunchEnv(
        "tf_config", offset + index, counts["chief"] + counts["worker"], None, ("TF_CONFIG",)
    )


def _slurm_step(environ: Mapping[str, str]) -> bool:
    return "SLURM_PROCID" in environ and (
        "SLURM_STEP_NUM_TASKS" in environ or "SLURM_STEP_NODELIST" in environ
    )


def _from_launcher(environ: Mapping[str, str]) -> LaunchEnv | None:
    """Precedence steps 3 to 5: horovodrun, mpirun, srun."""
    if "HOROVOD_RANK" in environ:
        return _from_variables(
            environ,
            "horovod",
            "HOROVOD_RANK",
            "HOROVOD_SIZE",
            "HOROVOD_LOCAL_RANK",
            "Start the workers with `horovodrun`, which sets all of them.",
        )
    mpi_fix = "Start the workers with `mpirun -np N`, which sets all of them."
    if "OMPI_COMM_WORLD_RANK" in environ:
        return _from_variables(
            environ,
            "mpi",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            mpi_fix,
        )
    if "PMI_RANK" in environ:
        return _from_variables(environ, "mpi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", mpi_fix)
    if "PMIX_RANK" in environ and not _slurm_step(environ):
        raise ValueError(
            _errors.message(
                "PMIX_RANK gives this process's rank but no variable gives the number of "
                "processes.",
                received(environ, ["PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"]),
                "Start the workers with `mpirun` (Open MPI sets OMPI_COMM_WORLD_SIZE) or `srun`, "
                "or set SHARDFEED_RANK and SHARDFEED_WORLD_SIZE for each process.",
            )
        )
    if _slurm_step(environ):
        size_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
        return _from_variables(
            environ,
            "slurm",
            "SLURM_PROCID",
            size_var,
            "SLURM_LOCALID",
            "Start one task per worker with `srun` (see launch/slurm.sbatch).",
        )
    return None


def detect_launch_env(environ: Mapping[str, str]) -> LaunchEnv:
    """Tells which launcher started this process, and its rank among the workers.

    A pure function of `environ`; see the module docstring for the order in
    which launchers are recognised and why.

    Args:
        environ: Environment variables, usually `os.environ`.

    Returns:
        The `LaunchEnv`; `launcher="single"` with rank 0 of 1 when no launcher
        variables are present.

    Raises:
        ValueError: If a launcher's variables are incomplete or inconsistent,
            TF_CONFIG is malformed, or TF_CONFIG disagrees with the launcher
            about the number of workers.

    Example:
        >>> detect_launch_env({"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "8",
        ...                    "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_LOCALID": "3"})
        LaunchEnv(launcher='slurm', rank=3, world_size=8, local_rank=3, variables=(...))
    """
    if "SHARDFEED_RANK" in environ:
        return _from_variables(
            environ,
            "shardfeed",
            "SHARDFEED_RANK",
            "SHARDFEED_WORLD_SIZE",
            "SHARDFEED_LOCAL_RANK",
            "Start the workers with `shardfeed launch`, which sets all of them, or unset them.",
        )
    from_tf_config = _parse_tf_config(environ)
    launcher = _from_launcher(environ)
    if from_tf_config is not None:
        if launcher is not None and launcher.world_size != from_tf_config.world_size:
            raise ValueError(
                _errors.message(
                    f"TF_CONFIG describes {from_tf_config.world_size} workers, but "
                    f"{launcher.launcher} started {launcher.world_size} processes; TF_CONFIG is "
                    "probably left over.",
                    received(environ, ["TF_CONFIG", *launcher.variables]),
                    "Unset TF_CONFIG to let shardfeed resolve the cluster from the launcher, or "
                    "write one TF_CONFIG per process that matches it.",
                )
            )
        return from_tf_config
    if launcher is not None:
        return launcher
    return LaunchEnv("single", 0, 1, 0)


# Set by `shardfeed launch` for its local workers: a directory in which each
# worker says how far it got through `shardfeed.init()` (see `announce`).
READY_DIR_VARIABLE = "SHARDFEED_READY_DIR"
ARRIVED, INITIALIZED = "arrived", "initialized"


def announce(stage: str, environ: Mapping[str, str] | None = None) -> None:
    """Tells `shardfeed launch` that this worker reached a stage of `shardfeed.init()`.

    Creates the file `<stage><rank>` in the launcher's `SHARDFEED_READY_DIR`:
    `arrived` when `init` starts, `initialized` when it returns. With them the
    launcher names the ranks that never arrive while the others wait for them
    in the strategy's set-up (its start-up timeout), and knows which workers
    sit in TensorFlow's set-up, where SIGTERM is ignored. Does nothing outside
    `shardfeed launch`; a directory that is gone (a variable left over from
    another launch) is ignored.

    Args:
        stage: `ARRIVED` or `INITIALIZED`.
        environ: Environment to read (default: `os.environ`).

    Example:
        >>> announce(ARRIVED, {"SHARDFEED_READY_DIR": "/tmp/x", "SHARDFEED_RANK": "1"})
    """
    environ = os.environ if environ is None else environ
    ready_dir, rank = environ.get(READY_DIR_VARIABLE), environ.get("SHARDFEED_RANK", "")
    if not ready_dir or not rank.isdigit():
        return
    try:
        with open(os.path.join(ready_dir, f"{stage}{int(rank)}"), "w"):
            pass
    except OSError:
        pass  # not our launch's directory any more: nobody is waiting for the file


EXITING = "exiting"
_exit_recorded: list[bool] = []  # [True] once this process's recorder is installed


def record_exit_start(environ: Mapping[str, str] | None = None) -> None:
    """Under `shardfeed launch`, writes when this worker's exit begins.

    When one rank fails, its peers fail a few milliseconds later in the
    collective they shared with it; the launcher often reaps both in one poll.
    The time written here (`time.monotonic_ns()` to the file `exiting<rank>`,
    one clock for every process on a host) tells it which began to exit first,
    so it reports that rank's exit status. Written once: before an uncaught
    exception's traceback (a wrapper around `sys.excepthook`) or as the first
    exit handler (`atexit` runs handlers last-registered first, and this is
    installed at the end of `shardfeed.init()`, after the backends' own).
    Nothing outside `shardfeed launch`.

    Args:
        environ: Environment to read (default: `os.environ`).
    """
    environ = os.environ if environ is None else environ
    ready_dir, rank = environ.get(READY_DIR_VARIABLE), environ.get("SHARDFEED_RANK", "")
    if not ready_dir or not rank.isdigit() or _exit_recorded:
        return
    _exit_recorded.append(True)
    path = os.path.join(ready_dir, f"{EXITING}{int(rank)}")
    written: list[bool] = []

    def record() -> None:
        if written:
            return
        written.append(True)
        try:
            with open(path, "wb") as exiting_file:
                exiting_file.write(b"%d" % time.monotonic_ns())
        except OSError:
            pass  # not our launch's directory any more: nobody reads it

    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        record()
        previous(kind, value, tb)

    sys.excepthook = hook
    atexit.register(record)


def read_exit_start(path: str) -> int | None:
    """The time in an `exiting<rank>` file (`record_exit_start`), or None."""
    try:
        with open(path, "rb") as exiting_file:
            return int(exiting_file.read(32))
    except (OSError, ValueError):
        return None


def refuse_workers_without_init(environ: Mapping[str, str]) -> None:
    """Refuses to build a dataset on one process's world when a launcher
    started several workers and `shardfeed.init()` was never called (pure).

    Without `init` each worker would hold every row and train alone, and
    every one would act as the chief (checkpoints, logs).

    Raises:
        RuntimeError: Under a launcher with `world_size > 1`, naming the fix.
    """
    try:
        launch = detect_launch_env(environ)
    except ValueError:
        return  # `shardfeed.init()` reports malformed launcher variables itself
    if launch.world_size == 1:
        return
    raise RuntimeError(
        _errors.message(
            f"A launcher started {launch.world_size} workers, but this one never called "
            "`shardfeed.init()`: its dataset would hold every row and train alone, and every "
            "worker would act as the chief.",
            f"launcher={launch.launcher!r}, rank={launch.rank}, world_size={launch.world_size} "
            f"(from {', '.join(launch.variables)}), shardfeed.init() not called",
            "Call shardfeed.init() before building the dataset (first thing in the script).",
        )
    )
