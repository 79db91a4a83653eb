"""Engine choice, GPU pinning and device-memory queries: logic tested on CPU.

The GPU-only paths (NVML's free memory, one GPU per worker) are tested here
with fakes; `tests/_tf/test_gpu.py` is the thin tier that runs them for real and
skips, saying why, where no GPU is visible.
"""

from __future__ import annotations

import sys
import types

import pytest
from _helpers_init import BUILT_BEFORE_INIT, rows

from shardfeed._data import memory as _memory
from shardfeed._distribute import launch_env as _launch_env
from shardfeed._tf import initialize as _init


def _env(launcher="single", rank=0, world_size=1, local_rank=None):
    return _launch_env.LaunchEnv(launcher, rank, world_size, local_rank)


@pytest.mark.parametrize(
    ("engine", "launch", "gpus", "cpus", "expected"),
    [
        ("auto", _env(), 0, 0, "single"),  # plain `python train.py` on a CPU
        ("auto", _env(), 1, 0, "single"),  # one GPU
        ("auto", _env(), 4, 0, "mirrored"),  # several local GPUs
        ("auto", _env(), 0, 2, "mirrored"),  # CPU split into devices on purpose
        ("auto", _env(), 1, 2, "single"),  # a GPU wins over split CPUs
        ("auto", _env("shardfeed", 1, 2, 1), 0, 0, "multiworker"),  # shardfeed launch
        ("auto", _env("mpi", 0, 4, 0), 8, 0, "multiworker"),  # mpirun, GPUs per worker
        ("auto", _env("slurm", 3, 8, 1), 0, 0, "multiworker"),
        ("auto", _env("tf_config", 0, 2), 0, 0, "multiworker"),
        ("auto", _env("horovod", 0, 2, 0), 2, 0, "horovod"),  # horovodrun
        ("auto", _env("horovod", 0, 1, 0), 0, 0, "horovod"),  # horovodrun -np 1
        ("single", _env("mpi", 0, 4, 0), 0, 0, "single"),  # forced
        ("horovod", _env(), 0, 0, "horovod"),
    ],
)
def test_resolve_engine(engine, launch, gpus, cpus, expected):
    assert _init.resolve_engine(engine, launch, gpus, cpus) == expected


def test_unknown_engine_is_an_error():
    with pytest.raises(ValueError) as err:
        _init.resolve_engine("nccl", _env(), 0, 0)
    assert str(err.value) == (
        "`engine` must be one of ('auto', 'single', 'mirrored', 'multiworker', 'horovod'). "
        "Received: engine='nccl'. Use \"auto\" to pick from how the script was started."
    )


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 4),
        ({"HOROVOD_LOCAL_SIZE": "2"}, 2),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}, 2),  # SLURM's compressed list
        ({"SLURM_NTASKS_PER_NODE": "8"}, 8),
        ({"MPI_LOCALNRANKS": "0"}, None),  # nonsense is ignored
    ],
)
def test_local_size(environ, expected):
    assert _init.local_size(environ) == expected


GPUS = ["/physical_device:GPU:0", "/physical_device:GPU:1"]


@pytest.mark.parametrize(
    ("gpus", "local_rank", "on_host", "expected"),
    [
        (GPUS, 1, 2, GPUS[1]),  # two workers, two GPUs: one each
        (GPUS, 0, 1, None),  # one worker per host keeps every GPU (Mirrored inside)
        (GPUS[:1], 1, 2, None),  # the launcher already pinned one GPU per process
        (GPUS, None, 2, None),  # a hand-written TF_CONFIG says no local rank
        ([], 0, 2, None),  # no GPU at all
    ],
)
def test_gpu_for_worker(gpus, local_rank, on_host, expected):
    assert _init.gpu_for_worker(gpus, local_rank, on_host) == expected


def test_more_workers_than_gpus_on_a_host_is_an_error():
    with pytest.raises(ValueError) as err:
        _init.gpu_for_worker(GPUS, 2, 3)
    assert str(err.value) == (
        "Each worker on a host needs its own GPU. Received: workers_on_host=3, visible "
        "GPUs=2. Start one worker per GPU, or set CUDA_VISIBLE_DEVICES per worker."
    )


@pytest.fixture
def fake_nvml(monkeypatch):
    """A stand-in `pynvml` whose GPU i has (i + 1) GiB free."""
    calls = []
    module = types.ModuleType("pynvml")
    module.nvmlInit = lambda: calls.append("init")
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(free=(h + 1) * 2**30)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return calls


def test_gpu_free_bytes_through_nvml(fake_nvml, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _memory.gpu_free_bytes(1) == 2 * 2**30
    assert _memory.free_bytes("/job:localhost/replica:0/task:0/device:GPU:0") == (2**30, "nvml")


def test_gpu_index_is_mapped_through_cuda_visible_devices(fake_nvml, monkeypatch):
    # TensorFlow's GPU:0 is physical GPU 3 when CUDA_VISIBLE_DEVICES=3,1.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert _memory.gpu_free_bytes(0) == 4 * 2**30
    assert _memory.gpu_free_bytes(1) == 2 * 2**30
    assert _memory.gpu_free_bytes(2) is None  # not visible
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5f1c")  # UUIDs: cannot map, say unknown
    assert _memory.gpu_free_bytes(0) is None


def test_without_nvml_gpu_memory_is_unknown_and_not_checked(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert _memory.free_bytes("GPU:0") == (None, "unknown")
    (report,) = _memory.memory_reports({"/device:GPU:0": 10**12}, 0.8)
    assert report.fits and report.source == "unknown"


def test_logical_cpu_devices_share_the_host(monkeypatch):
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: 1000)
    reports = _memory.memory_reports({"/device:CPU:0": 300, "/device:CPU:1": 300}, 0.5)
    assert [(r.device, r.needed_bytes, r.usable_bytes, r.fits) for r in reports] == [
        ("host", 600, 500, False)
    ]


# -- init ordering (TensorFlow; the JAX twins are in tests/_jax/test_initialize_jax.py) ----------


def test_a_dataset_built_before_init_is_refused_once_init_starts_more_replicas(no_init):
    import keras

    import shardfeed

    x, y = rows()
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=1)
    assert ds.world.num_replicas_in_sync == 1  # the default strategy: one device
    world = shardfeed.init("mirrored")  # the 4 logical CPUs of conftest
    assert world.num_replicas_in_sync == 4
    with world.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    with pytest.raises(RuntimeError) as info:
        shardfeed.fit(model, ds, epochs=1, verbose=0)
    assert str(info.value) == BUILT_BEFORE_INIT


def test_a_worker_of_a_launch_that_never_called_init_is_refused(no_init, monkeypatch):
    import shardfeed

    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                       '"task": {"type": "worker", "index": 0}}')  # fmt: skip
    x, y = rows()
    with pytest.raises(RuntimeError) as info:
        shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=1)
    assert str(info.value) == (
        "A launcher started 2 workers, but this one never called `shardfeed.init()`: its dataset "
        "would hold every row and train alone, and every worker would act as the chief. "
        "Received: launcher='tf_config', rank=0, world_size=2 (from TF_CONFIG), shardfeed.init() "
        "not called. Call shardfeed.init() before building the dataset (first thing in the script)."
    )
