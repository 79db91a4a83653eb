"""`shardfeed bench` on Keras' JAX backend runs end to end and never imports TensorFlow.

No timing assertions (speed claims belong to the bench's own report, with its
machine line). W2, and W6 (keras-io's MNIST convnet) at two batches: W4's
larger CNN takes seconds per step on a 2-core CPU, so W4 on JAX is for GPUs
(`.ci/gpu-check.sh`). The bench runs in a subprocess whose import system refuses
TensorFlow, so the check holds in a venv that has TensorFlow too: any import
of it fails the run or shows in a variant's skip reason.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shardfeed._commands.bench import jax_variants as _jax
from shardfeed._commands.bench import variants as _variants
from shardfeed._commands.bench.workloads import WORKLOADS, build_model, make_data

ROOT = Path(__file__).resolve().parents[2]

# The bench's CLI with TensorFlow made unimportable; exits non-zero if any
# module of it got imported all the same.
NO_TENSORFLOW = textwrap.dedent(
    """
    import sys

    class NoTensorFlow:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "tensorflow":
                raise ImportError(f"the JAX bench imported TensorFlow ({name})")
            return None

    sys.meta_path.insert(0, NoTensorFlow())
    from shardfeed._commands.cli import main

    status = main(sys.argv[1:])
    leaked = [m for m in sys.modules if m.split(".")[0] == "tensorflow"]
    sys.exit(status or (3 if leaked else 0))
    """
)


def _bench(out: Path, *flags: str) -> dict:
    argv = ["bench", "--rows-scale", "0.0001", "--epochs", "1", "--probe-budget-s", "20"]
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", NO_TENSORFLOW, *argv, *flags, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "bench.json").read_text())


def _check_ran(result: dict, name: str) -> None:
    assert len(result["epoch_s"]) == 1 and result["epoch_s"][0] > 0, name
    assert result["ratio_to_floor"] > 0 and result["speedup_vs_numpy"] > 0, name
    assert result["settings"]["steps_per_execution"] >= 1, name
    if name == "floor":
        assert result["final_loss"] is None  # one batch seen over and over
    else:
        assert math.isfinite(result["final_loss"]), name


@pytest.mark.slow
def test_jax_bench_runs_every_jax_variant_without_tensorflow(tmp_path):
    report = _bench(tmp_path, "--workloads", "W2")  # default variants: the JAX ones

    machine = report["machine"]
    assert machine["keras_backend"] == "jax" and machine["jax"]
    assert machine["devices"] and all(":" in d for d in machine["devices"])  # jax.devices()
    variants = report["workloads"]["W2"]["variants"]
    assert list(variants) == list(_jax.JAX_VARIANTS)
    for name, result in variants.items():
        assert "skipped" not in result, (name, result.get("skipped"))
        _check_ran(result, name)
    assert variants["floor"]["ratio_to_floor"] == 1.0
    assert variants["jax"]["speedup_vs_numpy"] == 1.0  # Keras-on-JAX defaults: the baseline
    assert variants["jax-tuned"]["probe"]["configs"]
    markdown = (tmp_path / "bench.md").read_text()
    assert f"Keras {machine['keras']} on jax" in markdown, markdown[:600]
    assert f"devices {machine['devices'][0]}" in markdown, markdown[:600]


@pytest.mark.slow
def test_jax_bench_runs_the_keras_io_convnet_beside_keras_fit(tmp_path):
    """W6, keras-io's MNIST convnet, at its two smallest batches: Keras'
    `model.fit` and `shardfeed.fit` on a convolution model on JAX."""
    report = _bench(tmp_path, "--workloads", "W6", "--variants", "jax,shardfeed,floor")

    workload = report["workloads"]["W6"]
    assert (workload["rows"], workload["batch_size"], workload["steps_per_epoch"]) == (256, 128, 2)
    variants = workload["variants"]
    assert list(variants) == ["jax", "shardfeed", "floor"]
    for name, result in variants.items():
        assert "skipped" not in result, (name, result.get("skipped"))
        _check_ran(result, name)
    assert variants["jax"]["settings"] == {"steps_per_execution": 1, "jit_compile": True}
    # Two steps: about ten calls per epoch (at most 8 steps each) is one step per call.
    assert variants["shardfeed"]["settings"]["steps_per_execution"] == 1


def test_jax_bench_refuses_tensorflow_variants():
    _jax.check_variants(_jax.JAX_VARIANTS)
    with pytest.raises(ValueError) as raised:
        _jax.check_variants(["jax", "tfdata", "streaming"])
    assert str(raised.value) == (
        "On Keras' JAX backend the bench runs jax, jax-tuned, shardfeed, floor, "
        "jax-nightly-tuned; the others train on TensorFlow. Received: variants=tfdata,streaming, "
        "keras.backend.backend()='jax'. Pass `--variants jax,jax-tuned,shardfeed,floor`, or "
        "run the bench with KERAS_BACKEND=tensorflow."
    )


def _nightly(monkeypatch, path: str | None):
    """The `jax-nightly-tuned` variant, set up with $SHARDFEED_KERAS_NIGHTLY_PATH=path."""
    if path is None:
        monkeypatch.delenv(_variants.NIGHTLY_PATH_ENV, raising=False)
    else:
        monkeypatch.setenv(_variants.NIGHTLY_PATH_ENV, path)
    workload = WORKLOADS["W2"]
    data = make_data(workload, 2 * workload.batch_size, 0)
    args = argparse.Namespace(seed=0, probe_budget_s=20.0, jax_python=sys.executable)
    variant = _jax.JAX_VARIANT_TYPES["jax-nightly-tuned"](
        workload, data, build_model(workload, False, 0), args
    )
    try:
        variant.setup()
    finally:
        variant.close()
    return variant


INSTALL_NIGHTLY = (
    "Install it into a folder of its own (`pip install --no-deps --target DIR keras-nightly`; "
    ".ci/gpu-check.sh does) and set SHARDFEED_KERAS_NIGHTLY_PATH=DIR"
)


def test_nightly_variant_is_skipped_saying_why_without_keras_nightly(monkeypatch, tmp_path):
    assert _nightly(monkeypatch, None).skipped == (
        "keras-nightly is not installed for the bench: SHARDFEED_KERAS_NIGHTLY_PATH is not set. "
        + INSTALL_NIGHTLY
    )
    assert _nightly(monkeypatch, str(tmp_path)).skipped == (
        f"SHARDFEED_KERAS_NIGHTLY_PATH={str(tmp_path)!r} holds no `keras` package. "
        + INSTALL_NIGHTLY
    )


def test_nightly_variant_worker_refuses_a_keras_release(monkeypatch):
    """A folder whose `keras` is a release (this tier's Keras 3.15.1): the worker
    imports it and skips the variant rather than time a release as the nightly."""
    import keras

    release = str(Path(keras.__file__).parents[1])
    skipped = _nightly(monkeypatch, release).skipped
    assert skipped == (
        f"the worker imported Keras {keras.__version__} from {keras.__file__}, not a "
        "keras-nightly (3.16.0.dev) build; put the folder keras-nightly was installed into "
        "first on the worker's path (SHARDFEED_KERAS_NIGHTLY_PATH)"
    )


def test_capacity_needs_a_limit_where_the_device_reports_none():
    from shardfeed._commands.bench.capacity import device_limit

    assert device_limit(1234) == (1234, "--capacity-limit-bytes")
    with pytest.raises(ValueError) as raised:
        device_limit(None)  # CPU devices' memory_stats() is None
    assert str(raised.value) == (
        "`--capacity` measures shares of the device's memory_stats()['bytes_limit'], which "
        "this device does not report. Received: device=cpu:0, memory_stats=None. Pass "
        "`--capacity-limit-bytes N` (e.g. 67108864 on a CPU) to stand in for it."
    )



def test_the_custom_loop_cost_script_runs_every_variant():
    """`python -m shardfeed._commands.bench.custom_loop_jax` (NOTES.md, "A user's
    own JAX loop"): one round of each variant, at least one `scan` chunk."""
    from _helpers_jax import run_python

    code = "from shardfeed._commands.bench.custom_loop_jax import main; main()"
    out = run_python(code, ["--rows", "3300", "--rounds", "1"]).stdout
    for name in ("numpy", "resident", "batch-fn", "scan", "batches"):
        assert f"{name} " in out and "ms/step min" in out, out
    assert "103 steps of 32 rows an epoch" in out
