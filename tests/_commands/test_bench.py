"""`shardfeed bench` runs end to end and writes its report.

No timing assertions: speed claims belong to the benchmark's own output, with
its machine and conditions, not to tests. This only checks that every variant
runs on tiny data and that the JSON, Markdown and chart come out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess

import numpy as np
import pytest

from shardfeed._commands.bench import tuning as _tuning
from shardfeed._commands.bench import variants as _variants
from shardfeed._commands.bench import workloads as _workloads
from shardfeed._commands.cli import build_parser, main

# The variants that run in the bench's own process; the Keras-on-JAX ones
# (worker processes) have their own tests below.
IN_PROCESS = [v for v in _variants.VARIANTS if v not in _variants.OTHER_BACKENDS]
KERAS_ON_JAX = {"jax": "Keras on JAX, model.fit(numpy)", "jax-tuned": "Keras on JAX, "
                "model.fit(numpy, tuned)"}


@pytest.mark.slow
def test_bench_runs_every_variant_and_writes_report(tmp_path, capsys):
    """Every in-process variant on W2 and on W5 (embedding towers, batch 64):
    each variant, the probe and the report take the workload's own batch, not
    W2's 256 (W5's 200 rows: a partial last step)."""
    argv = ["bench", "--workloads", "W2,W5", "--rows-scale", "0.002", "--epochs", "1"]
    argv += ["--variants", ",".join(IN_PROCESS)]
    assert main([*argv, "--out", str(tmp_path)]) == 0

    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["conditions"]["timed_epochs"] == 1
    assert report["conditions"]["batch_size"] == {"W2": 256, "W5": 64}
    assert report["machine"]["cpu_count"] >= 1 and report["machine"]["tensorflow"]
    assert list(report["workloads"]) == ["W2", "W5"]
    # (rows, batch, steps): W5's ceil(200 / 64) counts the partial step.
    shapes = {"W2": (2000, 256, 8), "W5": (200, 64, 4)}
    for workload_name, workload in report["workloads"].items():
        assert (workload["rows"], workload["batch_size"], workload["steps_per_epoch"]) == (
            shapes[workload_name]
        )
        variants = workload["variants"]
        assert list(variants) == IN_PROCESS
        for name, result in variants.items():
            assert len(result["epoch_s"]) == 1 and result["epoch_s"][0] > 0, name
            for key in (
                "median_epoch_s",
                "ms_per_step",
                "warmup_s",
                "ratio_to_floor",
                "speedup_vs_numpy",
            ):
                assert result[key] > 0, (name, key)
            assert isinstance(result["settings"]["jit_compile"], bool), name
            assert result["settings"]["steps_per_execution"] >= 1, name
            if name.startswith("floor"):
                assert result["final_loss"] is None  # one batch seen over and over
            else:
                assert math.isfinite(result["final_loss"]), name
        assert variants["floor"]["ratio_to_floor"] == 1.0
        assert variants["numpy"]["speedup_vs_numpy"] == 1.0
        probe = variants["tuned"]["probe"]
        assert probe["steps_per_epoch"] == workload["steps_per_epoch"]
        assert len(probe["configs"]) == len(_tuning.PROBE_SPE) * len(_tuning.PROBE_JIT)
        assert probe["note"].startswith("Winner: ")

    png = (tmp_path / "bench.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    markdown = (tmp_path / "bench.md").read_text()
    assert "| shardfeed.fit |" in markdown and "### W5" in markdown
    assert "200 rows, batch 64, 4 steps/epoch." in markdown
    assert "Smoke check" in markdown  # 1 epoch at rows scale 0.002 is not a result
    assert markdown in capsys.readouterr().out


@pytest.mark.slow
def test_bench_runs_the_jax_variants_in_worker_processes(tmp_path, capfd):
    """`jax` and `jax-tuned` (Keras' `model.fit` on JAX) and `shardfeed-jax`
    (`shardfeed.fit` on Keras' JAX backend) train (the loss falls), and
    `floor-jax` runs the JAX loop's call on one batch, each in a process
    without TensorFlow; their rows come out beside TensorFlow's floor, and
    the JAX rows' ratio to the JAX floor is said under the table. (One bench
    run for all four: CI time.)"""
    python = os.environ.get("SHARDFEED_JAX_PYTHON")
    if not python:
        pytest.skip("no Keras-on-JAX venv: set SHARDFEED_JAX_PYTHON (.ci/setup makes .venv-jax)")
    jax_version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('jax'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    names = ["jax", "jax-tuned", "shardfeed-jax", "floor-jax", "floor"]
    argv = ["bench", "--workloads", "W2", "--variants", ",".join(names)]
    argv += ["--rows-scale", "0.002", "--epochs", "2", "--out", str(tmp_path)]
    argv += ["--jax-python", python]
    assert main(argv) == 0

    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["machine"]["jax"] == jax_version
    variants = report["workloads"]["W2"]["variants"]
    assert list(variants) == names
    for name, label in KERAS_ON_JAX.items():
        result = variants[name]
        assert result["label"] == label
        assert len(result["epoch_s"]) == 2 and min(result["epoch_s"]) > 0, name
        assert result["ratio_to_floor"] > 0 and result["warmup_s"] > 0, name
        assert result["final_loss"] < 0.9 * result["first_epoch_loss"], name  # it trained
        assert result["backend"] == "jax", name
        assert result["backend_version"] == jax_version, name
        assert result["tensorflow_imported"] is False, name
        assert result["worker"]["jax"] == jax_version and result["worker"]["devices"], name
    assert variants["jax"]["settings"] == {"steps_per_execution": 1, "jit_compile": True}
    probe = variants["jax-tuned"]["probe"]
    assert len(probe["configs"]) == len(_tuning.PROBE_SPE) * len(_tuning.PROBE_JIT)
    best = min((c for c in probe["configs"] if c["ms_per_step"]), key=lambda c: c["ms_per_step"])
    assert variants["jax-tuned"]["settings"] == {
        "steps_per_execution": best["steps_per_execution"],
        "jit_compile": best["jit_compile"],
    }
    fit, floor = variants["shardfeed-jax"], variants["floor-jax"]
    for result in (fit, floor):
        assert result["backend"] == "jax" and result["tensorflow_imported"] is False
        assert result["ratio_to_floor"] > 0  # against TensorFlow's floor, as every row
    assert fit["final_loss"] < 0.9 * fit["first_epoch_loss"]  # it trained
    assert floor["final_loss"] is None
    # 8 steps per epoch: "auto" is ceil(8 / 10) = 1 step per call on both backends.
    assert fit["settings"] == floor["settings"] == {"steps_per_execution": 1, "jit_compile": True}
    assert floor["ratio_to_backend_floor"] == 1.0
    assert fit["ratio_to_backend_floor"] == pytest.approx(
        fit["median_epoch_s"] / floor["median_epoch_s"]
    )
    assert "ratio_to_backend_floor" not in variants["floor"]  # TensorFlow's own floor
    markdown = (tmp_path / "bench.md").read_text()
    assert "| Keras on JAX, model.fit(numpy) | spe=1, jit=True | " in markdown
    assert "Worker processes' Keras: Keras on JAX, model.fit(numpy): 3." in markdown
    assert "Tuning probe of Keras on JAX, model.fit(numpy, tuned) (3 epochs of 8 steps" in markdown
    assert "W2 probe (jax) steps_per_execution=32" in capfd.readouterr().err  # the worker's
    ratio = f"shardfeed.fit on JAX {fit['ratio_to_backend_floor']:.2f}x; floor on JAX 1.00x."
    assert "Against their own backend's floor (floor on JAX): " in markdown
    assert ratio in markdown


def test_the_opaque_floor_trains_on_the_same_values_as_the_floor():
    """`floor-opaque` multiplies its batch by one inside each step: after the
    same calls, its model's weights equal the floor's to the bit."""
    from shardfeed._commands.bench.variants import VARIANT_TYPES

    workload = _workloads.WORKLOADS["W2"]
    data = _workloads.make_data(workload, 1024, 0)
    reference = _workloads.build_model(workload, False, 0)
    args = argparse.Namespace(seed=0, probe_budget_s=20.0)
    floors = [VARIANT_TYPES[name](workload, data, reference, args)
              for name in ("floor", "floor-opaque")]
    for floor in floors:
        floor.setup()
        floor.epoch(0)
    plain, opaque = (f.model.get_weights() for f in floors)
    assert [v.name for v in floors] == ["floor", "floor-opaque"]
    assert not np.array_equal(plain[0], reference.get_weights()[0])  # it trained
    for a, b in zip(plain, opaque, strict=True):
        np.testing.assert_array_equal(a, b)


def test_workloads_own_their_batch_and_minimum_rows():
    w5, w6 = _workloads.WORKLOADS["W5"], _workloads.WORKLOADS["W6"]
    assert (w5.batch_size, w5.min_rows) == (64, 128)
    assert (w6.batch_size, w6.min_rows) == (128, 256)  # keras-io's MNIST convnet's batch
    others = [w for n, w in _workloads.WORKLOADS.items() if n not in ("W5", "W6")]
    assert all(w.batch_size == 256 for w in others)
    images, labels = _workloads.make_data(w6, 300, seed=0)
    assert images.dtype == np.float32 and images.shape == (300, 28, 28, 1)
    assert 0 <= images.min() and images.max() <= 1 and set(np.unique(labels)) == set(range(10))
    x, y = _workloads.make_data(w5, 130, seed=0)
    assert x.dtype == np.int32 and x.shape == (130, 2) and y.shape == (130, 1)
    assert [len(batch[0]) for batch in _workloads.tf_data(x, y, w5)] == [64, 64, 2]


def _fail_import_of_jax(tmp_path, monkeypatch, body: str) -> None:
    """Puts a `jax` package that runs `body` on import first on the worker
    processes' path: the import itself fails there, as without JAX."""
    package = tmp_path / "path" / "jax"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body)
    entries = [str(tmp_path / "path"), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(e for e in entries if e))


def test_bench_says_why_keras_on_jax_is_skipped_when_jax_does_not_import(tmp_path, monkeypatch):
    _fail_import_of_jax(tmp_path, monkeypatch, "raise ImportError('No module named jax (test)')")
    argv = ["bench", "--workloads", "W2", "--variants", "jax,jax-tuned,floor"]
    argv += ["--rows-scale", "0.0005", "--epochs", "1", "--out", str(tmp_path)]
    assert main(argv) == 0

    variants = json.loads((tmp_path / "bench.json").read_text())["workloads"]["W2"]["variants"]
    reason = (
        "jax is not importable in the worker process (ImportError: No module named jax "
        "(test)); make a venv of its own for Keras on JAX, without TensorFlow (`python -m "
        'venv .venv-jax && .venv-jax/bin/pip install "shardfeed[jax]"`), and pass '
        "`--jax-python .venv-jax/bin/python` (or set SHARDFEED_JAX_PYTHON)"
    )
    for name, label in KERAS_ON_JAX.items():
        assert variants[name] == {"label": label, "skipped": reason}
    assert variants["floor"]["ratio_to_floor"] == 1.0  # the others still ran
    markdown = (tmp_path / "bench.md").read_text()
    assert f"| Keras on JAX, model.fit(numpy) | skipped: {reason} ||||||||" in markdown


def test_bench_stops_with_the_status_of_a_worker_process_that_dies(tmp_path, monkeypatch):
    _fail_import_of_jax(tmp_path, monkeypatch, "import os\nos._exit(3)")
    argv = ["bench", "--workloads", "W2", "--variants", "jax,floor"]
    argv += ["--rows-scale", "0.0005", "--epochs", "1", "--out", str(tmp_path)]
    with pytest.raises(RuntimeError, match=r"The jax variant's worker process \(shardfeed"
                       r"\._commands\.bench\.backend_worker, KERAS_BACKEND=jax\) exited with "
                       r"status 3 before replying"):
        main(argv)


def test_bench_flags_accept_letters_and_reject_unknown_names(capsys):
    parser, _ = build_parser()
    args = parser.parse_args(["bench", "--variants", "a,shardfeed,e", "--workloads", "w3"])
    assert args.variants == ["numpy", "shardfeed", "floor"]
    issue = parser.parse_args(["bench", "--variants", "numpy,tuned,jax,jax-tuned,shardfeed,floor"])
    assert issue.variants == ["numpy", "tuned", "jax", "jax-tuned", "shardfeed", "floor"]
    assert parser.parse_args(["bench", "--variants", "g,h,f"]).variants == [
        "jax",
        "jax-tuned",
        "streaming",
    ]
    assert parser.parse_args(["bench"]).variants is None  # all of the backend's, chosen in run
    assert args.workloads == ["W3"]
    assert args.epochs == 3 and args.rows_scale == 1.0  # full size unless asked
    assert (args.engine_workloads, args.engine_rows) == (["W2"], None)  # W2's 200,000 rows
    w5 = parser.parse_args(["bench", "--workloads", "w5", "--engine-workloads", "w2,W5"])
    assert (w5.workloads, w5.engine_workloads) == (["W5"], ["W2", "W5"])
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--variants", "keras"])
    assert "unknown name 'keras'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--rows-scale", "0"])


def _config(spe, jit, ms):
    return {
        "steps_per_execution": spe,
        "jit_compile": jit,
        "ms_per_step": ms,
        "stopped_after_s": None if ms is not None else 130.0,
    }


@pytest.mark.parametrize(
    ("configs", "winner", "catastrophic"),
    [
        ([_config(32, False, 2.0), _config(32, True, 1.0)], "jit_compile=True", False),
        ([_config(32, False, 2.0), _config(32, True, 6.1)], "jit_compile=False", True),  # 3.05x
        ([_config(32, False, 2.0), _config(32, True, 5.9)], "jit_compile=False", False),  # 2.95x
        ([_config(32, False, 2.0), _config(32, True, None)], "jit_compile=False", True),  # budget
    ],
)
def test_probe_note_names_winner_and_catastrophic_jit(configs, winner, catastrophic):
    note = _tuning._probe_note(configs)
    assert note.startswith("Winner: ") and winner in note.split(";")[0]
    assert ("catastrophically slow" in note) == catastrophic


@pytest.mark.slow
def test_w4_augments_in_every_variant(tmp_path):
    """W4: Keras layers in model.fit(numpy)'s model, shardfeed.augment in the
    tf.data map, augment= for shardfeed; the floor reports the augmentation's
    own time."""
    argv = ["bench", "--workloads", "W4", "--variants", "numpy,tfdata,shardfeed,floor"]
    argv += ["--rows-scale", "0.0005", "--epochs", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    variants = report["workloads"]["W4"]["variants"]
    assert variants["floor"]["augment_ms_per_step"] > 0
    assert "Augmentation alone" in (tmp_path / "bench.md").read_text()
    w4 = _workloads.WORKLOADS["W4"]
    layers = [type(layer).__name__ for layer in _workloads.build_model(w4, True, 0, True).layers]
    assert layers[:3] == ["Rescaling", "RandomFlip", "RandomTranslation"]
    x, y = _workloads.make_data(w4, 300, seed=0)
    batch = next(iter(_workloads.tf_data(x, y, w4)))[0].numpy()
    originals = {image.tobytes() for image in x}
    unchanged = sum(image.tobytes() in originals for image in batch)
    # Unchanged only when the coin says "no flip" and both offsets are 0 (1 in 50).
    assert batch.dtype == np.uint8 and unchanged < len(batch) // 4


def test_bench_capacity_is_refused_on_tensorflow(tmp_path):
    with pytest.raises(ValueError) as raised:
        main(["bench", "--capacity", "--capacity-limit-bytes", "1000000", "--out", str(tmp_path)])
    assert str(raised.value) == (
        "`--capacity` measures a JAX device's memory (memory_stats()). Received: "
        "capacity=True, keras.backend.backend()='tensorflow'. Run it with KERAS_BACKEND=jax."
    )
    assert not (tmp_path / "bench.json").exists()



def test_bench_search_reports_trials_per_minute(tmp_path):
    """`--search` at its smallest: each variant's KerasTuner search runs in its
    own process and the table has trials per minute and the ratio to Keras'
    `fit` from NumPy (a smoke check of the plumbing, not a measurement)."""
    argv = ["bench", "--search", "--search-variants", "numpy,resident,resident-mode"]
    argv += ["--rows-scale", "0.0006", "--search-trials", "2", "--search-epochs", "1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["workloads"] == {}
    results = {r["variant"]: r for r in report["search"]}
    assert list(results) == ["numpy", "resident", "resident-mode"]
    for result in results.values():
        assert result["backend"] == "tensorflow" and result["trials"] == 2
        assert result["rows"] == 600 and result["trials_per_minute"] > 0
        assert math.isfinite(result["best_val_loss"])
    markdown = (tmp_path / "bench.md").read_text()
    head = (
        "### Hyperparameter search (KerasTuner RandomSearch, W2's model (MLP, 32 features, "
        "MSE), 600 rows, 2 trials"
    )
    assert head in markdown
    assert re.search(r"^\| numpy: Keras `fit` from NumPy .* \| 1\.00x \|", markdown, re.M)


def test_bench_search_tunes_the_model_asked_for(tmp_path):
    """`--search-model`: keras-io's text Transformer (int32 tokens, through
    resident mode) at its own rows; the Conv1D network's data and model are
    built, not searched (CI time)."""
    import keras_tuner

    from shardfeed._commands.bench.search import SEARCH_MODELS, _hypermodel, search_data

    argv = ["bench", "--search", "--search-model", "transformer"]
    argv += ["--search-variants", "resident-mode", "--rows-scale", "0.02"]
    argv += ["--search-trials", "1", "--search-epochs", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    (result,) = json.loads((tmp_path / "bench.json").read_text())["search"]
    assert result["model"] == "transformer" and result["trials"] == 1
    assert result["rows"] == round(SEARCH_MODELS["transformer"].rows * 0.02)
    assert math.isfinite(result["best_val_loss"])
    what = SEARCH_MODELS["transformer"].description
    head = f"### Hyperparameter search (KerasTuner RandomSearch, {what}"
    assert head in (tmp_path / "bench.md").read_text()
    for model, dtype in (("transformer", "int32"), ("conv1d", "float32")):
        x, y = search_data(model, 2000, 0)
        assert x.dtype == dtype and 0.3 < y.mean() < 0.7  # both classes, about evenly
    net = _hypermodel("conv1d", {})(keras_tuner.HyperParameters())
    assert net.output_shape == (None, 2)
