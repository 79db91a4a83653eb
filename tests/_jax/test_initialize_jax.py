"""`shardfeed.init()` on JAX: the engine rules, where the coordinator is, the CPU split,
and real 2-process `jax.distributed` jobs under `shardfeed launch` on 127.0.0.1 (and
under mpirun, `--engine mpi`).

The pure rules are tested with plain values; everything that starts JAX's
backends runs in a fresh process (a backend starts once per process). The
2-process jobs show init, the world, barrier, all_gather_bytes and a jit sum
over a global array across processes, and that killing one worker stops every
rank within a bound, each process reaped.
"""

from __future__ import annotations

import errno
import io
import json
import os
import socket
import time
from pathlib import Path

import pytest
from _helpers_init import BUILT_BEFORE_INIT, rows
from _helpers_jax import ASSERT_NO_TENSORFLOW, REPO, run_python
from _helpers_procs import is_gone

import shardfeed
from shardfeed import _launch
from shardfeed._distribute import tf_config
from shardfeed._distribute.launch_env import LaunchEnv, detect_launch_env
from shardfeed._jax import initialize
from shardfeed._launch.process import System

SINGLE = LaunchEnv("single", 0, 1, 0)


def test_shardfeed_init_is_the_jax_one():
    assert shardfeed.init is initialize.init


@pytest.mark.parametrize(
    ("engine", "launch_env", "expected"),
    [
        ("auto", SINGLE, "jax"),  # every local device (one, or several split/forced)
        ("jax", SINGLE, "jax"),
        ("single", SINGLE, "single"),
        ("auto", LaunchEnv("shardfeed", 1, 2, 1), "jax"),  # over jax.distributed
        ("auto", LaunchEnv("slurm", 0, 4, 0), "jax"),
    ],
)
def test_engine_rules(engine, launch_env, expected):
    assert initialize.resolve_engine(engine, launch_env) == expected


def test_a_tensorflow_engine_is_refused_naming_the_fix():
    with pytest.raises(ValueError) as err:
        initialize.resolve_engine("mirrored", SINGLE)
    assert str(err.value) == (
        "`engine='mirrored'` is a TensorFlow engine; on the JAX backend the engines are "
        "('auto', 'single', 'jax'). Received: engine='mirrored', keras.backend.backend()='jax'. "
        'Use engine="auto" (several devices or processes run as one JAX mesh, over '
        "`jax.distributed` when a launcher started several workers), or set "
        "KERAS_BACKEND=tensorflow for the TensorFlow engines (docs/engines.md)."
    )


@pytest.mark.parametrize(
    ("engine", "launch_env", "fragment"),
    [
        ("multiworker", SINGLE, "`engine='multiworker'` is a TensorFlow engine"),
        ("horovod", SINGLE, "`engine='horovod'` is a TensorFlow engine"),
        ("gpu", SINGLE, "`engine` must be one of ('auto', 'single', 'jax') on the JAX backend."),
        ("auto", LaunchEnv("horovod", 0, 2, 0, ("HOROVOD_RANK",)), "horovodrun starts Horovod"),
        ("single", LaunchEnv("shardfeed", 0, 2, 0), '`engine="single"` runs one device'),
    ],
)
def test_other_refusals(engine, launch_env, fragment):
    with pytest.raises(ValueError) as err:
        initialize.resolve_engine(engine, launch_env)
    assert str(err.value).startswith(fragment)


def _tf_config(rank, addresses, chief=None):
    cluster = {"worker": addresses, **({"chief": [chief]} if chief else {})}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})


def test_the_coordinator_is_rank_0s_tf_config_address_bound_to_loopback():
    environ = {
        "SHARDFEED_RANK": "1",
        "SHARDFEED_WORLD_SIZE": "2",
        "SHARDFEED_LOCAL_RANK": "1",
        "TF_CONFIG": _tf_config(1, ["127.0.0.1:4001", "127.0.0.1:4002"]),
    }
    coordinator = initialize.coordinator_for(detect_launch_env(environ), environ)
    assert coordinator == initialize.Coordinator("127.0.0.1:4001", 2, 1, loopback=True)
    assert coordinator.bind_address == "127.0.0.1:4001"
    assert initialize.own_bind_address(coordinator) == "127.0.0.1:4001"
    assert initialize.exposure_line(coordinator, "loopback", "127.0.0.1:4001") is None


def test_a_multi_host_coordinator_binds_its_own_address_and_says_so():
    # A chief comes first in rank order (as MultiWorkerMirroredStrategy numbers tasks).
    environ = {"TF_CONFIG": _tf_config(0, ["10.0.0.2:5000"], chief="10.0.0.1:5000")}
    coordinator = initialize.coordinator_for(detect_launch_env(environ), environ)
    assert coordinator == initialize.Coordinator("10.0.0.1:5000", 2, 1, loopback=False)
    # 10.0.0.1 is not this machine's: binding it would fail, so JAX's default (every
    # interface), said in the line.
    assert initialize.own_bind_address(coordinator) is None
    assert initialize.exposure_line(coordinator, "insecure", None) == (
        "shardfeed: this multi-host JAX job's coordinator (process 0 at 10.0.0.1:5000) listens on "
        "every interface of its host, and every process's Gloo collectives listen on a random "
        "port of the address its host name resolves to (or SHARDFEED_NETWORK_INTERFACE's); "
        "neither is authenticated. Keep the hosts on a trusted network, or firewall these ports "
        "from everyone but the other workers (docs/engines.md, Security)."
    )
    assert initialize.exposure_line(coordinator, "mtls", "10.0.0.1:5000") == (
        "shardfeed: this multi-host JAX job's coordinator (process 0 at 10.0.0.1:5000) listens on "
        "10.0.0.1:5000 only and admits only processes holding the job's credentials (mutual "
        "TLS); every process's Gloo collectives listen on a random port of the address its host "
        "name resolves to (or SHARDFEED_NETWORK_INTERFACE's), unauthenticated: firewall those "
        "from everyone but the other workers (docs/engines.md, Security)."
    )


def test_a_coordinator_named_by_an_address_of_this_host_binds_that_address_only():
    address = _a_non_loopback_address()
    coordinator = initialize.Coordinator(f"{address}:5000", 2, 0, loopback=False)
    assert initialize.own_bind_address(coordinator) == f"{address}:5000"


def _a_non_loopback_address():
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet: picks the outgoing address
        except OSError:
            pytest.skip("this machine has no non-loopback IPv4 address")
        address = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address")
    return address


@pytest.mark.parametrize(
    ("loopback", "environ", "binding"),
    [
        (True, {}, {"hostname": "127.0.0.1"}),  # never the host name's (external) address
        (True, {"SHARDFEED_NETWORK_INTERFACE": "eth1"}, {"hostname": "127.0.0.1"}),
        (False, {}, {}),  # JAX's default: the address the host name resolves to
        # Where host names do not resolve: the interface the ranks announce.
        (False, {"SHARDFEED_NETWORK_INTERFACE": " eth1 "}, {"interface": "eth1"}),
    ],
)
def test_where_gloo_listens(loopback, environ, binding):
    coordinator = initialize.Coordinator("10.0.0.1:5000", 2, 0, loopback=loopback)
    assert initialize.gloo_binding(coordinator, environ) == binding


def test_under_srun_the_coordinator_is_the_first_host_at_the_port_base():
    environ = {
        "SLURM_PROCID": "3",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SHARDFEED_PORT_BASE": "9100",
    }
    coordinator = initialize.coordinator_for(detect_launch_env(environ), environ)
    assert coordinator == initialize.Coordinator("gpu07:9100", 4, 3, loopback=False)
    del environ["SHARDFEED_PORT_BASE"]
    assert initialize.coordinator_for(detect_launch_env(environ), environ).address == "gpu07:8888"
    # A one-node step meets on loopback, reachable from no other host.
    environ.update(SLURM_STEP_NODELIST="gpu07", SLURM_STEP_NUM_NODES="1")
    coordinator = initialize.coordinator_for(detect_launch_env(environ), environ)
    assert coordinator == initialize.Coordinator("127.0.0.1:8888", 4, 3, loopback=True)


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        # Two hosts: the coordinator at rank 0's address (a bug made every mpirun
        # job look like one host: only rank 0's address was read, and rank 1 on
        # the other host never reached 127.0.0.1).
        (["10.0.0.1:5000", "10.0.0.2:5001"], ("10.0.0.1:5000", False)),
        (["node1:5000", "node1:5001"], ("127.0.0.1:5000", True)),  # one host
        # Loopback by the package's one rule (`is_loopback`), each taken for another
        # host before: names are case-blind, and an IPv4-mapped 127.x is loopback.
        (["LOCALHOST:5000", "127.0.0.2:5001"], ("LOCALHOST:5000", True)),
        (["[::ffff:127.0.0.1]:5000", "127.0.0.1:5001"], ("[::ffff:127.0.0.1]:5000", True)),
    ],
)
def test_under_mpirun_every_ranks_address_decides_loopback(monkeypatch, workers, expected):
    environ = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
               "OMPI_COMM_WORLD_LOCAL_RANK": "0"}  # fmt: skip
    monkeypatch.setattr(
        tf_config, "tf_config_from_mpi", lambda: {"cluster": {"worker": workers}}
    )
    coordinator = initialize.coordinator_for(detect_launch_env(environ), environ)
    assert (coordinator.address, coordinator.loopback) == expected


def test_workers_that_all_name_one_host_meet_on_loopback():
    """`mpirun -np 2` on one host: every rank announces the host's name; the job
    needs no network, so it opens none (and needs no credentials)."""
    environ = {"TF_CONFIG": _tf_config(1, ["node1:4001", "node1:4002"])}
    coordinator = initialize.coordinator_for(detect_launch_env(environ), environ)
    assert coordinator == initialize.Coordinator("127.0.0.1:4001", 2, 1, loopback=True)


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("node1", "node1"),
        ("node1,node2", "node1"),
        ("node[01-04,07]", "node01"),  # zero padding kept
        ("node[3,5-6],gpu1", "node3"),
        ("rack[2-3]-n,x", "rack2-n"),  # a suffix after the range
    ],
)
def test_first_slurm_host(nodelist, first):
    assert tf_config.first_slurm_host(nodelist) == first


@pytest.mark.parametrize(
    "kwargs, environ, pinned",
    [
        ({"shutdown_timeout_s": 0}, {}, "Received: shutdown_timeout_s=0."),
        ({}, {"SHARDFEED_HEARTBEAT_TIMEOUT_S": "soon"}, "SHARDFEED_HEARTBEAT_TIMEOUT_S='soon'"),
    ],
)
def test_init_refuses_a_timeout_that_is_not_seconds(monkeypatch, kwargs, environ, pinned):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="must be a positive number of seconds") as info:
        shardfeed.init(**kwargs)
    assert pinned in str(info.value)
    assert "Pass e.g. `shardfeed.init(" in str(info.value)


def test_several_workers_without_a_coordinator_address_are_refused():
    environ = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}
    with pytest.raises(ValueError, match="Several JAX workers need a coordinator address"):
        initialize.coordinator_for(LaunchEnv("tf_config", 0, 2, None), {})
    with pytest.raises(ValueError, match="horovodrun starts Horovod workers"):
        initialize.resolve_engine("auto", detect_launch_env(environ))


def test_a_taken_coordinator_port_is_named():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        coordinator = initialize.Coordinator(f"127.0.0.1:{port}", 2, 0, loopback=True)
        with pytest.raises(OSError) as err:
            initialize.check_coordinator_port_free(coordinator)
    assert err.value.errno == errno.EADDRINUSE
    assert str(err.value).startswith(
        f"[Errno 98] Port {port} is in use: process 0 runs the `jax.distributed` coordinator on "
        f"it. Received: coordinator address='127.0.0.1:{port}'. Stop the program"
    )
    initialize.check_coordinator_port_free(coordinator)  # free again: no error


def test_init_in_one_process_splits_the_cpu_and_refuses_a_late_split():
    code = (
        """
import os, jax, shardfeed
world = shardfeed.init(cpu_devices=3)
print("devices", world.num_replicas_in_sync, world.rank, world.world_size, dict(world.mesh.shape))
assert shardfeed.init(cpu_devices=3) == world  # a second init with the same split
try:
    shardfeed.init(cpu_devices=2)
except RuntimeError as err:
    print(err)
print("single", shardfeed.init(engine="single").num_replicas_in_sync)
"""
        + ASSERT_NO_TENSORFLOW
    )
    out = run_python(code, env={"XLA_FLAGS": ""}).stdout
    assert "devices 3 0 1 {'replica': 3}" in out
    assert (
        "The CPU can be split into devices only before JAX starts its backends (the first "
        "array, jit call or `jax.devices()`). Received: cpu_devices=2, JAX already runs with 3 "
        "CPU device(s). Call `shardfeed.init(cpu_devices=N)`"
    ) in out
    assert "single 1" in out


def test_init_reads_the_cpu_split_from_the_variable_after_importing_keras():
    code = "import keras, shardfeed\nprint('replicas', shardfeed.init().num_replicas_in_sync)\n"
    out = run_python(code, env={"SHARDFEED_CPU_DEVICES": "2", "XLA_FLAGS": ""}).stdout
    assert "replicas 2" in out


# The 2-process job: every rank checks the world and the collectives itself.
JOB = r"""
import os, signal, sys, time
import shardfeed
out_dir, mode = sys.argv[1], sys.argv[2]
world = shardfeed.init()
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
with open(os.path.join(out_dir, f"pid{world.rank}"), "w") as f:
    f.write(str(os.getpid()))
# The launcher's rank: `shardfeed launch` (multiworker) or mpirun's (engine "mpi").
launcher_rank = os.environ.get("SHARDFEED_RANK") or os.environ["OMPI_COMM_WORLD_RANK"]
assert (world.world_size, world.rank) == (2, int(launcher_rank))
assert world.num_replicas_in_sync == 4 and len(world.local_devices) == 2
world.barrier()
print("gathered", world.all_gather_bytes(b"r%d" % world.rank * (world.rank + 1)), flush=True)
sharding = NamedSharding(world.mesh, P("replica"))
local = [jax.device_put(np.full((2,), float(g), np.float32), d)
         for g, d in zip(world.global_replica_ids, world.local_devices)]
x = jax.make_array_from_single_device_arrays((8,), sharding, local)
total = jax.jit(jnp.sum, out_shardings=NamedSharding(world.mesh, P()))(x)
print("sum", float(total.addressable_data(0)), flush=True)
assert "tensorflow" not in sys.modules
if mode == "kill-rank-1":
    if world.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    world.barrier()  # rank 0 waits in a collective its peer never joins
    time.sleep(120)
if mode == "exit-rank-1":
    if world.rank == 1:
        sys.exit(3)  # no exception hook runs: the exit barrier waits for rank 0
    time.sleep(120)  # rank 0 is busy (alive, outside any collective)
if mode == "raise-rank-1":
    import atexit
    atexit.register(print, "rank", world.rank, "atexit ran", flush=True)
    if world.rank == 1:
        raise RuntimeError("a user error on rank 1")
    world.barrier()  # rank 0 waits in a collective its peer never joins
    time.sleep(120)
"""


def _launch_job(tmp_path, monkeypatch, mode, engine="multiworker", **options):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    out, err = io.BytesIO(), io.BytesIO()
    start = time.monotonic()
    code = _launch.run(
        script,
        num_workers=2,
        engine=engine,
        args=[tmp_path, mode],
        timeout_s=100,
        grace_s=10,
        system=System(stdout=out, stderr=err),
        **options,
    )
    return code, out.getvalue().decode(), err.getvalue().decode(), time.monotonic() - start


def _assert_the_launcher_names(err: str, failure: str) -> None:
    # Rank 0 loses its connection to rank 1 and may exit within the same poll:
    # then the launcher names both, and rank 1 either way.
    launcher = [line for line in err.splitlines() if line.startswith("shardfeed launch: ")]
    assert any(failure in line for line in launcher), launcher


@pytest.mark.multi_process
def test_two_jax_processes_under_shardfeed_launch(tmp_path, monkeypatch):
    code, out, err, _ = _launch_job(tmp_path, monkeypatch, "ok")
    assert code == 0, err[-3000:]
    for rank in (0, 1):
        assert f"[rank {rank}] gathered [b'r0', b'r1r1']" in out
        # Replica g holds two copies of g: 2 * (0 + 1 + 2 + 3), summed across processes.
        assert f"[rank {rank}] sum 12.0" in out


@pytest.mark.multi_process
def test_killing_one_jax_worker_stops_every_rank(tmp_path, monkeypatch):
    code, _, err, elapsed = _launch_job(tmp_path, monkeypatch, "kill-rank-1")
    assert code != 0
    _assert_the_launcher_names(err, "worker rank 1 was killed by SIGKILL")
    assert "sending SIGKILL" not in err  # rank 0, in a collective, ended on SIGTERM
    assert elapsed < 60
    pids = [int(p.read_text()) for p in Path(tmp_path).glob("pid*")]
    assert len(pids) == 2
    assert [pid for pid in pids if not is_gone(pid)] == []


@pytest.mark.multi_process
def test_an_exception_on_one_jax_worker_stops_every_rank_in_seconds(tmp_path, monkeypatch):
    # JAX's exit waits up to `shutdown_timeout_seconds` (300) for every rank at a
    # barrier: the failed rank used to stay alive that long, holding the job.
    code, out, err, elapsed = _launch_job(tmp_path, monkeypatch, "raise-rank-1")
    assert code == 1, err[-3000:]
    assert "RuntimeError: a user error on rank 1" in err
    _assert_the_launcher_names(err, "worker rank 1 exited with code 1")
    assert "[rank 1] rank 1 atexit ran" in out  # the user's exit handlers still run
    assert elapsed < 60
    pids = [int(p.read_text()) for p in Path(tmp_path).glob("pid*")]
    assert len(pids) == 2
    assert [pid for pid in pids if not is_gone(pid)] == []


@pytest.mark.multi_process
def test_killing_one_jax_worker_under_mpirun_stops_every_rank(tmp_path, monkeypatch, capfd):
    """`shardfeed launch --engine mpi` on JAX: mpirun starts the ranks, `shardfeed.init()`
    finds the coordinator by the mpi4py exchange (the collectives work: the job's sum);
    rank 1 dies by SIGKILL while rank 0 waits in a collective, and mpirun stops rank 0
    and exits non-zero, naming rank 1."""
    code, _, err, elapsed = _launch_job(tmp_path, monkeypatch, "kill-rank-1", engine="mpi")
    output = capfd.readouterr()  # mpirun's own output reaches the terminal, rank-tagged
    assert code == 128 + 9, err[-3000:]
    assert "shardfeed launch: mpirun exited with code 137." in err
    assert "[1,0]<stdout>: sum 12.0" in output.out and "[1,1]<stdout>: sum 12.0" in output.out
    assert "process rank 1 with PID" in output.err and "signal 9 (Killed)" in output.err
    assert elapsed < 60
    pids = [int(p.read_text()) for p in Path(tmp_path).glob("pid*")]
    assert len(pids) == 2
    assert [pid for pid in pids if not is_gone(pid)] == []


@pytest.mark.multi_process
def test_sys_exit_on_one_jax_worker_ends_with_its_status_within_the_shutdown_timeout(
    tmp_path, monkeypatch
):
    # `sys.exit(3)` runs no exception hook. Used to fail: rank 1 waited at JAX's
    # exit barrier for rank 0 (busy for 120 s) up to `shutdown_timeout_seconds`
    # (JAX's 300 s), then JAX aborted both ranks: status 134, either rank named.
    # `--shutdown-timeout-s` reaches `shardfeed.init()` through
    # SHARDFEED_SHUTDOWN_TIMEOUT_S; shardfeed's own bounded barrier runs first.
    code, _, err, elapsed = _launch_job(tmp_path, monkeypatch, "exit-rank-1", shutdown_timeout_s=3)
    assert code == 3, err[-3000:]
    assert (
        "shardfeed: rank 1 is exiting, but the other ranks did not reach their exit within "
        "3 s (shutdown_timeout_s); it exits now, with its own exit status"
    ) in err
    _assert_the_launcher_names(err, "worker rank 1 exited with code 3")
    assert "SIGABRT" not in err
    assert elapsed < 60
    pids = [int(p.read_text()) for p in Path(tmp_path).glob("pid*")]
    assert [pid for pid in pids if not is_gone(pid)] == []


# One rank sleeps (alive) where the others wait for it: rank 1 in a callback
# while rank 0 waits in the next call of `fit`; rank 1 before `fit` while rank 0
# waits in the ranks' agreement on its arguments; rank 1 in `on_epoch_end` while
# rank 0 waits in the next epoch's opening (a collective between counted calls);
# rank 1 at its exit while rank 0 waits in `iterator(model=)`, called there alone;
# inside a compiled step, in an `io_callback` (JAX runs it on the first device,
# rank 0's), while rank 1 waits inside the same call.
STUCK_JOB = r"""
import os, sys, time
import shardfeed
world = shardfeed.init()
import jax, keras, numpy as np
from jax.experimental import io_callback
with open(os.path.join(sys.argv[1], f"pid{world.rank}"), "w") as f:
    f.write(str(os.getpid()))
where = sys.argv[2]
x = np.arange(256 * 4, dtype=np.float32).reshape(256, 4) / 1000.0
y = x.sum(axis=1, keepdims=True)
ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=8, seed=1)

def nap():
    nap.calls = getattr(nap, "calls", 0) + 1
    if nap.calls == 3:  # a step after the first compiled call's
        print("stuck", flush=True)
        time.sleep(10**6)
    return np.float32(0)

class Nap(keras.layers.Layer):
    def call(self, x):
        return x + io_callback(nap, jax.ShapeDtypeStruct((), np.float32))

layers = [Nap()] if where == "step" else []
model = keras.Sequential([keras.Input((4,)), *layers, keras.layers.Dense(1)])
model.compile("sgd", "mse")

class Stuck(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if world.rank == 1 and where == "callback" and batch == 2:
            print("stuck", flush=True)
            time.sleep(10**6)

    def on_epoch_end(self, epoch, logs=None):
        if world.rank == 1 and where == "epoch-end":
            print("stuck", flush=True)
            time.sleep(10**6)

if world.rank == 1 and where == "before-fit":
    print("stuck", flush=True)
    time.sleep(10**6)
if where == "iterator":  # a collective called on rank 0 only; rank 1 ends its script
    if world.rank == 0:
        print("stuck", flush=True)
        ds.iterator(model=model)
    sys.exit(0)
shardfeed.fit(model, ds, epochs=3, verbose=0, callbacks=[Stuck()],
              options=shardfeed.FitOptions(steps_per_execution=1))
"""


@pytest.mark.multi_process
@pytest.mark.parametrize(
    ("where", "stuck", "named"),
    [
        ("callback", 1,
         "worker rank(s) 1 made no progress for 5 s: they stand at shardfeed call 4 while "
         "rank(s) 0 wait for them in call 5 (in the callback hook on_train_batch_end)"),
        # Used to run into the launch's timeout: the agreement on fit's arguments
        # is a collective but counted no call, so both ranks stood at 0.
        ("before-fit", 1,
         "worker rank(s) 1 made no progress for 5 s: they stand at shardfeed call 0 while "
         "rank(s) 0 wait for them in call 1 (in their own code, outside shardfeed's calls)"),
        # These two used to run into the launch's timeout: every rank's count
        # stood still and agreed.
        ("epoch-end", 1,
         "worker rank(s) 1 made no progress for 5 s: they stand in the callback hook "
         "on_epoch_end while rank(s) 0 wait for them in shardfeed's fit, in a collective "
         "between its counted calls"),
        # Used to run into the launch's timeout: the model check was no counted call.
        ("iterator", 0,
         "worker rank(s) 1 made no progress for 5 s: they stand at shardfeed call 0 while "
         "rank(s) 0 wait for them in call 1 (at their exit, done with the script)"),
        ("step", 0,
         # Past 3 x the longest train call that completed (at least 5 s).
         "every one stands inside shardfeed call 4 (a compiled train call): a rank stuck "
         "inside the call"),
    ],
)  # fmt: skip
def test_a_stuck_jax_worker_is_named_and_the_job_stopped(
    tmp_path, monkeypatch, where, stuck, named
):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_JOB)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    out, err = io.BytesIO(), io.BytesIO()
    start = time.monotonic()
    code = _launch.run(
        script, num_workers=2, args=[tmp_path, where], timeout_s=60, grace_s=5,
        progress_timeout_s=5, system=System(stdout=out, stderr=err),
    )
    elapsed, err_text = time.monotonic() - start, err.getvalue().decode()
    assert code == 124, err_text[-3000:]
    assert f"[rank {stuck}] stuck" in out.getvalue().decode()
    assert named in err_text, err_text[-3000:]  # after "shardfeed launch: worker rank(s) ..."
    assert "timed out after" not in err_text
    # Where each rank stood, from its own stacks, before they were stopped.
    for rank in (0, 1):
        assert f"shardfeed launch: Python stacks of worker rank {rank} " in err_text
    if where == "epoch-end":
        assert "in on_epoch_end\n" in err_text  # the sleeping rank's frame
    assert elapsed < 60
    pids = [int(p.read_text()) for p in Path(tmp_path).glob("pid*")]
    assert len(pids) == 2
    assert [pid for pid in pids if not is_gone(pid)] == []


# -- init ordering -----------------------------------------------------------------------------


def test_a_dataset_built_before_init_is_refused_once_init_starts_more_replicas(no_init):
    import keras

    x, y = rows()
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=1)
    assert ds.world.num_replicas_in_sync == 1  # one device, as Keras on JAX without init
    world = shardfeed.init()
    assert world.num_replicas_in_sync == 4
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(RuntimeError) as info:
        shardfeed.fit(model, ds, epochs=1, verbose=0)
    assert str(info.value) == BUILT_BEFORE_INIT
    with pytest.raises(RuntimeError, match=r"built before `shardfeed\.init"):
        ds.epoch(0)
    # Built after init: its world is init's.
    assert shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=1).world == world


def test_a_dataset_built_before_an_init_with_the_same_world_is_kept(no_init):
    x, y = rows()
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=1)
    shardfeed.init(engine="single")
    assert ds.world.num_replicas_in_sync == 1


def test_a_worker_of_a_launch_that_never_called_init_is_refused(no_init, monkeypatch):
    import keras

    for name, value in {"SHARDFEED_RANK": "1", "SHARDFEED_WORLD_SIZE": "2",
                        "SHARDFEED_LOCAL_RANK": "1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    x, y = rows()
    with pytest.raises(RuntimeError) as info:
        shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=1)
    assert str(info.value) == (
        "A launcher started 2 workers, but this one never called `shardfeed.init()`: its dataset "
        "would hold every row and train alone, and every worker would act as the chief. "
        "Received: launcher='shardfeed', rank=1, world_size=2 (from SHARDFEED_RANK, "
        "SHARDFEED_WORLD_SIZE, SHARDFEED_LOCAL_RANK), shardfeed.init() not called. Call "
        "shardfeed.init() before building the dataset (first thing in the script)."
    )
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(RuntimeError, match=r"never called `shardfeed\.init"):
        shardfeed.evaluate(model, x, y, verbose=0)  # arrays become a dataset
