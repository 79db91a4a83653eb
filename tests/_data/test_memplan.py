"""`shardfeed plan` / `memory_plan`: per-rank numbers, advice, sizes, CLI text and exit codes."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import shardfeed
from shardfeed import files
from shardfeed._commands import cli as _cli
from shardfeed._common.units import format_bytes, parse_size
from shardfeed._data import memory as _memory
from shardfeed._data import memplan as _memplan
from shardfeed._data.memplan import memory_plan as _memory_plan


def memory_plan(*args, **kwargs):
    # These tests check the rows' own numbers; the global shuffle's staging
    # buffer (counted by default) is checked in the tests at the end.
    return _memory_plan(*args, **{"shuffle": "local", **kwargs})


@pytest.fixture(autouse=True)
def _rows_only(monkeypatch):
    # So are the host's index arrays that CPU devices count with the rows:
    # `test_cpu_devices_count_the_hosts_index_arrays` checks them.
    monkeypatch.setattr(_memory, "HOST_INDEX_BYTES_PER_ROW", 0)
    # And each replica's positions (`test_the_positions_are_device_memory`).
    monkeypatch.setattr(_memory, "POSITION_BYTES", 0)


GIB = 1024**3
# x: float32[32] (128 B) + y: int64 (8 B) = 136 B per row.
ROW_BYTES = 136


def _data(rows: int) -> dict:
    return {"x": ((rows, 32), "float32"), "y": ((rows,), "int64")}


# (rows, workers, replicas_per_worker, batch, placement, drop) ->
#   (steps, per rank: (replica_ids, rows_per_replica, dropped_rows))
CASES = [
    (
        (1001, 3, 1, 100, "shard", False),
        (4, [((0,), (334,), 0), ((1,), (334,), 0), ((2,), (333,), 0)]),
    ),  # uneven shards: the last step is partial (34, 34, 33 rows), nothing dropped
    (
        (1001, 3, 1, 100, "shard", True),
        (3, [((0,), (334,), 34), ((1,), (334,), 34), ((2,), (333,), 33)]),
    ),  # drop_remainder: each replica drops the rows past its 3 full steps
    (
        (1001, 3, 2, 100, "shard", False),
        (2, [((0, 1), (167, 167), 0), ((2, 3), (167, 167), 0), ((4, 5), (167, 166), 0)]),
    ),  # two replicas per worker: 6 shards, the last one a row short
    (
        (1001, 3, 2, 100, "shard", True),
        (1, [((0, 1), (167, 167), 134), ((2, 3), (167, 167), 134), ((4, 5), (167, 166), 133)]),
    ),  # ...with drop_remainder only one full step of 100 per replica
    (
        (1001, 2, 1, 500, "shard", False),
        (1, [((0,), (501,), 1), ((1,), (500,), 0)]),
    ),  # replica 1 would have no row in step 2: rank 0's extra row is dropped
    (
        (1001, 3, 1, 100, "replicate", False),
        (4, [((0,), (1001,), 0), ((1,), (1001,), 0), ((2,), (1001,), 0)]),
    ),  # replicate: every device holds every row; 101 rows dealt 34/34/33 in step 4
    (
        (1001, 3, 1, 100, "replicate", True),
        (3, [((0,), (1001,), 34), ((1,), (1001,), 34), ((2,), (1001,), 33)]),
    ),  # ...with drop_remainder those 101 rows are dropped, counted round-robin
    (
        (1027, 2, 2, 256, "replicate", False),
        (1, [((0, 1), (1027, 1027), 2), ((2, 3), (1027, 1027), 1)]),
    ),  # 3 rows left for 4 replicas: one would get none, so all 3 are dropped
]


@pytest.mark.parametrize(("args", "expected"), CASES)
def test_per_rank_numbers(args, expected):
    rows, workers, per_worker, batch, placement, drop = args
    plan = memory_plan(
        _data(rows),
        num_workers=workers,
        replicas_per_worker=per_worker,
        per_replica_batch_size=batch,
        placement=placement,
        drop_remainder=drop,
        device_memory_bytes=GIB,
    )
    steps, ranks = expected
    assert plan.shard_plan.num_replicas == workers * per_worker
    assert plan.row_bytes == ROW_BYTES
    got = [(r.replica_ids, r.rows_per_replica, r.dropped_rows_per_epoch) for r in plan.ranks]
    assert got == ranks
    for r in plan.ranks:
        assert r.steps_per_epoch == steps == plan.shard_plan.steps_per_epoch
        assert r.bytes_per_replica == tuple(n * ROW_BYTES for n in r.rows_per_replica)
        assert r.needed_bytes == r.bytes_per_device == max(r.bytes_per_replica)
        assert (r.free_bytes, r.usable_bytes, r.fits) == (GIB, int(GIB * 0.8), True)
    # Never drop silently: the ranks' drops add up to the plan's.
    assert sum(r.dropped_rows_per_epoch for r in plan.ranks) == (
        plan.shard_plan.dropped_rows_per_epoch
    )
    assert plan.fits and plan.advice() == []
    assert plan.memory_source == "given"


def test_plan_is_frozen_and_public():
    plan = memory_plan(_data(10), num_workers=1, per_replica_batch_size=2, device_memory_bytes=GIB)
    assert isinstance(plan, shardfeed.MemoryPlan) and shardfeed.memory_plan is _memory_plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.num_workers = 2  # type: ignore[misc]


def test_accepts_arrays_lists_and_file_leaves(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((12, 3), "float64"))
    leaf = files.npy(tmp_path / "x.npy")
    for data, names in [
        (np.zeros((12, 3)), ["x"]),
        ([np.zeros((12, 3)), np.zeros(12, "uint8")], ["x[0]", "x[1]"]),
        ({"x": leaf, "y": ((12,), np.int32)}, ["x", "y"]),
        ({"x": {"a": leaf, "b": [np.zeros(12)]}}, ["x['a']", "x['b'][0]"]),
    ]:
        plan = memory_plan(data, num_workers=2, per_replica_batch_size=2, device_memory_bytes=GIB)
        assert [c.name for c in plan.columns] == names
        assert plan.shard_plan.num_rows == 12


def test_memory_comes_from_nvml_then_host_then_unknown(monkeypatch):
    data = _data(1000)
    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: 10**6 if index == 0 else None)
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: 5 * 10**5)
    plan = memory_plan(data, num_workers=1, replicas_per_worker=2, per_replica_batch_size=10)
    assert plan.memory_source == "nvml" and not plan.shared_host
    # Each GPU holds its own 500 rows.
    assert (plan.ranks[0].needed_bytes, plan.ranks[0].usable_bytes) == (500 * ROW_BYTES, 800_000)

    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: None)
    plan = memory_plan(data, num_workers=1, replicas_per_worker=2, per_replica_batch_size=10)
    # Logical CPU devices share the host's RAM: both shards count against it.
    assert plan.memory_source == "meminfo" and plan.shared_host
    assert (plan.ranks[0].needed_bytes, plan.ranks[0].usable_bytes) == (1000 * ROW_BYTES, 400_000)
    assert plan.ranks[0].bytes_per_device == 500 * ROW_BYTES
    assert plan.table().endswith(
        "fits: each worker's 2 devices share the host and need 132.81 KiB of 390.62 KiB "
        "usable (80% of 488.28 KiB free, this host's available RAM, /proc/meminfo)."
    )

    monkeypatch.setattr(_memory, "host_available_bytes", lambda: None)
    plan = memory_plan(data, num_workers=1, per_replica_batch_size=10)
    # As `_memory.memory_reports`: memory that cannot be read is not checked.
    assert plan.memory_source == "unknown" and plan.fits and plan.advice() == []
    table = plan.table()
    assert "unknown  unknown  unchecked" in table
    assert table.endswith(
        "not checked: the free device memory is unknown (no GPU through NVML, no "
        "/proc/meminfo); pass device_memory_bytes (--device-memory)."
    )


# -- advice --------------------------------------------------------------------------------


def test_advice_numbers_when_shards_do_not_fit():
    # 1,000,000 rows x 136 B over 2 devices: 68,000,000 B each; usable 40,000,000 B.
    plan = memory_plan(
        _data(1_000_000),
        num_workers=1,
        replicas_per_worker=2,
        per_replica_batch_size=256,
        device_memory_bytes=50_000_000,
    )
    assert not plan.fits
    assert [r.fits for r in plan.ranks] == [False]
    # 40,000,000 // 136 = 294,117 rows per device -> ceil(1e6 / 294,117) = 4 replicas.
    # float16 x: 64 + 8 = 72 B/row -> 500,000 x 72 = 36,000,000 B.
    # Streaming: 20,000,000 B per slot // (256 x 136 B) = 574 steps.
    assert plan.advice() == [
        "Use more replicas: with placement='shard', at least 4 replicas in total keep every "
        "device within 38.15 MiB usable, e.g. 2 worker(s) x 2 replica(s) (now 2).",
        "Store a compact dtype and cast in `transform` (x float32->float16): 34.33 MiB per "
        "device instead of 64.85 MiB, which fits in 38.15 MiB usable.",
        "Stream the shard with `LoadOptions(streaming=True)`: it keeps two double-buffered "
        "chunks per device, and chunks of up to 146,944 rows (574 steps of 256, 19.06 MiB "
        "each) fit in 38.15 MiB usable per device.",
    ]
    assert plan.table().endswith(
        "does NOT fit on rank(s) 0: each device needs at most 64.85 MiB, over 38.15 MiB "
        "usable (80% of 47.68 MiB free per device, given)."
    )


def test_advice_when_replicating_and_when_nothing_helps():
    data = {"x": ((10_000_000, 100), "float32")}  # 400 B/row, 4 GB
    plan = memory_plan(
        data,
        num_workers=8,
        per_replica_batch_size=256,
        placement="replicate",
        device_memory_bytes=4 * 10**9,
    )
    assert plan.advice() == [
        "Shard instead of replicating: with placement='shard', the current 8 replicas hold "
        "at most 1,250,000 rows (476.84 MiB) per device, within 2.98 GiB usable (2 replica(s) "
        "would do).",
        "Store a compact dtype and cast in `transform` (x float32->float16): 1.86 GiB per "
        "device instead of 3.73 GiB, which fits in 2.98 GiB usable.",
        "Streaming (`LoadOptions(streaming=True)`) needs placement='shard': each replica "
        "streams its own rows.",
    ]
    # One int64[1000] row is 8,000 B; usable is 800 B: no count of replicas, no cast helps.
    plan = memory_plan(
        {"x": ((10, 1000), "int64")},
        num_workers=1,
        per_replica_batch_size=1,
        device_memory_bytes=1000,
    )
    assert plan.advice() == [
        "One row (7.81 KiB) is larger than 800 B usable per device: no number of replicas "
        "helps; store a compact dtype.",
        "Streaming (`LoadOptions(streaming=True)`) needs two chunks of at least one step "
        "(1 rows, 7.81 KiB each), more than 800 B usable per device: lower "
        "per_replica_batch_size.",
    ]


def test_advice_when_devices_share_the_host(monkeypatch):
    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: None)
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: 50_000_000)
    plan = memory_plan(
        {"x": ((1_000_000, 17), "float64")},  # 136 B/row
        num_workers=1,
        replicas_per_worker=2,
        per_replica_batch_size=256,
    )
    assert plan.advice() == [
        "Use more workers: each worker's 2 device(s) share one host's RAM, so with "
        "placement='shard' at least 4 worker(s) keep every worker within 38.15 MiB usable "
        "(now 1).",
        "Store a compact dtype and cast in `transform` (x float64->float32): 64.85 MiB per "
        "worker instead of 129.70 MiB, which is still over 38.15 MiB usable.",
        "Stream the shard with `LoadOptions(streaming=True)`: it keeps two double-buffered "
        "chunks per device, and chunks of up to 73,472 rows (287 steps of 256, 9.53 MiB "
        "each) fit in 19.07 MiB usable per device.",
    ]


SHARED_HOST_TABLE = """\
data: 1,000 rows x 136 B/row (x: float32[32], y: int64[]) = 132.81 KiB
plan: 2 worker(s) x 1 replica(s) = 2 replica(s) on 1 host(s) of 2 worker(s); \
per_replica_batch_size=10 (global batch 20); placement='shard'; drop_remainder=False

rank  host  replicas  rows/device  bytes/device  steps/epoch  dropped rows        free      \
usable  fits
0     0     0                 500     66.41 KiB           50             0  146.48 KiB  \
117.19 KiB  NO
1     0     1                 500     66.41 KiB           50             0  146.48 KiB  \
117.19 KiB  NO

does NOT fit on rank(s) 0, 1: the 2 workers on each host (2 devices) share its RAM and need \
132.81 KiB, over 117.19 KiB usable (80% of 146.48 KiB free, this host's available RAM, \
/proc/meminfo).\
"""


def test_workers_on_one_host_share_its_ram(monkeypatch):
    # 1,000 rows x 136 B over 2 workers: 68,000 B each, 136,000 B together; usable 120,000 B.
    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: None)
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: 150_000)
    kwargs = {"num_workers": 2, "per_replica_batch_size": 10}
    apart = memory_plan(_data(1000), **kwargs)
    # Each rank alone fits; the plan says what it assumed about hosts.
    assert apart.fits and [r.needed_bytes for r in apart.ranks] == [68_000, 68_000]
    assert apart.table().endswith(
        "Assumed one worker per host; pass workers_per_host (--workers-per-host) when "
        "several share one."
    )
    together = memory_plan(_data(1000), workers_per_host=2, **kwargs)
    assert not together.fits
    assert [(r.host, r.needed_bytes, r.usable_bytes) for r in together.ranks] == [
        (0, 136_000, 120_000),
        (0, 136_000, 120_000),
    ]
    assert together.table() == SHARED_HOST_TABLE
    # max rows per host: 120,000 // 136 = 882 -> 2 hosts of 2 workers hold 500 rows each.
    # Streaming: 120,000 B over the host's 2 devices, 30,000 B per slot // 1,360 B = 22 steps.
    assert together.advice() == [
        "Use more hosts: the 2 workers on a host (2 device(s)) share its RAM, so with "
        "placement='shard' at least 2 host(s) of 2 worker(s) keep every host within "
        "117.19 KiB usable (now 1).",
        "Store a compact dtype and cast in `transform` (x float32->float16): 70.31 KiB per "
        "host instead of 132.81 KiB, which fits in 117.19 KiB usable.",
        "Stream the shard with `LoadOptions(streaming=True)`: it keeps two double-buffered "
        "chunks per device, and chunks of up to 220 rows (22 steps of 10, 29.22 KiB each) fit "
        "in 58.59 KiB usable per device.",
    ]
    # With GPUs each worker has its own device: host-mates do not add up.
    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: 150_000)
    gpus = memory_plan(_data(1000), workers_per_host=2, **kwargs)
    assert gpus.fits and [r.needed_bytes for r in gpus.ranks] == [68_000, 68_000]


def test_cli_workers_per_host_flag_and_launcher_default(monkeypatch, capsys):
    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: None)
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: 150_000)
    monkeypatch.delenv("SHARDFEED_LOCAL_SIZE", raising=False)
    argv = ["--num-workers=2", "--per-replica-batch-size=10", "x=1000x32:float32", "y=1000:int64"]
    assert _plan_cli(capsys, *argv)[0] == 0
    code, out, _ = _plan_cli(capsys, *argv, "--workers-per-host=2")
    assert code == 1 and out.startswith(SHARED_HOST_TABLE + "\n\nto make it fit:\n- Use more hosts")
    # Inside a launched job the launcher's count is the default (capped at the workers).
    monkeypatch.setenv("SHARDFEED_LOCAL_SIZE", "4")
    assert _plan_cli(capsys, *argv)[0] == 1
    assert _plan_cli(capsys, *argv, "--workers-per-host=1")[0] == 0


def test_memory_reports_give_each_local_worker_its_share_of_the_host(monkeypatch):
    # The dataset's in-process check: two workers on one CPU host each read the
    # same available RAM, so each may use half of it.
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: 1000)
    monkeypatch.delenv("SHARDFEED_LOCAL_SIZE", raising=False)
    needed = {"/job:worker/replica:0/task:0/device:CPU:0": 300}
    (alone,) = _memory.memory_reports(needed, 0.5)
    assert (alone.usable_bytes, alone.workers_on_host, alone.fits) == (500, 1, True)
    monkeypatch.setenv("SHARDFEED_LOCAL_SIZE", "2")
    (shared,) = _memory.memory_reports(needed, 0.5)
    assert (shared.usable_bytes, shared.workers_on_host, shared.fits) == (250, 2, False)
    assert shared.numbers() == (
        "needed_bytes=300 (0.00 GiB), free_bytes=1,000 (0.00 GiB, from meminfo), "
        "usable_bytes=250 (this worker's share: 2 workers share the host)"
    )
    # A GPU is the worker's own, and given sizes are per device: no share taken.
    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: 1000)
    (gpu,) = _memory.memory_reports({"/device:GPU:0": 300}, 0.5)
    (given,) = _memory.memory_reports(needed, 0.5, device_memory_bytes=1000)
    assert (gpu.usable_bytes, gpu.fits, given.usable_bytes, given.fits) == (500, True, 500, True)


# -- sizes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("17179869184", 16 * GIB),  # plain bytes
        ("16GiB", 16 * GIB),
        ("16 gib", 16 * GIB),  # units are case-insensitive; a space is fine
        ("1.5GiB", 1536 * 1024**2),  # exact, not through a float
        (".5KiB", 512),
        ("80GB", 80 * 10**9),  # KB/MB/GB/TB are powers of 1000
        ("1KB", 1000),
        ("2MiB", 2 * 1024**2),
        ("1TiB", 1024**4),
        ("3TB", 3 * 10**12),
        ("512B", 512),
        ("1.0009KB", 1000),  # a fraction of a byte is dropped
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "0", "0GiB", "1.5", "16 gigs", "-1GiB", "GiB", "1e9", "0.1B"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError) as err:
        parse_size(text, "--device-memory")
    assert str(err.value) == (
        "A memory size must be a positive whole number of bytes, or a number with a unit: "
        "KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000). "
        f"Received: --device-memory={text!r}. Write e.g. `16GiB`, `80GB` or `17179869184`."
    )


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 16 * GIB, 3 * 1024**5)] == [
        "0 B",
        "1023 B",
        "1.00 KiB",
        "1.50 KiB",
        "16.00 GiB",
        "3.00 PiB",
    ]


# -- validation: the same checks and words as `_sources.columns_from_arrays` ---------------


@pytest.mark.parametrize(
    "x",
    [
        np.array([None, 1], dtype=object),
        np.array(["a", "b"]),
        np.array(3.0),
        [np.zeros(3), np.zeros(4)],
        np.zeros((0, 3)),
        object(),
        "abc",
        {},
        None,
    ],
)
def test_validation_matches_the_dataset(x):
    from shardfeed._data.sources import columns_from_arrays  # imports Keras; fine in tests

    with pytest.raises((TypeError, ValueError)) as expected:
        columns_from_arrays(x)
    with pytest.raises(type(expected.value)) as got:
        memory_plan(x, num_workers=1, per_replica_batch_size=1, device_memory_bytes=GIB)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (
            {"num_workers": 0},
            "`num_workers` must be an integer >= 1. Received: num_workers=0. Pass the number "
            "of workers (ranks), e.g. 4.",
        ),
        (
            {"replicas_per_worker": 0},
            "`replicas_per_worker` must be an integer >= 1. Received: replicas_per_worker=0. "
            "Pass the devices per worker, e.g. 8.",
        ),
        (
            {"per_replica_batch_size": 0},
            "`per_replica_batch_size` must be an integer >= 1. Received: "
            "per_replica_batch_size=0. Pass a batch size such as 256.",
        ),
        (
            {"memory_fraction": 0.0},
            "`memory_fraction` must be in (0, 1]. Received: memory_fraction=0.0. Use e.g. 0.8 "
            "to leave 20% of free memory for the model.",
        ),
        (
            {"device_memory_bytes": 0},
            "`device_memory_bytes` must be None or a positive integer. Received: "
            "device_memory_bytes=0. Pass the free bytes per device, e.g. 80 * 1024**3.",
        ),
        (
            {"placement": "mirror"},
            "`placement` must be one of ('shard', 'replicate'). Received: placement='mirror'. "
            'Use "shard" to split rows across replicas or "replicate" to give every replica '
            "all rows.",
        ),
        (
            {"workers_per_host": 0},
            "`workers_per_host` must be an integer >= 1. Received: workers_per_host=0. "
            "Pass the workers started on each host, e.g. 1.",
        ),
        (
            {"workers_per_host": 2},
            "`workers_per_host` must be at most `num_workers`. Received: workers_per_host=2, "
            "num_workers=1. Pass the workers started on each host (all of them: num_workers).",
        ),
        (  # a batch larger than the data trains one short step; fewer rows than replicas
            {"per_replica_batch_size": 4, "num_workers": 11},
            "A training epoch needs at least one step with a real row on every replica. "
            "Received: per_replica_batch_size=4, num_replicas=11, num_rows=10, "
            "placement='shard'. Use at most 10 replica(s) (each needs a row in a step), or "
            "more rows.",
        ),
    ],
)
def test_function_errors(kwargs, error):
    args = {"num_workers": 1, "per_replica_batch_size": 2, "device_memory_bytes": GIB} | kwargs
    with pytest.raises(ValueError) as err:
        memory_plan({"x": ((10,), "int8")}, **args)
    assert str(err.value) == error


def test_described_array_errors():
    with pytest.raises(ValueError) as err:
        memory_plan({"x": ((10, -1), "int8")}, num_workers=1, per_replica_batch_size=1)
    assert str(err.value) == (
        "A described array must be `(shape, dtype)` with a shape of whole numbers. Received: "
        "x=((10, -1), 'int8'). Write e.g. `{'x': ((1000000, 32), 'float32'), 'y': "
        "((1000000,), 'int64')}`."
    )
    with pytest.raises(TypeError) as err:
        memory_plan({"x": ((10,), "floot")}, num_workers=1, per_replica_batch_size=1)
    assert str(err.value) == (
        "A described array's dtype must be a NumPy dtype. Received: x.dtype='floot'. Use "
        "e.g. 'float32', 'float16', 'int64', 'uint8' or 'bool'."
    )


# -- command line --------------------------------------------------------------------------

NPY_TABLE = """\
data: 1,001 rows x 136 B/row (x: float32[32], y: int64[]) = 132.95 KiB
plan: 3 worker(s) x 1 replica(s) = 3 replica(s); per_replica_batch_size=100 (global batch 300); \
placement='shard'; drop_remainder=False

rank  replicas  rows/device  bytes/device  steps/epoch  dropped rows       free     usable  fits
0     0                 334     44.36 KiB            4             0  16.00 GiB  12.80 GiB  yes
1     1                 334     44.36 KiB            4             0  16.00 GiB  12.80 GiB  yes
2     2                 333     44.23 KiB            4             0  16.00 GiB  12.80 GiB  yes

fits: each device needs at most 44.36 KiB of 12.80 GiB usable (80% of 16.00 GiB free per \
device, given).
"""

SHAPE_TABLE = """\
data: 1,000,000,000 rows x 136 B/row (x: float32[32], y: int64[]) = 126.66 GiB
plan: 2 worker(s) x 2 replica(s) = 4 replica(s); per_replica_batch_size=256 (global batch \
1,024); placement='shard'; drop_remainder=True

rank  replicas  rows/device  bytes/device  steps/epoch  dropped rows       free     usable  fits
0     0-1       250,000,000     31.66 GiB      976,562           256  16.00 GiB  12.80 GiB  NO
1     2-3       250,000,000     31.66 GiB      976,562           256  16.00 GiB  12.80 GiB  NO

does NOT fit on rank(s) 0, 1: each device needs at most 31.66 GiB, over 12.80 GiB usable (80% \
of 16.00 GiB free per device, given).

to make it fit:
- Use more replicas: with placement='shard', at least 10 replicas in total keep every device \
within 12.80 GiB usable, e.g. 5 worker(s) x 2 replica(s) (now 4).
- Store a compact dtype and cast in `transform` (x float32->float16): 16.76 GiB per device \
instead of 31.66 GiB, which is still over 12.80 GiB usable.
- Stream the shard with `LoadOptions(streaming=True)`: it keeps two double-buffered chunks per \
device, and chunks of up to 50,529,024 rows (197,379 steps of 256, 6.40 GiB each) fit in \
12.80 GiB usable per device.
"""


def _plan_cli(capsys, *argv: str) -> tuple[int, str, str]:
    if not any(a.startswith("--shuffle") for a in argv):
        argv = (*argv, "--shuffle=local")  # staging is checked on its own below
    code = _cli.main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_table_for_an_npy_file_fits(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((1001, 32), "float32"))
    code, out, err = _plan_cli(
        capsys,
        "--num-workers=3",
        "--per-replica-batch-size=100",
        "--device-memory=16GiB",
        f"x={tmp_path / 'x.npy'}",
        "y=1001:int64",
    )
    assert (code, err) == (0, "")
    assert out == NPY_TABLE


def test_cli_table_for_shape_specs_that_do_not_fit(capsys):
    code, out, err = _plan_cli(
        capsys,
        "--num-workers=2",
        "--replicas-per-worker=2",
        "--per-replica-batch-size=256",
        "--drop-remainder",
        "--device-memory=16GiB",
        "x=1000000000x32:float32",
        "y=1000000000:int64",
    )
    assert (code, err) == (1, "")
    assert out == SHAPE_TABLE


def test_cli_memory_fraction_and_placement(capsys):
    argv = ["--num-workers=1", "--per-replica-batch-size=10", "x=1000x1000:uint8"]
    # 1,000,000 B of rows on one device, and as much again for the rows one
    # replica's compiled calls gather at once (the whole epoch's, under 32 MiB):
    # fits in 2.5 MB x 0.8, not in 2 MB x 0.8.
    assert _plan_cli(capsys, *argv, "--device-memory=2.5MB")[0] == 0
    assert _plan_cli(capsys, *argv, "--device-memory=2MB")[0] == 1
    assert _plan_cli(capsys, *argv, "--device-memory=2MB", "--memory-fraction=1")[0] == 0
    code, out, _ = _plan_cli(
        capsys, "--num-workers=2", "--per-replica-batch-size=10", "--placement=replicate",
        "--device-memory=1MB", "x=1000x500:uint8",
    )  # fmt: skip
    # Replicated: each device holds all 1,000 rows; 50 global batches of 2 x 10.
    assert (
        code == 0
        and (
            "0     0               1,000    488.28 KiB           50             0  976.56 KiB  "
            "781.25 KiB  yes"
        )
        in out.splitlines()
    )


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (
            "x",
            "Each input must be written `name=path` or `name=SHAPE:DTYPE`. Received: input='x'. "
            "Write e.g. `x=train_x.npy` or `x=1000000x32:float32 y=1000000:int64`.",
        ),
        (
            "=10:int8",
            "Each input must be written `name=path` or `name=SHAPE:DTYPE`. Received: "
            "input='=10:int8'. Write e.g. `x=train_x.npy` or `x=1000000x32:float32 "
            "y=1000000:int64`.",
        ),
        (
            "x=10xx3:float32",
            "A shape input must be `name=ROWSxD1x...:DTYPE` with whole numbers. Received: "
            "input='x=10xx3:float32'. Write e.g. `x=1000000x32:float32` or `y=1000000:int64`.",
        ),
        (
            "x=10x3",  # no dtype
            "A shape input must be `name=ROWSxD1x...:DTYPE` with whole numbers. Received: "
            "input='x=10x3'. Write e.g. `x=1000000x32:float32` or `y=1000000:int64`.",
        ),
        (
            "x=10:floot32",
            "A described array's dtype must be a NumPy dtype. Received: x.dtype='floot32'. "
            "Use e.g. 'float32', 'float16', 'int64', 'uint8' or 'bool'.",
        ),
        (
            "x=10:U5",
            "Resident data must be numeric (bool, integer, float or complex). Received: "
            "x.dtype=<U5. Encode strings or records as numbers (e.g. a vocabulary lookup) "
            "before building the dataset.",
        ),
        (
            "x=0x3:float32",
            "A dataset needs at least one row. Received: num_rows=0. Check how the arrays "
            "were loaded or filtered.",
        ),
        (
            "x=data.txt",
            "An input must be a .npy file, or `file.npz:key`, `file.h5:dataset` or "
            "`file.parquet:column`. Received: input='x=data.txt'. Name the array inside .npz, "
            "HDF5 and Parquet files after a colon.",
        ),
        (
            "x=missing.npy",
            "The data file must exist and be a regular file. Received: path='missing.npy'. "
            f"Check the path (relative paths start at the current directory, {os.getcwd()!r}).",
        ),
    ],
)
def test_cli_spec_errors(capsys, spec, error):
    code, out, err = _plan_cli(capsys, "--num-workers=1", "--per-replica-batch-size=1", spec)
    assert (code, out) == (2, "")
    assert err == f"shardfeed plan: error: {error}\n"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["--device-memory=16 gigs", "x=10:int8"],
            "A memory size must be a positive whole number of bytes, or a number with a unit: "
            "KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000). Received: "
            "--device-memory='16 gigs'. Write e.g. `16GiB`, `80GB` or `17179869184`.",
        ),
        (
            ["x=10:int8", "x=10:int8"],
            "Each input needs its own name. Received: name='x' given twice. Rename one of the "
            "inputs.",
        ),
        (
            ["x=10:int8", "y=11:int8"],
            "All arrays must have the same number of rows. Received: x has 10, y has 11. Trim "
            "or align the arrays so each row of x has its y (and sample_weight).",
        ),
        (
            ["--memory-fraction=1.5", "x=10:int8"],
            "`memory_fraction` must be in (0, 1]. Received: memory_fraction=1.5. Use e.g. 0.8 "
            "to leave 20% of free memory for the model.",
        ),
        (
            ["--replicas-per-worker=0", "x=10:int8"],
            "`replicas_per_worker` must be an integer >= 1. Received: replicas_per_worker=0. "
            "Pass the devices per worker, e.g. 8.",
        ),
        (
            ["--num-workers=11", "x=10:int8"],
            "A training epoch needs at least one step with a real row on every replica. "
            "Received: per_replica_batch_size=1, num_replicas=11, num_rows=10, "
            "placement='shard'. Use at most 10 replica(s) (each needs a row in a step), or "
            "more rows.",
        ),
    ],
)
def test_cli_argument_errors(capsys, argv, error):
    code, out, err = _plan_cli(capsys, "--num-workers=1", "--per-replica-batch-size=1", *argv)
    assert (code, out) == (2, "")
    assert err == f"shardfeed plan: error: {error}\n"


def test_cli_missing_required_argument_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["plan", "x=10:int8"])
    assert exit_info.value.code == 2
    assert "shardfeed plan: error: the following arguments are required: --num-workers" in (
        capsys.readouterr().err
    )


def test_plan_runs_without_tensorflow():
    code = (
        "import sys\n"
        "from shardfeed._commands import cli as _cli\n"
        "status = _cli.main(['plan', '--num-workers=2', '--per-replica-batch-size=8',\n"
        "                    '--device-memory=1GiB', 'x=1000x4:float32'])\n"
        "print(status, 'tensorflow' in sys.modules, 'keras' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "0 False False"
    assert "tensorflow" not in _memplan.__dict__


def test_global_shuffle_counts_the_exchange_staging_per_device():
    data = {"x": ((1001, 32), "float32")}
    args = dict(num_workers=2, replicas_per_worker=2, per_replica_batch_size=10,
                device_memory_bytes=GIB)
    local = _memory_plan(data, shuffle="local", **args)
    assert all(r.staging_bytes == 0 for r in local.ranks)
    # Largest shard: 251 rows x 128 B; an all-gather round may stage 5 of them.
    full = _memory_plan(data, **args)
    assert [r.staging_bytes for r in full.ranks] == [5 * 251 * 128] * 2
    assert full.ranks[0].needed_bytes == 251 * 128 + 5 * 251 * 128
    capped = _memory_plan(data, exchange_buffer_bytes=1000, **args)
    assert capped.ranks[0].needed_bytes == 251 * 128 + 1000
    assert "shuffle=True: the per-epoch exchange stages up to" in capped.table()
    one = _memory_plan(data, num_workers=1, per_replica_batch_size=10, device_memory_bytes=GIB)
    assert one.ranks[0].staging_bytes == 0  # one replica: nothing to exchange
    # Rows in order move once (to follow one replica's batches): the same staging.
    in_order = _memory_plan(data, shuffle=False, exchange_buffer_bytes=1000, **args)
    assert in_order.ranks[0].needed_bytes == 251 * 128 + 1000
    assert "shuffle=False: the exchange (once) stages up to" in in_order.table()


def test_cli_shuffle_flag_and_exchange_buffer(capsys):
    argv = ["--num-workers=2", "--per-replica-batch-size=10", "x=1000x32:float32",
            "--device-memory=200KB", "--memory-fraction=1"]
    assert _plan_cli(capsys, *argv, "--shuffle=local")[0] == 0  # 64 KB shards fit
    code, out, _ = _plan_cli(capsys, *argv, "--shuffle=global")
    assert code == 1 and "stages up to" in out  # + 192 KB of staging does not
    assert _plan_cli(capsys, *argv, "--shuffle=global", "--exchange-buffer=100KB")[0] == 0
    code, out, _ = _plan_cli(capsys, *argv, "--shuffle=none")
    assert code == 1 and "exchange_buffer_bytes" in out  # rows in order stage as well
    assert "Streamed on TensorFlow, each replica takes its own shard's rows in order" in out
    assert _plan_cli(capsys, *argv, "--shuffle=none", "--exchange-buffer=100KB")[0] == 0


@pytest.mark.tensorflow
def test_the_memory_plan_imports_one_way_even_for_type_checking():
    """`lint-imports` leaves `TYPE_CHECKING` imports out (pyproject.toml); a loop
    hidden behind one would still be a loop. Here they count: the plan uses
    the words, the words read the numbers, and nothing imports back."""
    import grimp  # import-linter's graph builder (requirements-ci.txt)

    graph = grimp.build_graph("shardfeed", exclude_type_checking_imports=False, cache_dir=None)
    down = ["shardfeed._data.memplan", "shardfeed._data.memadvice", "shardfeed._data.memnumbers"]
    for i, upper in enumerate(down):
        for lower in down[i + 1 :]:
            assert graph.chain_exists(importer=upper, imported=lower)
            assert not graph.chain_exists(importer=lower, imported=upper), (lower, upper)


def test_advice_when_the_global_shuffle_staging_does_not_fit(monkeypatch):
    """Was: "at least 1 host(s) (now 1)", `streaming=True` (which the global
    shuffle refuses) and never shuffle="local". Every option is planned again."""
    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: None)
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: 400 * 2**20)
    data = _data(1_000_000)  # 136 MB
    # A buffer given, not "auto" (sized to the shard, it would fit as it is).
    args = dict(per_replica_batch_size=256, workers_per_host=2)
    given = dict(exchange_buffer_bytes=256 * 2**20)
    assert _memory_plan(data, num_workers=2, **args).fits
    plan = _memory_plan(data, num_workers=2, **given, **args)
    assert not plan.fits and plan.ranks[0].staging_bytes > 0
    assert plan.advice() == [
        "Use more hosts: with shuffle=True (its exchange stages up to 142.67 MiB per device "
        "then), 5 host(s) are the fewest that fit: 311.28 MiB per host, which fits in "
        "320.00 MiB usable (now 1).",
        'Pass shuffle="local" (each replica shuffles its own rows; no exchange, no '
        "staging): 129.70 MiB per host, which fits in 320.00 MiB usable.",
        "Lower `LoadOptions.exchange_buffer_bytes` to 99,614,720 (95.00 MiB; now "
        "268,435,456): 319.70 MiB per host, which fits in 320.00 MiB usable; a smaller "
        "buffer means more exchange rounds per epoch.",
        "Store a compact dtype and cast in `transform` (x float32->float16): 274.66 MiB "
        "per host, which fits in 320.00 MiB usable (now 518.80 MiB).",
    ]
    # What the advice says fits does, and one less does not.
    assert _memory_plan(data, num_workers=10, **given, **args).fits
    assert not _memory_plan(data, num_workers=8, **given, **args).fits
    assert _memory_plan(data, num_workers=2, shuffle="local", **given, **args).fits
    assert _memory_plan(data, num_workers=2, exchange_buffer_bytes=99_614_720, **args).fits
    assert not _memory_plan(data, num_workers=2, exchange_buffer_bytes=100 * 2**20, **args).fits
    assert not any("streaming=True" in line for line in plan.advice())


def test_advice_when_no_count_of_workers_fits_the_staging(monkeypatch):
    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: None)
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: 100 * 2**20)
    data = _data(1_000_000)
    plan = _memory_plan(data, num_workers=2, per_replica_batch_size=256,
                        exchange_buffer_bytes=256 * 2**20)
    advice = plan.advice()
    assert advice[0] == (
        "More workers do not make it fit with shuffle=True: each device also stages the "
        "exchange's buffer (now 194.55 MiB, at most exchange_buffer_bytes=268,435,456), "
        "which more workers do not shrink enough."
    )
    assert advice[1].startswith('Pass shuffle="local"') and "which fits in" in advice[1]
    # Neither the local shuffle nor a smaller buffer: streaming, with the local shuffle.
    tight = _memory_plan(data, num_workers=2, per_replica_batch_size=256,
                         device_memory_bytes=40 * 2**20)
    lines = tight.advice()
    assert lines[-1].startswith(
        'With shuffle="local" (the global shuffle cannot stream), stream the shard with '
        "`LoadOptions(streaming=True)`"
    )
    assert _memory_plan(data, num_workers=2, per_replica_batch_size=256, shuffle="local",
                        device_memory_bytes=40 * 2**20).advice()[-1].startswith("Stream the")


@pytest.mark.tensorflow
def test_one_replica_counts_the_rows_its_calls_gather_at_once():
    # One replica's compiled calls gather their steps' rows in one go, at most
    # 32 MiB (whole steps), at most an epoch's: the plan and the dataset count them.
    step_bytes = 256 * ROW_BYTES
    steps = _memory.CALL_ROWS_BYTES // step_bytes
    big = memory_plan(_data(10**6), num_workers=1, per_replica_batch_size=256,
                      device_memory_bytes=64 * GIB)  # fmt: skip
    assert big.ranks[0].needed_bytes == 10**6 * ROW_BYTES + steps * step_bytes
    assert steps * step_bytes <= _memory.CALL_ROWS_BYTES < (steps + 1) * step_bytes
    small = memory_plan(_data(1000), num_workers=1, per_replica_batch_size=256,
                        device_memory_bytes=GIB)  # fmt: skip
    assert small.ranks[0].needed_bytes == 1000 * ROW_BYTES + 4 * step_bytes  # 4 steps
    # Several replicas gather step by step: nothing more.
    two = memory_plan(_data(1000), num_workers=2, per_replica_batch_size=256,
                      device_memory_bytes=GIB)  # fmt: skip
    assert [r.needed_bytes for r in two.ranks] == [500 * ROW_BYTES] * 2
    x = np.zeros((1000, 32), np.float32)
    y = np.zeros(1000, np.int64)
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=256, shuffle=False)
    assert ds.memory_reports[0].needed_bytes == small.ranks[0].needed_bytes


def test_the_positions_are_device_memory(monkeypatch):
    """Each replica's int32 positions (steps x batch) live on its device, GPU
    or CPU: the plan and the dataset count them (on a GPU they were left out)."""
    monkeypatch.setattr(_memory, "POSITION_BYTES", 4)
    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: 10**9)
    gpus = memory_plan(_data(1000), num_workers=1, replicas_per_worker=2,
                       per_replica_batch_size=10)  # fmt: skip
    assert gpus.ranks[0].needed_bytes == 500 * ROW_BYTES + 50 * 10 * 4
    x = np.zeros((1000, 32), np.float32)
    y = np.zeros(1000, np.int64)
    ds = shardfeed.ShardedResidentDataset(
        x, y, per_replica_batch_size=10, shuffle=False,
        load_options=shardfeed.LoadOptions(device_memory_bytes=10**9, epoch_copy=False),
    )  # fmt: skip
    # Plus the rows one replica's calls gather at once (TensorFlow: here an epoch's;
    # JAX gathers its batches from the rows).
    gathered = 0 if os.environ.get("KERAS_BACKEND") == "jax" else 1000 * ROW_BYTES
    assert ds.memory_reports[0].needed_bytes == 1000 * ROW_BYTES + gathered + 100 * 10 * 4


def test_cpu_devices_count_the_hosts_index_arrays(monkeypatch):
    """On CPU devices the host's per-row index arrays share the rows' memory:
    the plan and the dataset count them (without them the plan read 0.90x
    the measured peak of a global order on 2 JAX devices); on GPUs, or with
    the device's memory given, they do not."""
    monkeypatch.setattr(_memory, "HOST_INDEX_BYTES_PER_ROW", 16)
    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: None)
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: 10**9)
    on_host = memory_plan(_data(1000), num_workers=1, replicas_per_worker=2,
                          per_replica_batch_size=10)  # fmt: skip
    assert on_host.ranks[0].needed_bytes == 1000 * (ROW_BYTES + 16)
    given = memory_plan(_data(1000), num_workers=1, replicas_per_worker=2,
                        per_replica_batch_size=10, device_memory_bytes=10**9)  # fmt: skip
    assert given.ranks[0].needed_bytes == 500 * ROW_BYTES
    monkeypatch.setattr(_memory, "gpu_free_bytes", lambda index: 10**9)
    gpus = memory_plan(_data(1000), num_workers=1, replicas_per_worker=2,
                       per_replica_batch_size=10)  # fmt: skip
    assert gpus.ranks[0].needed_bytes == 500 * ROW_BYTES
    x = np.zeros((1000, 32), np.float32)
    y = np.zeros(1000, np.int64)
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=10, shuffle=False)
    # Plus the rows one replica's calls gather at once (here an epoch's).
    assert ds.memory_reports[0].needed_bytes == 1000 * (ROW_BYTES + 16) + 1000 * ROW_BYTES
