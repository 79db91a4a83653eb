"""`shardfeed.init` on JAX: one process, or a `jax.distributed` job from the launcher's variables.

Engines `"single"`, `"jax"` (every device of every process, one mesh axis) and
`"auto"`; TensorFlow's are refused. The coordinator (`coordinator_for`, pure):
TF_CONFIG's first task, the SLURM step's first host at `slurm_port_base`, or
rank 0 from an mpi4py exchange. A loopback job binds the coordinator and Gloo to
127.0.0.1 (Gloo otherwise takes the host name's interface); a multi-host job's
coordinator binds its own address, authenticates with the job's mutual-TLS
credentials (`_distribute/credentials.py`), and its chief logs `exposure_line`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import inspect
import logging
import math
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Literal

import jax

from shardfeed._common import errors as _errors
from shardfeed._common.host import is_loopback
from shardfeed._common.ports import port_in_use
from shardfeed._distribute import credentials as _credentials
from shardfeed._distribute import launch_env as _launch_env
from shardfeed._distribute import progress as _progress
from shardfeed._distribute import startup as _startup
from shardfeed._distribute import tf_config as _tf_config
from shardfeed._jax import seeding as _seeding
from shardfeed._jax import world as _world

logger = logging.getLogger("shardfeed")

EngineName = Literal["auto", "single", "jax"]
ENGINES = ("auto", "single", "jax")
TENSORFLOW_ENGINES = ("mirrored", "multiworker", "horovod")

# jax.distributed.initialize takes whole seconds; "no bound" is a day.
_UNBOUNDED_TIMEOUT_S = 86_400


@dataclasses.dataclass(frozen=True)
class Coordinator:
    """Where a `jax.distributed` job meets, and this process's place in it.

    Attributes:
        address: "host:port" of the coordinator service (on process 0).
        num_processes: Processes of the job.
        process_id: This process's index (`jax.process_index()` after start).
        loopback: Whether every process runs on this host's loopback
            addresses; then the coordinator and Gloo bind 127.0.0.1 only.
    """

    address: str
    num_processes: int
    process_id: int
    loopback: bool

    @property
    def bind_address(self) -> str | None:
        """What the coordinator binds: 127.0.0.1:port for a loopback job,
        else None (JAX's default, every interface)."""
        return f"127.0.0.1:{self.address.rsplit(':', 1)[1]}" if self.loopback else None


def resolve_engine(engine: str, launch_env: _launch_env.LaunchEnv) -> str:
    """Chooses the engine on JAX: pure, so every rule is tested with plain values.

    `"auto"` is `"jax"`: every device of every process the launcher started.
    `"single"` is one device of one process.
    """
    if engine in TENSORFLOW_ENGINES:
        raise ValueError(
            _errors.message(
                f"`engine={engine!r}` is a TensorFlow engine; on the JAX backend the engines "
                f"are {ENGINES}.",
                f"engine={engine!r}, keras.backend.backend()='jax'",
                'Use engine="auto" (several devices or processes run as one JAX mesh, over '
                "`jax.distributed` when a launcher started several workers), or set "
                "KERAS_BACKEND=tensorflow for the TensorFlow engines (docs/engines.md).",
            )
        )
    if engine not in ENGINES:
        raise ValueError(
            _errors.message(
                f"`engine` must be one of {ENGINES} on the JAX backend.",
                f"engine={engine!r}",
                'Use "auto" to pick from how the script was started.',
            )
        )
    if launch_env.launcher == "horovod":
        raise ValueError(
            _errors.message(
                "horovodrun starts Horovod workers, which need TensorFlow; the JAX backend "
                "runs its workers over `jax.distributed`.",
                f"launcher='horovod' ({', '.join(launch_env.variables)})",
                "Start the workers with `shardfeed launch -n N`, mpirun or srun, or set "
                "KERAS_BACKEND=tensorflow.",
            )
        )
    if engine == "single" and launch_env.world_size > 1:
        raise ValueError(
            _errors.message(
                '`engine="single"` runs one device of one process, but the launcher started '
                "several workers.",
                f"engine='single', world_size={launch_env.world_size} (from {launch_env.launcher})",
                'Use engine="auto", or start one process.',
            )
        )
    return "single" if engine == "single" else "jax"


def coordinator_for(launch_env: _launch_env.LaunchEnv, environ: Mapping[str, str]) -> Coordinator:
    """Where this job's coordinator listens, from the launcher's variables.

    Pure for `shardfeed launch`, TF_CONFIG and srun; under mpirun (no
    TF_CONFIG) it is a collective: every rank exchanges its address with
    mpi4py, as the TensorFlow engine does.

    Raises:
        ValueError: For a launcher whose variables name no coordinator, or a
            malformed SLURM port base.
        ImportError: For mpirun without mpi4py.
    """
    tasks = _startup.cluster_tasks(environ)
    if not tasks and launch_env.launcher == "mpi":
        config = _tf_config.tf_config_from_mpi()
        # Every rank's address: whether they name one host decides loopback.
        tasks = [(f"worker {i}", a) for i, a in enumerate(config["cluster"]["worker"])]
    if tasks:
        address = tasks[0][1]
        task_hosts = {a.rsplit(":", 1)[0] for _, a in tasks}
        loopback = all(is_loopback(h) for h in task_hosts)
        if len(task_hosts) == 1 and not loopback:
            # Every process runs on this one host (mpirun -np N here: each rank
            # announced the host's name): meet on loopback, open to no other host.
            address, loopback = f"127.0.0.1:{address.rsplit(':', 1)[1]}", True
    elif launch_env.launcher == "slurm":
        port = _tf_config.slurm_port_base(environ)
        nodelist = environ.get("SLURM_STEP_NODELIST", environ.get("SLURM_JOB_NODELIST", ""))
        address, loopback = f"{_tf_config.first_slurm_host(nodelist)}:{port}", False
        if environ.get("SLURM_STEP_NUM_NODES", environ.get("SLURM_NNODES", "")).strip() == "1":
            address, loopback = f"127.0.0.1:{port}", True  # a one-node step: as above
    else:
        raise ValueError(
            _errors.message(
                "Several JAX workers need a coordinator address: rank 0's entry of TF_CONFIG "
                "(`shardfeed launch` writes it), srun's node list or mpirun's ranks.",
                f"launcher={launch_env.launcher!r}, world_size={launch_env.world_size} "
                f"({', '.join(launch_env.variables)})",
                "Start the workers with `shardfeed launch -n N`, srun or mpirun, or give every "
                "process a TF_CONFIG naming the same cluster.",
            )
        )
    return Coordinator(address, launch_env.world_size, launch_env.rank, loopback)


def gloo_binding(coordinator: Coordinator, environ: Mapping[str, str]) -> dict[str, str]:
    """Where this process's Gloo collectives listen (the keywords of JAX's
    `make_gloo_tcp_collectives`; pure): 127.0.0.1 for a loopback job; the
    interface SHARDFEED_NETWORK_INTERFACE names, when set, for a multi-host one
    (the interface whose address the ranks announce: where host names do not
    resolve, Gloo's default, the address of `socket.gethostname()`, fails to
    start); else JAX's default ({})."""
    if coordinator.loopback:
        return {"hostname": "127.0.0.1"}
    interface = environ.get(_tf_config.NETWORK_INTERFACE_VARIABLE, "").strip()
    return {"interface": interface} if interface else {}


def own_bind_address(coordinator: Coordinator) -> str | None:
    """What a multi-host job's coordinator binds: its own address ("ip:port")
    when the coordinator's host is one of this host's non-loopback addresses,
    else None (JAX's default, every interface: e.g. a host name that resolves
    to another address here than on the other hosts)."""
    if coordinator.loopback:
        return coordinator.bind_address
    host, port = coordinator.address.rsplit(":", 1)
    try:
        address = socket.gethostbyname(host.strip("[]"))
        if is_loopback(address):
            return None
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))  # fails unless the address is this host's
    except OSError:
        return None
    return f"{address}:{port}"


def exposure_line(
    coordinator: Coordinator, security: _credentials.Security, bind_address: str | None
) -> str | None:
    """The line a multi-host JAX job's chief logs (None for a loopback job)."""
    if coordinator.loopback:
        return None
    where = "on every interface of its host" if bind_address is None else f"on {bind_address} only"
    gloo = (
        "every process's Gloo collectives listen on a random port of the address its host "
        "name resolves to (or SHARDFEED_NETWORK_INTERFACE's)"
    )
    if security == "mtls":
        return (
            "shardfeed: this multi-host JAX job's coordinator (process 0 at "
            f"{coordinator.address}) listens {where} and admits only processes holding the "
            f"job's credentials (mutual TLS); {gloo}, unauthenticated: firewall those from "
            "everyone but the other workers (docs/engines.md, Security)."
        )
    return (
        "shardfeed: this multi-host JAX job's coordinator (process 0 at "
        f"{coordinator.address}) listens {where}, and {gloo}; neither is authenticated. "
        "Keep the hosts on a trusted network, or firewall these ports from everyone but the "
        "other workers (docs/engines.md, Security)."
    )


def has_mtls() -> bool:
    """Whether this JAX's `jax.distributed.initialize` takes mutual-TLS files (>= 0.11.2)."""
    return "mtls_cert_file" in inspect.signature(jax.distributed.initialize).parameters


def check_coordinator_port_free(coordinator: Coordinator) -> None:
    """On process 0, fails at once naming the port when the coordinator's is taken
    (JAX says only "Failed to start RPC server"). The port is free again after.

    Raises:
        OSError: (errno EADDRINUSE) If another socket holds the port.
    """
    port = int(coordinator.address.rsplit(":", 1)[1])
    if port_in_use("127.0.0.1" if coordinator.loopback else "", port):
        raise OSError(
            errno.EADDRINUSE,
            _errors.message(
                f"Port {port} is in use: process 0 runs the `jax.distributed` coordinator on it.",
                f"coordinator address={coordinator.address!r}",
                f"Stop the program that holds the port (`ss -ltnp 'sport = :{port}'` names "
                "it) and rerun; `shardfeed launch` picks free ports on each run.",
            ),
        )


def init(
    engine: EngineName = "auto",
    cpu_devices: int | None = None,
    *,
    startup_timeout_s: float | None = None,
    shutdown_timeout_s: float | None = None,
    heartbeat_timeout_s: float | None = None,
) -> _world.World:
    """Starts JAX for how this script was launched, and returns the `World`.

    Args:
        engine: `"auto"` (default) or `"jax"`: every device of every worker
            as one mesh, over `jax.distributed` when a launcher started
            several workers; `"single"`: one device of one process. The
            TensorFlow engines (`"mirrored"`, `"multiworker"`, `"horovod"`)
            are refused, naming the fix.
        cpu_devices: Split the CPU into this many devices
            (`jax_num_cpu_devices`), to try several replicas without GPUs.
            None (default): `SHARDFEED_CPU_DEVICES`, else leave JAX's
            configuration (e.g. `XLA_FLAGS=--xla_force_host_platform_device_count=N`).
            Must come before anything starts JAX's backends (the first array
            or `jax.devices()`).
        startup_timeout_s: Several workers only: seconds to wait for every
            worker to join the coordinator (default:
            `SHARDFEED_STARTUP_TIMEOUT_S`, else 300; `math.inf` waits a day).
        shutdown_timeout_s: Several workers only: seconds an exiting worker
            waits for the others to exit too (after `sys.exit(n)`, or a
            normal end long before its peers'); then it exits anyway, with
            its own exit status, and says so on stderr (default:
            `SHARDFEED_SHUTDOWN_TIMEOUT_S`, else 60; JAX's own exit barrier
            waits 300 s, then aborts: SIGABRT). An uncaught exception does
            not wait at all.
        heartbeat_timeout_s: Several workers only: seconds a worker may send
            the coordinator no heartbeat (its host or process gone) before
            every worker stops (default: `SHARDFEED_HEARTBEAT_TIMEOUT_S`,
            else 60; JAX's own is 100).

    Returns:
        The JAX `World`: rank, world size, devices in global replica order,
        the mesh the dataset and the loop use.

    Exposure: a job on one host (every process on 127.0.0.1, as `shardfeed
    launch` starts them, or every task naming the same host) binds its
    coordinator and Gloo to 127.0.0.1 only; a multi-host job's coordinator
    binds its own address and, on JAX >= 0.11.2, admits only processes
    holding the job's credentials (SHARDFEED_MTLS_DIR; refused without them
    unless SHARDFEED_INSECURE_NETWORK=1); its chief logs once (logger
    "shardfeed", WARNING) what listens where, and what is authenticated.

    Seeding: with several processes, every model built afterwards starts
    from the same values on every process, in a loop of your own too: Python's
    `random` (where Keras' unseeded initializers draw their seeds) is seeded
    with one seed, rank 0's draw, unless a process seeded Keras first
    (`keras.utils.set_random_seed`, kept). NumPy's generator is left alone
    (docs/custom_loops.md).

    Raises:
        ValueError: For an unknown or TensorFlow engine, horovodrun, launcher
            variables naming no coordinator, `cpu_devices` with GPUs, a
            timeout that is not a positive number of seconds, a multi-host
            job without credentials where JAX has mutual TLS, or credentials
            where it has not (or files that fail the handshake).
        FileNotFoundError, PermissionError: For a credentials directory that
            lacks a file, or whose key others can read.
        RuntimeError: For `cpu_devices` after JAX started its backends with
            another number of CPU devices, naming the fix.
        OSError: On process 0, if the coordinator's port is in use (named).

    Example:
        >>> world = shardfeed.init()
        >>> world.num_replicas_in_sync
        1
    """
    _launch_env.announce(_launch_env.ARRIVED)
    timeout_s = _startup.startup_timeout_s(startup_timeout_s, os.environ)
    shutdown_s = _startup.timeout_s(
        shutdown_timeout_s,
        os.environ,
        option="shutdown_timeout_s",
        variable=_startup.SHUTDOWN_TIMEOUT_VARIABLE,
        default=_startup.DEFAULT_SHUTDOWN_TIMEOUT_S,
    )
    heartbeat_s = _startup.timeout_s(
        heartbeat_timeout_s,
        os.environ,
        option="heartbeat_timeout_s",
        variable=_startup.HEARTBEAT_TIMEOUT_VARIABLE,
        default=_startup.DEFAULT_HEARTBEAT_TIMEOUT_S,
    )
    launch_env = _launch_env.detect_launch_env(os.environ)
    chosen = resolve_engine(engine, launch_env)
    split_cpu_into = _startup.cpu_devices_wanted(cpu_devices, os.environ)
    if split_cpu_into is not None:
        _split_cpu(split_cpu_into)
    coordinator = None
    secure: dict[str, object] = {}
    bind_address = None
    if launch_env.world_size > 1 and not jax.distributed.is_initialized():
        coordinator = coordinator_for(launch_env, os.environ)
        credentials = _credentials.credentials_from(os.environ)
        security = _credentials.network_security(
            loopback=coordinator.loopback,
            credentials_given=credentials is not None,
            insecure_ok=_credentials.insecure_network_ok(os.environ),
            engine_has_mtls=has_mtls(),
            engine=f"jax=={jax.__version__}",
        )
        if credentials is not None:
            secure = credentials.jax_keywords()
        if coordinator.process_id == 0:
            bind_address = own_bind_address(coordinator)
            check_coordinator_port_free(coordinator)
            line = exposure_line(coordinator, security, bind_address)
            if line is not None:
                logger.warning(line)
    # `jax.distributed.initialize` installs a native SIGTERM handler (its
    # preemption notifier: measured, SIGTERM then no longer ends the process);
    # put back what was there, so a launcher or scheduler stopping workers
    # with SIGTERM does not wait for its SIGKILL.
    with _startup.keeping_sigterm_disposition():
        if coordinator is not None:
            jax.distributed.initialize(
                coordinator_address=coordinator.address,
                num_processes=coordinator.num_processes,
                process_id=coordinator.process_id,
                coordinator_bind_address=bind_address,
                initialization_timeout=_whole_seconds(timeout_s),
                shutdown_timeout_seconds=_whole_seconds(shutdown_s),
                heartbeat_timeout_seconds=_whole_seconds(heartbeat_s),
                **secure,
            )
            _exit_with_own_status(shutdown_s)
        binding = {} if coordinator is None else gloo_binding(coordinator, os.environ)
        with _gloo_bound(binding):
            devices = jax.devices()  # starts the backends (and, in a job, Gloo)
    if split_cpu_into is not None and split_cpu_into > 1 and jax.default_backend() != "cpu":
        raise ValueError(
            _errors.message(
                "`cpu_devices` splits the CPU into devices for a machine without "
                "accelerators; with them, the replicas are the accelerators.",
                f"cpu_devices={split_cpu_into}, jax.default_backend()={jax.default_backend()!r}",
                "Drop `cpu_devices` (and unset SHARDFEED_CPU_DEVICES), or hide the "
                'accelerators (`CUDA_VISIBLE_DEVICES=""` or JAX_PLATFORMS=cpu).',
            )
        )
    if chosen == "single":
        world = _world.World(0, 1, 0, (jax.local_devices()[0],))
    else:
        world = _world.World(
            jax.process_index(),
            jax.process_count(),
            launch_env.local_rank or 0,
            _world.ordered_devices(devices),
        )
    _world.remember_initialized(world)
    # Every model built from here on starts alike on every process, in a loop
    # of the user's own too (unless the user seeded Keras: theirs is kept).
    _seeding.agree_keras_seed(world)
    _launch_env.announce(_launch_env.INITIALIZED)
    _launch_env.record_exit_start()
    _progress.dump_stacks_on_request()
    return world


def _whole_seconds(timeout_s: float) -> int:
    """A timeout as `jax.distributed.initialize` takes it: whole seconds, >= 1."""
    return _UNBOUNDED_TIMEOUT_S if math.isinf(timeout_s) else max(1, math.ceil(timeout_s))


def _exit_with_own_status(shutdown_s: float) -> None:
    """In a `jax.distributed` job, a process ends with its own exit status.

    JAX's exit handler waits at a barrier for every process to exit too, up to
    `shutdown_timeout_seconds`, then aborts (SIGABRT, exit status 134):
    measured, a rank whose script raised stayed alive 300 s while the others
    waited in a collective, and a rank's `sys.exit(3)` ended as 134. Now:
    - an uncaught exception: after the traceback is printed, the user's exit
      handlers run, then not JAX's: the process exits with 1 (130 for
      Ctrl-C), and the launcher stops the other ranks, naming this one;
    - any other exit (`sys.exit(n)`, the script's end): a barrier of our own
      first, bounded by `shutdown_s`, whose timeout Python can catch; when the
      others do not reach theirs, JAX's waits are skipped and the process
      exits with its own status. When they do, JAX's own barrier follows at
      once (every rank is exiting).
    """
    import atexit

    from jax._src import api as jax_api
    from jax._src import dispatch as jax_dispatch
    from jax._src import distributed as jax_distributed

    # Both wait on the other ranks: the shutdown barrier, and the tokens of
    # collectives they may never join (JAX 0.10-0.12's names; if a JAX moves
    # them, an exception skips every exit handler rather than wait, and other
    # exits keep JAX's waits).
    found = [getattr(jax_api, "clean_up", None), getattr(jax_dispatch, "wait_for_tokens", None)]
    waiting = [handler for handler in found if handler is not None]
    known = len(waiting) == len(found)
    previous = sys.excepthook

    def wait_for_peers() -> None:
        client = jax_distributed.global_state.client
        if client is None:  # `jax.distributed.shutdown()` already ran
            return
        try:
            client.wait_at_barrier(_EXIT_BARRIER, _whole_seconds(shutdown_s) * 1000)
        except jax.errors.JaxRuntimeError:  # DEADLINE_EXCEEDED: the others still run
            for handler in waiting:
                atexit.unregister(handler)
            print(
                f"shardfeed: rank {jax_distributed.global_state.process_id} is exiting, but "
                f"the other ranks did not reach their exit within {shutdown_s:g} s "
                "(shutdown_timeout_s); it exits now, with its own exit status, without "
                "waiting for them.",
                file=sys.stderr,
                flush=True,
            )

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        previous(kind, value, tb)
        if known:
            for handler in [*waiting, wait_for_peers]:
                atexit.unregister(handler)
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(130 if issubclass(kind, KeyboardInterrupt) else 1)

    sys.excepthook = hook
    if known:
        atexit.register(wait_for_peers)  # after JAX's: runs before them


_EXIT_BARRIER = "shardfeed_exit"


def _split_cpu(num_devices: int) -> None:
    """`jax_num_cpu_devices = num_devices`, or nothing when JAX already runs so."""
    try:
        jax.config.update("jax_num_cpu_devices", num_devices)
    except RuntimeError as err:  # JAX's backends are already initialised
        have = len(jax.devices("cpu"))
        if have == num_devices:
            return
        raise RuntimeError(
            _errors.message(
                "The CPU can be split into devices only before JAX starts its backends "
                "(the first array, jit call or `jax.devices()`).",
                f"cpu_devices={num_devices}, JAX already runs with {have} CPU device(s)",
                "Call `shardfeed.init(cpu_devices=N)` (or set SHARDFEED_CPU_DEVICES=N) before "
                "any other JAX or Keras call, e.g. first thing in the script.",
            )
        ) from err


@contextlib.contextmanager
def _gloo_bound(binding: Mapping[str, str]) -> Iterator[None]:
    """While JAX makes its CPU client, Gloo binds where `binding` says
    (`gloo_binding`) instead of the address the host name resolves to
    (measured: an external address; in `shardfeed launch`'s network namespace
    none that can be bound; where the name does not resolve, none at all). JAX
    has no public setting for it; its CPU client calls this factory once, when
    the backends start."""
    if not binding:
        yield
        return
    from jax._src import xla_bridge

    make = xla_bridge._jax.make_gloo_tcp_collectives
    xla_bridge._jax.make_gloo_tcp_collectives = functools.partial(make, **binding)
    try:
        yield
    finally:
        xla_bridge._jax.make_gloo_tcp_collectives = make
