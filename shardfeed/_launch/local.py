"""Local workers: one process per rank with its TF_CONFIG on 127.0.0.1 and `SHARDFEED_*`
variables, in a private network namespace where the system permits.

Why the namespace: TensorFlow's server listens on every interface and is
unauthenticated; in a namespace holding only loopback nothing outside can
reach it (fixed ports `ISOLATED_PORT_BASE + rank`). Without it, kernel-chosen
ports and one line saying so (`exposed_note`). Also the program that runs a
Python function in a worker, reused by the delegated engines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing.spawn
import os
import pickle
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from shardfeed._common import errors as _errors
from shardfeed._common.ports import PortReservation
from shardfeed._distribute.launch_env import READY_DIR_VARIABLE
from shardfeed._distribute.tf_config import worker_tf_config
from shardfeed._launch import netns
from shardfeed._launch.process import StartupWatch, System, WorkerSpec, run_workers

LOCAL_HOST = "127.0.0.1"
# Below the kernel's ephemeral range (32768-60999), so no outgoing connection
# inside the namespace can hold one of them first.
ISOLATED_PORT_BASE = 20000

IsolateNetwork = Literal["auto"] | bool

EXPOSED_NOTE = (
    "the workers run on this host's network: TensorFlow's servers listen on every interface "
    "(ports {ports}), so other hosts can reach them, and TensorFlow's distributed runtime is "
    "unauthenticated ({why}; see docs/engines.md, Security)."
)
# On JAX a loopback job binds its coordinator and Gloo to 127.0.0.1
# (`_jax/initialize.py`): not other hosts, but any local user reaches them.
EXPOSED_NOTE_JAX = (
    "the workers run on this host's network: JAX's coordinator (port {coordinator_port}) and "
    "Gloo listen on 127.0.0.1 only, so other hosts cannot reach them but every local user "
    "can, and JAX's coordinator is unauthenticated ({why}; see docs/engines.md, Security)."
)


def worker_backend(env: Mapping[str, str]) -> str:
    """The Keras backend the workers will run ("tensorflow", "jax", ...), as
    Keras picks it: `KERAS_BACKEND`, else `keras.json` in `KERAS_HOME` (or
    ~/.keras), else "tensorflow". Read here without importing Keras."""
    if env.get("KERAS_BACKEND"):
        return env["KERAS_BACKEND"]
    home = env.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            backend = json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    return backend if isinstance(backend, str) else "tensorflow"


def exposed_note(env: Mapping[str, str], ports: Sequence[int], why: str) -> str:
    """The one line a job on the host's network prints, worded for its backend."""
    if worker_backend(env) == "jax":
        return EXPOSED_NOTE_JAX.format(coordinator_port=ports[0], why=why)
    return EXPOSED_NOTE.format(ports=", ".join(map(str, ports)), why=why)


# Runs in each worker for `run(fn, ...)`: what multiprocessing's spawn start
# method does in a child (restore sys.path, cwd and the parent's __main__ via
# `multiprocessing.spawn.prepare`, then unpickle the function), but in a
# process we start ourselves so it gets the same process group, output tagging
# and failure handling as a script. It imports nothing from shardfeed, so a
# worker pays for TensorFlow only if the function uses it. `fn` is unpickled
# only after `prepare`, because unpickling may import the parent's __main__.
_FUNCTION_BOOTSTRAP = """\
import pickle, sys
import multiprocessing.spawn
with open(sys.argv[1], "rb") as payload_file:
    payload = pickle.load(payload_file)
multiprocessing.spawn.prepare(payload["preparation"])
fn = pickle.loads(payload["fn"])
fn(*pickle.loads(payload["args"]))
"""


def worker_specs(
    program: Sequence[str],
    ports: Sequence[int],
    base_env: Mapping[str, str],
    host: str = LOCAL_HOST,
) -> list[WorkerSpec]:
    """One `WorkerSpec` per port: same program, per-rank TF_CONFIG and SHARDFEED_*.

    Args:
        program: The argv every worker runs.
        ports: One reserved port per worker, in rank order.
        base_env: The environment the workers start from.
        host: The address every worker listens on.

    Returns:
        The specs, in rank order.

    Example:
        >>> [s.env["SHARDFEED_RANK"] for s in worker_specs(["python", "t.py"], [2222, 2223], {})]
        ['0', '1']
    """
    addresses = [f"{host}:{port}" for port in ports]
    return cluster_worker_specs(program, addresses, range(len(addresses)), base_env)


def cluster_worker_specs(
    program: Sequence[str],
    addresses: Sequence[str],
    ranks: Sequence[int],
    base_env: Mapping[str, str],
) -> list[WorkerSpec]:
    """The specs of the workers `ranks` of the cluster `addresses`, all on this host.

    Their local ranks count from 0 in the order of `ranks`, and the local
    size is `len(ranks)` (`shardfeed.init` gives each worker of a host its
    own GPU from them).

    Args:
        program: The argv every worker runs.
        addresses: "host:port" of every worker of the job, in rank order.
        ranks: The ranks this host starts, in order.
        base_env: The environment the workers start from.

    Returns:
        One spec per rank in `ranks`.

    Example:
        >>> [s.label for s in cluster_worker_specs(["t"], ["a:1", "b:1"], [1], {})]
        ['worker rank 1']
    """
    specs = []
    for local_rank, rank in enumerate(ranks):
        env = dict(base_env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(
            TF_CONFIG=json.dumps(worker_tf_config(rank, addresses)),
            SHARDFEED_RANK=str(rank),
            SHARDFEED_WORLD_SIZE=str(len(addresses)),
            SHARDFEED_LOCAL_RANK=str(local_rank),
            SHARDFEED_LOCAL_SIZE=str(len(ranks)),
        )
        specs.append(WorkerSpec(f"worker rank {rank}", tuple(program), env, f"[rank {rank}] "))
    return specs


def _open_network(
    isolate_network: IsolateNetwork, system: System
) -> tuple[netns.PrivateNetwork | None, str]:
    """The private network, or None and why the workers go without one."""
    if isolate_network is False:
        return None, "--isolate-network off"
    try:
        return system.private_network(system.python), ""
    except OSError as err:
        if isolate_network is True:
            raise netns.NetworkIsolationError(netns.isolation_error_message(str(err))) from err
        return None, f"no private network namespace could be made: {err}"


def run_multiworker(
    program: Sequence[str],
    *,
    num_workers: int,
    base_env: Mapping[str, str],
    grace_s: float,
    timeout_s: float | None,
    system: System,
    startup_timeout_s: float | None = None,
    isolate_network: IsolateNetwork = "auto",
    progress_timeout_s: float | None = None,
) -> int:
    """Starts `num_workers` local copies of `program` with TF_CONFIG and waits.

    Args:
        program: The argv every worker runs.
        num_workers: How many workers.
        base_env: The environment the workers start from.
        grace_s: Seconds between SIGTERM and SIGKILL when stopping workers.
        timeout_s: Stop everything after this many seconds (None: no limit).
        system: Operating-system calls.
        startup_timeout_s: Seconds the workers that reached `shardfeed.init()`
            wait for the others before the launch stops (None: forever).
        isolate_network: True: run the workers in a private network namespace
            (fail if impossible); "auto": when the system permits it; False:
            on the host's network.
        progress_timeout_s: Stop when the workers' positions stand still this
            long while some ranks wait for others (None: not watched; see
            `system.StartupWatch`).

    Returns:
        The exit code, as `process.run_workers`.

    Raises:
        netns.NetworkIsolationError: If `isolate_network` is True and no
            namespace can be made.
        OSError: If ports cannot be reserved or a worker cannot be started.

    Example:
        >>> run_multiworker(["python", "train.py"], num_workers=2, base_env=dict(os.environ),
        ...                 grace_s=60.0, timeout_s=None, system=System())
        0
    """
    network, why_exposed = _open_network(isolate_network, system)
    with contextlib.ExitStack() as stack:
        if network is not None:
            stack.callback(network.close)
        ready_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="shardfeed-ready-"))
        env = {**base_env, READY_DIR_VARIABLE: ready_dir}
        startup = StartupWatch(ready_dir, startup_timeout_s, progress_timeout_s=progress_timeout_s)
        if network is not None:
            ports = [ISOLATED_PORT_BASE + rank for rank in range(num_workers)]
            specs = [
                dataclasses.replace(
                    spec,
                    argv=tuple(network.enter_argv(system.python, spec.argv)),
                    pass_fds=network.fds,
                )
                for spec in worker_specs(program, ports, env)
            ]
            return run_workers(
                specs, grace_s=grace_s, timeout_s=timeout_s, system=system, startup=startup
            )
        with PortReservation(num_workers, LOCAL_HOST) as reservation:
            specs = worker_specs(program, reservation.ports, env)
            note = exposed_note(env, reservation.ports, why_exposed)
            # Free the ports only now, right before the workers start (see ports.py).
            reservation.release()
            return run_workers(
                specs,
                grace_s=grace_s,
                timeout_s=timeout_s,
                system=system,
                notes=[note],
                startup=startup,
            )


def function_program(
    fn: Callable[..., object], args: Sequence[object], payload_dir: str, python: str
) -> list[str]:
    """The argv that runs `fn(*args)` in a worker, with spawn semantics.

    Writes the pickled function, arguments and multiprocessing's preparation
    data (sys.path, cwd, the parent's __main__) to a file in `payload_dir`;
    the caller removes that directory after the workers exited.

    Args:
        fn: A picklable (module-level) function.
        args: Positional arguments for `fn`, picklable.
        payload_dir: A private directory that outlives the workers.
        python: The interpreter to run.

    Returns:
        `[python, "-c", <bootstrap>, <payload path>]`.

    Raises:
        ValueError: If `fn` or `args` cannot be pickled.

    Example:
        >>> function_program(train, (), tmp_dir, sys.executable)[:2]
        ['/usr/bin/python3', '-c']
    """
    try:
        fn_bytes = pickle.dumps(fn)
        args_bytes = pickle.dumps(tuple(args))
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise ValueError(
            _errors.message(
                "A function run in workers must be picklable by reference, as with "
                "multiprocessing's spawn start method, and so must its arguments.",
                f"fn={fn!r} ({type(err).__name__}: {err})",
                "Define the function at module level (not a lambda or a nested function), "
                "and guard the launching code with `if __name__ == '__main__':`.",
            )
        ) from err
    preparation = multiprocessing.spawn.get_preparation_data("shardfeed-worker")
    # The authkey refuses to pickle outside multiprocessing's own spawning;
    # plain bytes carry the same key (the payload file is private to this user).
    preparation["authkey"] = bytes(preparation["authkey"])
    payload = {
        "preparation": preparation,
        "fn": fn_bytes,
        "args": args_bytes,
    }
    path = os.path.join(payload_dir, "function.pickle")
    with open(path, "wb") as payload_file:
        pickle.dump(payload, payload_file)
    return [python, "-c", _FUNCTION_BOOTSTRAP, path]
