"""`shardfeed demo` at its smallest scale: its table's numbers (the whole fit
included), that Keras' `model.fit` on the resident dataset trains the
bench's W2 workload (one rule for the data and the model), and that TensorFlow's
start-up lines stay out of its output."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

import shardfeed
from shardfeed._commands.bench.workloads import WORKLOADS, build_model, compile_model, make_data
from shardfeed._commands.cli import main

ROWS, EPOCHS, BATCH = 512, 2, 256  # two steps per epoch; two epochs give a "later epoch"
NUMBER = r" \| ([0-9.]+)"
ROW = re.compile(
    rf"^\| (model\.fit\(ShardedResidentDataset\)|model\.fit\(x, y\)){NUMBER * 4} \|$", re.M
)


def test_demo_prints_its_table_for_the_w2_workload(capsys):
    argv = ["demo", "--rows", str(ROWS), "--epochs", str(EPOCHS), "--batch-size", str(BATCH)]
    assert main(argv) == 0
    out = capsys.readouterr().out

    head = f"shardfeed demo: {ROWS} rows x 32 float32, MLP 64-64-1, batch {BATCH}, {EPOCHS} epochs"
    assert head in out
    assert re.search(r"\(steps per compiled call: \d+, XLA: (True|False)\)", out)
    assert (
        "| run | whole fit (s: upload, compile, epochs) | first epoch (s, incl. compile) "
        "| later epoch (s) | final loss |"
    ) in out
    rows = {name: tuple(map(float, numbers)) for name, *numbers in ROW.findall(out)}
    assert list(rows) == ["model.fit(ShardedResidentDataset)", "model.fit(x, y)"]
    for name, (whole_s, first_s, later_s, loss) in rows.items():
        # printed to 0.01 s: a fast epoch reads 0.00
        assert whole_s >= first_s >= 0 and later_s >= 0, name
        assert math.isfinite(loss) and loss > 0, name
    assert re.search(r"^Whole fit: [0-9.]+x (faster|slower), compile and upload included\.$",
                     out, re.M)
    assert re.search(r"^Later epochs: [0-9.]+x (faster|slower) per epoch\.$", out, re.M)

    # The demo's shardfeed.fit run is deterministic: the same loss from the
    # shared W2 data and model, trained here directly.
    w2 = WORKLOADS["W2"]
    x, y = make_data(w2, ROWS, seed=0)
    model = compile_model(build_model(w2, True, seed=0), w2, metrics=["mae"])
    dataset = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=BATCH, seed=0)
    history = shardfeed.fit(model, dataset, epochs=EPOCHS, verbose=0)
    loss = rows["model.fit(ShardedResidentDataset)"][3]
    assert loss == pytest.approx(history.history["loss"][-1], abs=1e-4)


# What TensorFlow 2.21 prints at start-up unless told otherwise (absl's
# header, the oneDNN notice, the CPU-feature notice).
NOISE = ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard")


def test_demo_output_has_no_tensorflow_start_up_lines():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")
    }
    command = ["demo", "--rows", "2000", "--epochs", "1"]
    result = subprocess.run(
        [sys.executable, "-m", "shardfeed._commands.cli", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "| model.fit(ShardedResidentDataset) |" in result.stdout
    assert "| model.fit(x, y) |" in result.stdout
    assert not [line for line in output.splitlines() if any(n in line for n in NOISE)]
