"""Two simulated hosts for multi-host tests: network namespaces joined by a veth pair.

Each "host" is a network namespace holding a loopback interface and one end of
a veth pair with a private address (10.231.0.1/30 and 10.231.0.2/30): traffic
flows only between the two, never to the machine's own network. Creating
them needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the `ip` tool;
`why_not` says which is missing. Each host also has a node name (sfnode1,
sfnode2) that both resolve, as on a cluster: `ip netns exec` lays
/etc/netns/<namespace>/hosts over /etc/hosts.

Stand-ins for the programs a cluster has and this machine lacks: `ssh`
(runs the command inside the named host's namespace) and `srun` (starts a
job step's tasks on the allocation's nodes with the variables srun sets).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

ADDRESSES = ("10.231.0.1", "10.231.0.2")
OUTSIDER_ADDRESS = "10.231.0.3"  # a third machine on the same network, not in the job
NODES = ("sfnode1", "sfnode2")  # the hosts' names, as SLURM's node list gives them
REPO = Path(__file__).resolve().parents[1]
INTERFACE = "sfnet"  # each host's end of the veth pair, renamed to one name as on a cluster
# `sh -c _AS_HOST NAME PROGRAM...`: set the host name (in a UTS namespace), become PROGRAM.
_AS_HOST = 'hostname "$0" && exec "$@"'

# What `srun` does for a job step, on the allocation the sbatch environment
# describes (SLURM_JOB_NODELIST "sfnode[1-2]", SLURM_NTASKS_PER_NODE): one task
# per slot, numbered node by node (--distribution=block), each started on its
# node (its namespace) with the step variables srun sets; output passes
# through; --kill-on-bad-exit=1 stops the others when one fails; SIGTERM and
# SIGINT are forwarded. Exits with the first failed task's code, else 0.
_SRUN = r"""
import os, re, signal, subprocess, sys, time
NAMESPACES = dict(zip(NODES, NAMESPACE_LIST))
args = sys.argv[1:]
options = {}
while args and args[0].startswith("-"):
    name, _, value = args.pop(0).partition("=")
    options[name] = value
if options.get("--distribution", "block") != "block":
    sys.exit("srun stand-in: only --distribution=block")
nodelist = os.environ["SLURM_JOB_NODELIST"]
prefix, first, last = re.fullmatch(r"(\w+)\[(\d+)-(\d+)\]", nodelist).groups()
nodes = [f"{prefix}{i}" for i in range(int(first), int(last) + 1)]
per_node = int(os.environ["SLURM_NTASKS_PER_NODE"])
ntasks = per_node * len(nodes)
step = {
    "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
    "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_STEP_NUM_NODES": str(len(nodes)),
    "SLURM_STEP_NODELIST": nodelist,
    "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{len(nodes)})",
    "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks),
    "SLURM_NNODES": str(len(nodes)), "SLURM_NODELIST": nodelist,
    "SLURM_TASKS_PER_NODE": f"{per_node}(x{len(nodes)})",
    "SLURM_DISTRIBUTION": "block", "SLURM_LAUNCH_NODE_IPADDR": ADDRESS_LIST[0],
    "SLURM_SRUN_COMM_HOST": ADDRESS_LIST[0],
}
tasks = []
for node_id, node in enumerate(nodes):
    for local_id in range(per_node):
        env = {**os.environ, **step, "SLURM_PROCID": str(node_id * per_node + local_id),
               "SLURM_LOCALID": str(local_id), "SLURM_NODEID": str(node_id),
               "SLURMD_NODENAME": node, "SLURM_TOPOLOGY_ADDR": node}
        tasks.append(subprocess.Popen(
            ["ip", "netns", "exec", NAMESPACES[node], "unshare", "--uts", "sh", "-c", AS_HOST,
             node, *args],
            env=env,
        ))
def forward(signum, frame):
    for task in tasks:
        if task.poll() is None:
            task.send_signal(signum)
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
failed = None
while any(task.poll() is None for task in tasks):
    bad = [t.returncode for t in tasks if t.returncode not in (None, 0)]
    if bad and failed is None:
        failed = bad[0]
        if options.get("--kill-on-bad-exit") == "1":
            print(f"srun stand-in: a task exited {failed}; killing the others", file=sys.stderr)
            for task in tasks:
                if task.poll() is None:
                    task.kill()
    time.sleep(0.1)
codes = [t.returncode for t in tasks]
sys.exit(failed if failed is not None else next((c for c in codes if c), 0) % 256)
"""


# A job's worker: one tiny model trained on both hosts, its weights saved per rank
# (`assert_same_weights` compares them).
WORKER = r"""
import sys
import keras, numpy as np
import shardfeed

world = shardfeed.init()
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
keras.utils.set_random_seed(0)
with world.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    train = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
shardfeed.fit(model, train, epochs=2, verbose=0)
weights = np.concatenate([w.ravel() for w in model.get_weights()])
np.savez(f"{sys.argv[1]}.rank{world.rank}.npz", weights=weights,
         num_replicas=world.num_replicas_in_sync)
"""


def assert_same_weights(prefix: Path) -> None:
    first, second = (np.load(f"{prefix}.rank{rank}.npz") for rank in range(2))
    assert int(first["num_replicas"]) == 2  # one job of two workers
    np.testing.assert_array_equal(first["weights"], second["weights"])


LAUNCH = [sys.executable, "-m", "shardfeed._commands.cli", "launch"]


def launch_on(host: int, *options: str) -> list[str]:
    """`shardfeed launch -n 2 --hosts <both> --host-index <host> ...` (one worker per host)."""
    both = ",".join(ADDRESSES)
    return [*LAUNCH, "-n", "2", "--hosts", both, "--host-index", str(host), *options]


@dataclasses.dataclass(frozen=True)
class TwoHosts:
    namespaces: tuple[str, str]
    addresses: tuple[str, str] = ADDRESSES
    interface: str = INTERFACE
    outsider: str | None = None  # the outsider's namespace (`two_hosts(outsider=True)`)

    def outsider_argv(self, program: Sequence[str]) -> list[str]:
        """`program` run on the outsider's machine (OUTSIDER_ADDRESS, same network)."""
        assert self.outsider is not None, "two_hosts(outsider=True) makes the outsider"
        return ["ip", "netns", "exec", self.outsider, *program]

    def argv(self, host: int, program: Sequence[str]) -> list[str]:
        """`program` run on host `host`: in its network namespace, under its own host
        name (a UTS namespace: programs that compare host names, as Gloo does to take
        loopback to a peer on the same host, see two hosts)."""
        return [
            "ip",
            "netns",
            "exec",
            self.namespaces[host],
            "unshare",
            "--uts",
            "sh",
            "-c",
            _AS_HOST,
            NODES[host],
            *program,
        ]

    def ssh_stand_in(self, path: str) -> str:
        """Writes an `ssh` stand-in at `path`: `ssh [options] HOST [options] COMMAND` runs
        COMMAND (one shell string, as ssh takes it) inside HOST's namespace. Options may
        come after HOST, as OpenSSH allows (horovodrun puts `-o ConnectTimeout=..` there)."""
        cases = "".join(
            f"        {address}) ns={namespace}; node={node};;\n"
            for address, namespace, node in zip(self.addresses, self.namespaces, NODES, strict=True)
        )
        with open(path, "w") as f:
            f.write(
                '#!/bin/bash\nns=\nwhile [ $# -gt 0 ]; do\n    case "$1" in\n'
                '        -[oplieFJ]) shift 2; continue;;\n        -*|"") shift; continue;;\n'
                '    esac\n    [ -n "$ns" ] && break\n    case "$1" in\n'
                f"{cases}"
                '        *) echo "ssh stand-in: unknown host $1" >&2; exit 255;;\n'
                "    esac\n    shift\ndone\n"
                f'exec ip netns exec "$ns" unshare --uts sh -c \'{_AS_HOST}\' "$node" '
                'sh -c "$*"\n'
            )
        os.chmod(path, 0o755)
        return path

    def srun_stand_in(self, path: str) -> str:
        """Writes an `srun` stand-in at `path` (see `_SRUN`): the tasks of a job step
        on the nodes the sbatch environment names, each in its node's namespace."""
        with open(path, "w") as f:
            f.write(
                f"#!{sys.executable}\nNODES = {NODES!r}\nNAMESPACE_LIST = {self.namespaces!r}\n"
                f"ADDRESS_LIST = {self.addresses!r}\nAS_HOST = {_AS_HOST!r}\n{_SRUN}"
            )
        os.chmod(path, 0o755)
        return path

    def sbatch_environment(self, tasks_per_node: int = 1) -> dict[str, str]:
        """What sbatch sets for its batch script on an allocation of both hosts
        (`--nodes=2 --ntasks-per-node=N`): the script runs on the first node."""
        nodelist = f"sfnode[1-{len(NODES)}]"
        ntasks = str(tasks_per_node * len(NODES))
        return {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOBID": "4242",
            "SLURM_JOB_NAME": "shardfeed",
            "SLURM_JOB_NODELIST": nodelist,
            "SLURM_NODELIST": nodelist,
            "SLURM_JOB_NUM_NODES": str(len(NODES)),
            "SLURM_NNODES": str(len(NODES)),
            "SLURM_NTASKS": ntasks,
            "SLURM_NPROCS": ntasks,
            "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
            "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{len(NODES)})",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURMD_NODENAME": NODES[0],
            "SLURM_SUBMIT_HOST": NODES[0],
        }


def run_on_hosts(
    two: TwoHosts, argv_for_rank, port: int, timeout_s: float, during=None, tf_config=True
) -> list[tuple[int, str]]:
    """Runs `argv_for_rank(i)` on host i, each with its TF_CONFIG (unless `tf_config`
    is False: a launcher that writes them); returns (exit code, output) per host."""
    addresses = [f"{address}:{port}" for address in two.addresses]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SHARDFEED_", "OMPI_", "PMI", "TF_CONFIG", "XLA_FLAGS"))
    }
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), SHARDFEED_STARTUP_TIMEOUT_S="60")
    workers = []
    try:
        for rank in range(2):
            config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}}
            workers.append(
                subprocess.Popen(
                    two.argv(rank, argv_for_rank(rank)),
                    env={**env, "TF_CONFIG": json.dumps(config)} if tf_config else env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        if during is not None:
            during(workers)
        outputs = [w.communicate(timeout=timeout_s)[0] for w in workers]
        return [(w.returncode, output) for w, output in zip(workers, outputs, strict=True)]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.communicate()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def why_not() -> str | None:
    """Why two hosts cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "needs the `ip` tool (iproute2) to create network namespaces"
    if os.geteuid() != 0:
        return "creating network namespaces and a veth pair needs root (ip netns add)"
    return None


@contextlib.contextmanager
def two_hosts(names_resolve: bool = True, outsider: bool = False) -> Iterator[TwoHosts]:
    """Creates the two namespaces and their veth pair; deletes them (and it) on exit.
    `names_resolve=False`: the node names resolve on neither host (as on clusters
    whose host names are not in DNS). `outsider=True`: a third machine on the same
    network (OUTSIDER_ADDRESS), not part of the job: the three are joined by a
    bridge in a fourth namespace instead of one veth pair."""
    tag = f"{os.getpid() % 100000}"
    names = (f"sf{tag}a", f"sf{tag}b")  # also the veth ends' names (<= 15 characters)
    third, switch = f"sf{tag}o", f"sf{tag}s"
    created: list[str] = []
    try:
        for name in (*names, third, switch) if outsider else names:
            _ip("netns", "add", name)
            created.append(name)
        if outsider:
            _ip("-n", switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", switch, "link", "set", "br0", "up")
            machines = zip((*names, third), (*ADDRESSES, OUTSIDER_ADDRESS), strict=True)
            ends = [(n, f"{n}p", a) for n, a in machines]
            prefix = 24
        else:
            _ip("link", "add", names[0], "type", "veth", "peer", "name", names[1])
            ends = [(n, None, a) for n, a in zip(names, ADDRESSES, strict=True)]
            prefix = 30
        for name, port, address in ends:
            if port is not None:  # this machine's cable to the switch
                _ip("link", "add", name, "type", "veth", "peer", "name", port)
                _ip("link", "set", port, "netns", switch)
                _ip("-n", switch, "link", "set", port, "master", "br0")
                _ip("-n", switch, "link", "set", port, "up")
            _ip("link", "set", name, "netns", name)
            _ip("-n", name, "link", "set", name, "name", INTERFACE)
            _ip("-n", name, "addr", "add", f"{address}/{prefix}", "dev", INTERFACE)
            _ip("-n", name, "link", "set", INTERFACE, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        for name in names:
            # Both hosts resolve both node names (ip netns exec mounts it over /etc/hosts).
            os.makedirs(f"/etc/netns/{name}", exist_ok=True)
            with open("/etc/hosts") as original, open(f"/etc/netns/{name}/hosts", "w") as f:
                f.write(original.read().rstrip("\n") + "\n")
                if names_resolve:
                    f.writelines(f"{a} {n}\n" for a, n in zip(ADDRESSES, NODES, strict=True))
        yield TwoHosts(names, outsider=third if outsider else None)
    finally:
        for name in names:
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
        for name in created:  # deleting a namespace deletes its veth end, and the pair
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        for name in (*names, third):
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                _ip("link", "del", name)  # only if it never moved into its namespace
