"""`shardfeed launch`: its flags, and the hand-over to `shardfeed._launch.run`.

Everything after the script path goes to the script unchanged; a leading
`python`/`python3` (as typed for horovodrun and mpirun) is dropped: workers
run under the interpreter that runs `shardfeed`.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from typing import Literal

from shardfeed import _launch
from shardfeed._common import errors as _errors
from shardfeed._launch.netns import NetworkIsolationError

_ISOLATE_NETWORK: dict[str, Literal["auto"] | bool] = {"auto": "auto", "on": True, "off": False}


def _seconds_or_none(text: str) -> float | None:
    # Range checks live in LaunchOptions, so both entry points say the same.
    return None if text.lower() == "none" else float(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `launch` options to `parser`.

    Args:
        parser: The subcommand's parser.

    Example:
        >>> parser = argparse.ArgumentParser(prog="shardfeed launch")
        >>> add_arguments(parser)
        >>> parser.parse_args(["--num-workers", "2", "train.py", "--epochs", "3"]).script_args
        ['--epochs', '3']
    """
    parser.add_argument(
        "-n",
        "--num-workers",
        type=int,
        required=True,
        metavar="N",
        help="number of worker processes (with --hosts: of all hosts together)",
    )
    parser.add_argument(
        "--engine",
        choices=_launch.ENGINES,
        default="multiworker",
        help="multiworker: local processes with TF_CONFIG (default); "
        "horovod: delegate to horovodrun; mpi: delegate to mpirun",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        metavar="S",
        help="stop all workers after S seconds (default: no limit)",
    )
    parser.add_argument(
        "--grace-s",
        type=float,
        default=60.0,
        metavar="G",
        help="seconds stopping workers get between SIGTERM and SIGKILL (default: 60)",
    )
    parser.add_argument(
        "--startup-timeout-s",
        type=_seconds_or_none,
        default=300.0,
        metavar="S",
        help="multiworker: stop when workers that reached shardfeed.init() waited S seconds "
        "for the others, naming the missing ranks ('none': wait forever; default: 300); with "
        "--hosts also how long each worker waits for the other hosts' workers",
    )
    parser.add_argument(
        "--progress-timeout-s",
        type=_seconds_or_none,
        default=_launch.DEFAULT_PROGRESS_TIMEOUT_S,
        metavar="S",
        help="multiworker: stop (exit 124) when no worker moved for S seconds while some ranks "
        "wait for others (in a callback, their own code) or every rank is inside one "
        "compiled call, naming them and printing each rank's Python stacks ('none': never, "
        "e.g. for interactive use; default: 300; every rank inside one call stops the job "
        "past 3 times the longest call of its kind, at least S, or 4 x S for its first call)",
    )
    parser.add_argument(
        "--shutdown-timeout-s",
        type=float,
        default=None,
        metavar="S",
        help="JAX workers: shardfeed.init(shutdown_timeout_s=S), how long an exiting worker "
        "waits for the others (default: the workers' SHARDFEED_SHUTDOWN_TIMEOUT_S, else 60)",
    )
    parser.add_argument(
        "--heartbeat-timeout-s",
        type=float,
        default=None,
        metavar="S",
        help="JAX workers: shardfeed.init(heartbeat_timeout_s=S), how long a silent worker "
        "counts as alive (default: the workers' SHARDFEED_HEARTBEAT_TIMEOUT_S, else 60)",
    )
    parser.add_argument(
        "--isolate-network",
        choices=tuple(_ISOLATE_NETWORK),
        default="auto",
        help="multiworker: run the workers in a private network namespace that other hosts "
        "cannot reach (on: or fail; auto: where the system permits it, the default; off: on "
        "this host's network)",
    )
    parser.add_argument(
        "--hosts",
        default=None,
        metavar="H1[:N1],H2[:N2],...",
        help="multiworker across hosts: every host of the job (name or IPv4 address, as the "
        "others reach it), in the same order on every host, optionally with its number of "
        "workers (default: --num-workers split evenly); run the same launch on each host",
    )
    parser.add_argument(
        "--host-index",
        type=int,
        default=None,
        metavar="I",
        help="with --hosts: this host's position in the list, from 0 (it starts that host's "
        "ranks; the first host's worker 0 is the chief)",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=None,
        metavar="P",
        help="with --hosts: worker s of each host listens on P + s (default: 8888)",
    )
    parser.add_argument(
        "--mtls-dir",
        default=None,
        metavar="DIR",
        help="the job's credentials (`shardfeed credentials DIR`, the same DIR on every host): "
        "a JAX job's coordinator admits only workers holding them (mutual TLS, JAX >= 0.11.2); "
        "TensorFlow and Horovod workers refuse it",
    )
    parser.add_argument(
        "--insecure-network",
        action="store_true",
        help="accept a multi-host JAX job without credentials, on a network you trust",
    )
    parser.add_argument(
        "script", help="the Python script every worker runs (a leading `python` is dropped)"
    )
    parser.add_argument(
        "script_args",
        nargs=argparse.REMAINDER,
        metavar="...",
        help="arguments passed to the script unchanged",
    )


# `python`, `python3`, `python3.11`: the names horovodrun and mpirun users put first.
_INTERPRETER_NAME = re.compile(r"python(\d+(\.\d+)?)?")


def _is_this_interpreter(path: str) -> bool:
    return os.path.realpath(path) == os.path.realpath(sys.executable)


def script_and_args(script: str, script_args: list[str]) -> tuple[str, list[str]]:
    """The script and its arguments, without a leading interpreter.

    `shardfeed launch -n 2 python train.py` means `train.py` run under the
    interpreter running `shardfeed` (as every worker is). An interpreter
    given by a path other than that one, or interpreter options (`-u`, `-m`),
    are refused: shardfeed would silently run something else.

    Args:
        script: The first positional argument.
        script_args: Everything after it.

    Returns:
        `(script, script_args)` with the interpreter dropped.

    Raises:
        ValueError: For another interpreter's path, interpreter options, or
            an interpreter without a script.

    Example:
        >>> script_and_args("python", ["train.py", "--epochs", "3"])
        ('train.py', ['--epochs', '3'])
    """
    looks_like = _INTERPRETER_NAME.fullmatch(os.path.basename(script)) is not None
    a_script_file = "/" not in script and os.path.isfile(script)  # ./python is a script
    if not (looks_like or _is_this_interpreter(script)) or a_script_file:
        return script, script_args
    if "/" in script and not _is_this_interpreter(script):
        raise ValueError(
            _errors.message(
                "Workers run under the interpreter that runs `shardfeed launch`.",
                f"interpreter={script!r} (shardfeed runs under {sys.executable!r})",
                f"Run `{script} -m shardfeed._commands.cli launch ...`, or drop the interpreter.",
            )
        )
    if not script_args or script_args[0].startswith("-"):
        got = script_args[0] if script_args else "nothing"
        raise ValueError(
            _errors.message(
                f"After `{script}`, `shardfeed launch` takes the script path; interpreter "
                "options are not passed on.",
                f"{script} followed by {got!r}",
                "Write `shardfeed launch -n N python train.py [args ...]` (set "
                "PYTHONUNBUFFERED=1 in the environment instead of `-u`).",
            )
        )
    return script_args[0], script_args[1:]


def run(args: argparse.Namespace) -> int:
    """Runs `shardfeed launch` with parsed `args`.

    Args:
        args: What `add_arguments`' parser returned.

    Returns:
        The launch's exit code (see `shardfeed._launch.run`), or 2 when the
        arguments are invalid (the reason goes to stderr).

    Example:
        >>> run(parser.parse_args(["--num-workers", "2", "train.py"]))
        0
    """
    try:
        script, script_args = script_and_args(args.script, args.script_args)
        return _launch.run(
            script,
            num_workers=args.num_workers,
            engine=args.engine,
            args=script_args,
            timeout_s=args.timeout_s,
            grace_s=args.grace_s,
            startup_timeout_s=args.startup_timeout_s,
            isolate_network=_ISOLATE_NETWORK[args.isolate_network],
            hosts=args.hosts,
            host_index=args.host_index,
            port_base=args.port_base,
            shutdown_timeout_s=args.shutdown_timeout_s,
            heartbeat_timeout_s=args.heartbeat_timeout_s,
            progress_timeout_s=args.progress_timeout_s,
            mtls_dir=args.mtls_dir,
            insecure_network=args.insecure_network,
        )
    except (ValueError, FileNotFoundError, PermissionError, NetworkIsolationError) as err:
        print(f"shardfeed launch: error: {err}", file=sys.stderr, flush=True)
        return 2
    except OSError as err:
        if err.errno != errno.EADDRINUSE:
            raise
        # A multi-host worker's port, found taken before anything started.
        print(f"shardfeed launch: error: {err.strerror}", file=sys.stderr, flush=True)
        return 2
