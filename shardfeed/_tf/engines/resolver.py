"""TF_CONFIG from SLURM's job step (`tf_config_from_slurm`, TensorFlow's
`SlurmClusterResolver`) and `ensure_tf_config`, which picks a builder and sets the
variable; only workers import it, never the launcher."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

from shardfeed._common import errors as _errors
from shardfeed._distribute import tf_config as _tf_config
from shardfeed._distribute.launch_env import LaunchEnv, detect_launch_env, read_int, received

_SLURM_STEP_VARIABLES = (
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)


def tf_config_from_slurm(
    environ: Mapping[str, str], *, port_base: int = _tf_config.DEFAULT_SLURM_PORT_BASE
) -> dict[str, Any]:
    """Builds this task's TF_CONFIG from the variables `srun` sets for a job step.

    Uses `tf.distribute.cluster_resolver.SlurmClusterResolver` for the layout,
    reading `environ` instead of `os.environ`: hosts from
    `SLURM_STEP_NODELIST` (e.g. "node[1-2]") with tasks per host from
    `SLURM_STEP_TASKS_PER_NODE` (e.g. "2(x2)"), hosts sorted by name, the
    tasks of one host listening on `port_base`, `port_base + 1`, ..., and task
    index = `SLURM_PROCID`. GPU assignment is left to srun (`--gpus-per-task`)
    and to the engine, so `CUDA_VISIBLE_DEVICES` is neither read nor changed
    and `nvidia-smi` is not called. Needs no `scontrol`.

    Args:
        environ: Environment variables of an srun task, usually `os.environ`.
        port_base: First port on each host.

    Returns:
        The TF_CONFIG dict for this task (see `worker_tf_config`).

    Raises:
        ValueError: If step variables are missing or malformed, or this task
            does not run where the layout puts it (tasks not numbered node by
            node, as with `--distribution=cyclic`).

    Example:
        >>> tf_config_from_slurm({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
        ...                       "SLURM_STEP_NODELIST": "node[1-2]",
        ...                       "SLURM_STEP_TASKS_PER_NODE": "1(x2)"})
        {'cluster': {'worker': ['node1:8888', 'node2:8888']},
         'task': {'type': 'worker', 'index': 1}}
    """
    fix = "Start one task per worker with `srun` (see launch/slurm.sbatch)."
    missing = [name for name in _SLURM_STEP_VARIABLES if name not in environ]
    if missing:
        raise ValueError(
            _errors.message(
                "Resolving the cluster from SLURM needs the variables srun sets for a job step; "
                "an sbatch script itself is a single process.",
                received(environ, _SLURM_STEP_VARIABLES),
                fix,
            )
        )
    import tensorflow as tf

    resolver_class = tf.distribute.cluster_resolver.SlurmClusterResolver
    resolver_module = sys.modules[resolver_class.__module__]
    try:
        hosts = resolver_module.expand_hostlist(environ["SLURM_STEP_NODELIST"])
        tasks_per_host = resolver_module.expand_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
    except ValueError as err:
        raise ValueError(
            _errors.message(
                "SLURM's node list and tasks per node must be in SLURM's compressed format.",
                f"{received(environ, _SLURM_STEP_VARIABLES[2:])} ({err})",
                fix,
            )
        ) from None
    rank = read_int(environ, "SLURM_PROCID", _SLURM_STEP_VARIABLES, fix)
    num_tasks = read_int(environ, "SLURM_STEP_NUM_TASKS", _SLURM_STEP_VARIABLES, fix)
    if not 0 <= rank < num_tasks:
        raise ValueError(
            _errors.message(
                "SLURM_PROCID must lie in [0, SLURM_STEP_NUM_TASKS).",
                received(environ, _SLURM_STEP_VARIABLES[:2]),
                fix,
            )
        )
    if len(hosts) != len(tasks_per_host) or sum(tasks_per_host) != num_tasks:
        raise ValueError(
            _errors.message(
                "SLURM's node list, tasks per node and number of tasks must agree.",
                f"{received(environ, _SLURM_STEP_VARIABLES)} ({len(hosts)} hosts, "
                f"{len(tasks_per_host)} task counts summing to {sum(tasks_per_host)})",
                fix,
            )
        )

    class _EnvironSlurmResolver(resolver_class):  # type: ignore[misc, valid-type]
        # The only value the resolver still reads itself once the layout is
        # passed in; read it from `environ` instead of os.environ.
        def _resolve_own_rank(self) -> int:
            return rank

    resolver = _EnvironSlurmResolver(
        jobs={"worker": num_tasks},
        port_base=port_base,
        # One "GPU" per task keeps the resolver's GPU arithmetic valid on
        # CPU-only nodes; auto_set_gpu=False means it assigns nothing.
        gpus_per_node=max(tasks_per_host),
        gpus_per_task=1,
        tasks_per_node=dict(zip(hosts, tasks_per_host, strict=True)),
        auto_set_gpu=False,
    )
    addresses = resolver.cluster_spec().as_dict()["worker"]
    task_type, task_index = resolver.get_task_info()
    own_host, own_port = addresses[task_index].rsplit(":", 1)
    node = environ.get("SLURMD_NODENAME")
    local_id = environ.get("SLURM_LOCALID")
    if (node is not None and node != own_host) or (
        local_id is not None and local_id.isdigit() and int(own_port) - port_base != int(local_id)
    ):
        raise ValueError(
            _errors.message(
                "TensorFlow's SLURM layout numbers tasks node by node (SLURM's default block "
                "distribution), so task SLURM_PROCID must run on the host and local slot the "
                f"layout gives it ({addresses[task_index]}).",
                received(environ, ["SLURM_PROCID", "SLURMD_NODENAME", "SLURM_LOCALID"]),
                "Use srun's default `--distribution=block`.",
            )
        )
    return {
        "cluster": {"worker": list(addresses)},
        "task": {"type": task_type, "index": task_index},
    }


def ensure_tf_config(
    environ: MutableMapping[str, str] | None = None, *, port_base: int | None = None
) -> LaunchEnv:
    """Sets TF_CONFIG from srun's or mpirun's variables when no TF_CONFIG is set.

    Call it in every worker before building MultiWorkerMirroredStrategy. For
    MPI it is a collective call (every rank must make it). A Horovod launch
    and a single process need no TF_CONFIG and are left alone.

    Args:
        environ: Environment to read and update (default: `os.environ`).
        port_base: First port on each host for SLURM (see
            `tf_config_from_slurm`); default `SHARDFEED_PORT_BASE` from
            `environ`, else 8888.

    Returns:
        The `LaunchEnv` detected before any change.

    Raises:
        ValueError: As `detect_launch_env` and `tf_config_from_slurm`, or if
            `SHARDFEED_PORT_BASE` is not a port number.
        ImportError: For MPI without mpi4py.

    Example:
        >>> ensure_tf_config()  # in a task started by `srun`
        LaunchEnv(launcher='slurm', rank=0, world_size=8, local_rank=0, variables=(...))
    """
    environ = os.environ if environ is None else environ
    launch_env = detect_launch_env(environ)
    if launch_env.world_size == 1 or environ.get("TF_CONFIG", "").strip():
        return launch_env
    if launch_env.launcher == "slurm":
        if port_base is None:
            port_base = _tf_config.slurm_port_base(environ)
        config = tf_config_from_slurm(environ, port_base=port_base)
    elif launch_env.launcher == "mpi":
        config = _tf_config.tf_config_from_mpi()
    else:
        return launch_env
    environ["TF_CONFIG"] = json.dumps(config)
    return launch_env
