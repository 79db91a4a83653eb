"""`shardfeed bench --engines` at its smallest scale: every engine's numbers,
their table, and that the engines train the bench's W2 workload."""

from __future__ import annotations

import json
import math
import subprocess
import time

import pytest
from _helpers_procs import is_gone

import shardfeed
from shardfeed._commands.bench import engines as _engines
from shardfeed._commands.bench.workloads import WORKLOADS, build_model, compile_model, make_data
from shardfeed._commands.cli import main

EPOCHS = 1
# (workers, replicas) per engine
SHAPES = {"single": (1, 1), "mirrored": (1, 2), "multiworker": (2, 2), "horovod": (2, 2)}


def _rows(workload: str) -> int:
    """The smallest run that gives 2 replicas a full step: batches are dropped, not padded."""
    return _engines.REPLICAS * WORKLOADS[workload].batch_size


def _loss_on_one_device(workload: str) -> float:
    """What the single-device worker should report, trained here directly."""
    w = WORKLOADS[workload]
    x, y = make_data(w, _rows(workload), seed=0)
    model = compile_model(build_model(w, False, seed=0), w)
    dataset = shardfeed.ShardedResidentDataset(
        x, y, per_replica_batch_size=w.batch_size, seed=0, drop_remainder=True
    )
    return shardfeed.fit(model, dataset, epochs=EPOCHS + 1, verbose=0).history["loss"][-1]


@pytest.mark.slow
@pytest.mark.multi_process
@pytest.mark.parametrize(
    "workload, bytes_sent",
    [
        # CI time: W2 (every dense gradient, 4 * 6337 bytes) was dropped; the
        # engines' dense allreduce is checked by every multi-process fit test.
        # W5: 64 rows of each Embedding (50, 50, 1, 1 wide), an int32 index per
        # row and a row count per table; never the 9,724 x 50 table.
        ("W5", 4 * (64 * (51 + 51 + 2 + 2) + 4)),
    ],
)
def test_engines_bench_times_every_engine_at_smallest_scale(workload, bytes_sent):
    rows = _rows(workload)
    batch = WORKLOADS[workload].batch_size
    results = _engines.run_engines(
        rows, EPOCHS, horovod_python=None, timeout_s=300, workload=workload
    )

    assert [r["engine"] for r in results] == list(_engines.ENGINES)
    for r in results:
        assert r["workload"] == workload, r
        if r["engine"] == "horovod" and "skipped" in r:  # runs only in the Horovod tier
            assert r["skipped"].startswith("horovodrun not installed here"), r
            continue
        assert "skipped" not in r, r
        workers, replicas = SHAPES[r["engine"]]
        assert (r["workers"], r["replicas"]) == (workers, replicas), r
        assert r["global_batch_size"] == replicas * batch, r
        assert r["steps_per_epoch"] == rows // r["global_batch_size"], r
        assert r["ms_per_step"] > 0 and r["warmup_s"] > 0 and r["x_single"] > 0, r
        assert r["epoch_s"] > 0, r
        assert r["gradient_bytes_per_step"] == bytes_sent, r
        assert math.isfinite(r["final_loss"]) and r["final_loss"] > 0, r
    single = results[0]
    assert single["x_single"] == 1.0
    assert single["final_loss"] == pytest.approx(_loss_on_one_device(workload), rel=1e-4)

    table = _engines.to_markdown(results, rows, EPOCHS, workload).splitlines()
    assert table[0] == (
        f"### Engines: {workload} model, {rows} rows, per-replica batch {batch}, "
        f"median of {EPOCHS} epochs"
    )
    assert table[4].startswith(f"| single | 1 x 1 | {batch} | ") and " | 1.00x | 0 | " in table[4]
    assert table[5].startswith(f"| mirrored | 1 x 2 | {2 * batch} | ")
    assert f" | {bytes_sent:,} | " in table[5]
    assert table[6].startswith(f"| multiworker | 2 x 1 | {2 * batch} | ")
    assert len(table) == 4 + len(_engines.ENGINES)


def test_bench_engines_flag_adds_the_engines_to_json_and_markdown(tmp_path, monkeypatch, capsys):
    calls = []
    fake = [
        {
            "engine": "single",
            "replicas": 1,
            "workers": 1,
            "global_batch_size": 256,
            "steps_per_epoch": 2,
            "epoch_s": 0.004,
            "warmup_s": 1.5,
            "ms_per_step": 2.0,
            "gradient_bytes_per_step": 25348,
            "final_loss": 1.0,
            "x_single": 1.0,
        },
        {"engine": "horovod", "skipped": "horovodrun not installed here"},
    ]

    def run_engines(rows, epochs, horovod_python, workload):
        calls.append((rows, epochs, horovod_python, workload))
        return fake

    monkeypatch.setattr(_engines, "run_engines", run_engines)
    argv = ["bench", "--workloads", "W2", "--variants", "floor", "--rows-scale", "0.0005"]
    argv += ["--epochs", "1", "--engines", "--engine-rows", "512", "--out", str(tmp_path)]
    assert main(argv) == 0

    assert calls == [(512, 1, None, "W2")]
    assert json.loads((tmp_path / "bench.json").read_text())["engines"] == fake
    markdown = (tmp_path / "bench.md").read_text()
    assert "### Engines: W2 model, 512 rows, per-replica batch 256, median of 1 epochs" in markdown
    assert "| single | 1 x 1 | 256 | 2.000 | 0.00 | 1.00x | 0 | 1.50 |" in markdown
    assert "| horovod | skipped: horovodrun not installed here |||||||" in markdown
    assert markdown in capsys.readouterr().out


def test_engine_past_its_timeout_has_every_process_killed(tmp_path, monkeypatch):
    # A launcher stand-in that starts a worker and waits for it, as
    # `shardfeed launch` and horovodrun do.
    pid_file = tmp_path / "worker.pid"
    launcher = ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"]
    monkeypatch.setattr(_engines, "_command", lambda *a: launcher)
    with pytest.raises(subprocess.TimeoutExpired):
        _engines.run_engines(_rows("W2"), EPOCHS, horovod_python=None, timeout_s=1)
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not is_gone(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert is_gone(worker), "the worker outlived its engine's timeout"


def test_shuffles_table_reports_the_exchange_beside_local_and_replicate():
    from shardfeed._commands.bench import shuffles as _shuffles

    row = {"epoch_s": 2.0, "exchange_s": 0.5, "gb_per_s": 0.01, "exchange_share": 0.25}
    setups = [
        {
            "setup": "mirrored2",
            "replicas": 2,
            "results": [
                {"placement": "shard", "shuffle": True, "bytes_sent_per_replica": 5_000_000,
                 "bytes_per_replica": 7_000_000, **row},
                {"placement": "shard", "shuffle": True, "bytes_sent_per_replica": 5_000_000,
                 "bytes_per_replica": 6_100_000, **row, "exchange_s": 0.9,
                 "exchange_buffer_bytes": 2**20, "rounds": 19},
                {"placement": "shard", "shuffle": "local", "bytes_sent_per_replica": 0,
                 "bytes_per_replica": 6_000_000, **row, "exchange_s": 0.0, "gb_per_s": 0.0,
                 "exchange_share": 0.0},
                {"placement": "replicate", "shuffle": True, "bytes_sent_per_replica": 0,
                 "bytes_per_replica": 12_000_000, **row, "exchange_s": 0.0, "gb_per_s": 0.0,
                 "exchange_share": 0.0},
            ],
        },
        {"setup": "multiworker2", "skipped": "failed (exit 1): boom"},
    ]
    table = _shuffles.to_markdown(setups, 1000, 2).splitlines()
    assert table[0] == (
        "### Shuffles: W2 model, 1,000 rows, per-replica batch 256, median of 2 epochs"
    )
    assert table[4] == "| mirrored2 | shard, global | 2.000 | 5.00 | 0.500 | 0.01 | 25% | 7.00 |"
    assert table[5] == (  # the same exchange in many rounds
        "| mirrored2 | shard, global, 1 MiB buffer (19 rounds) | 2.000 | 5.00 | 0.900 | 0.01 "
        "| 25% | 6.10 |"
    )
    assert table[6] == "| mirrored2 | shard, local | 2.000 | 0.00 | 0.000 | 0.00 | 0% | 6.00 |"
    assert table[7] == "| mirrored2 | replicate | 2.000 | 0.00 | 0.000 | 0.00 | 0% | 12.00 |"
    assert table[8] == "| multiworker2 | skipped: failed (exit 1): boom ||||||"
