"""`.ci/gpu-check.sh` runs as it would on the lent GPU machine, rehearsed on the CPU.

That machine's `python3` is a venv of CPython 3.12 with JAX 0.11.2 and NumPy 2.5.2,
no Keras, no TensorFlow and no network. The rehearsal is the same:
`.venv-gpu-rehearsal` (`.ci/gpu_rehearsal_env.sh`, which `.ci/setup` runs) holds
only JAX, jaxlib, NumPy and JAX's own dependencies, pip cannot reach an index,
and the check installs the wheels `gpu-check.sh download` put in build/gpu-wheels.
Also here: which carried wheels `.ci/gpu_wheels.py` installs, and when the
keras-nightly variant is skipped and why.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from _helpers_jax import REPO

# The check runs its own venv, whatever JAX this tier has: .ci/test runs it once, in
# the tier on the pinned JAX.
pytestmark = pytest.mark.skipif(
    os.environ.get("SHARDFEED_JAX_TIER") == "newest",
    reason="the GPU-check rehearsal runs its own venv: once, in the pinned JAX tier",
)

PYTHON312 = Path(
    os.environ.get("SHARDFEED_PYTHON312", "/root/.pyenv/versions/3.12.1/bin/python3.12")
)
REHEARSAL_PYTHON = REPO / ".venv-gpu-rehearsal" / "bin" / "python3"
WHEELS = REPO / "build" / "gpu-wheels"
GPU_VARIANTS = ("jax-tuned", "jax-nightly-tuned", "shardfeed", "floor")


def _gpu_wheels():
    spec = importlib.util.spec_from_file_location("gpu_wheels", REPO / ".ci" / "gpu_wheels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _offline_env(out: Path) -> dict[str, str]:
    """The lent machine's conditions: no package index, no pip configuration, one
    device (no forced CPU split), and nothing of this tier's environment."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "SHARDFEED_", "XLA_", "JAX_", "KERAS_"))
        and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(
        PIP_NO_INDEX="1",
        PIP_INDEX_URL="http://127.0.0.1:9/",  # the discard port: nothing answers
        PIP_CONFIG_FILE=os.devnull,  # no extra index or find-links from this machine's pip.conf
        SHARDFEED_GPU_PYTHON=str(REHEARSAL_PYTHON),
        SHARDFEED_GPU_WORKLOADS="W2",
        # W2 at 1,000 rows (4 steps an epoch), not 5,000: the two tuning probes (4
        # configurations, 3 epochs each) run a fifth of the steps; the whole test took
        # 56 s of CPU (63-73 s of wall time) at 5,000 rows and 50 s (48 s) at 1,000.
        SHARDFEED_GPU_ROWS_SCALE="0.001",
        SHARDFEED_GPU_EPOCHS="1",
        SHARDFEED_GPU_PROBE_BUDGET_S="30",
        SHARDFEED_GPU_BUDGET_S="360",
        SHARDFEED_GPU_CAPACITY_LIMIT_BYTES=str(32 * 2**20),  # a CPU reports no bytes_limit
        OUT=str(out),
    )
    return env


@pytest.mark.slow
@pytest.mark.skipif(not PYTHON312.is_file(), reason=f"no CPython 3.12 at {PYTHON312}")
def test_gpu_check_runs_offline_on_a_python_312_venv_with_only_jax(tmp_path):
    # Makes the rehearsal venv and the wheel folder where .ci/setup has not (idempotent:
    # nothing is installed or downloaded when they are there).
    subprocess.run(["bash", ".ci/gpu_rehearsal_env.sh"], cwd=REPO, check=True, timeout=900)
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", ".ci/gpu-check.sh"],
        cwd=REPO,
        env=_offline_env(out),
        capture_output=True,
        text=True,
        timeout=420,
    )
    log = (out / "gpu-check.log").read_text() if (out / "gpu-check.log").exists() else ""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "(exit" not in log and "budget was spent" not in log, log[-3000:]

    # The log names exactly what ran: the machine's Python, JAX and NumPy, the carried Keras.
    bench_line = next(line for line in log.splitlines() if line.startswith("bench: "))
    assert bench_line.startswith(f"bench: Python 3.12.1 ({REHEARSAL_PYTHON})"), bench_line
    assert "Keras 3.15.1" in bench_line and "NumPy 2.5.2" in bench_line, bench_line
    assert "JAX 0.11.2" in bench_line and "jaxlib 0.11.2" in bench_line, bench_line
    assert "devices cpu:0 cpu" in bench_line, bench_line
    site_packages = str(REPO / ".venv-gpu-rehearsal" / "lib" / "python3.12" / "site-packages")
    assert f"JAX 0.11.2 ({site_packages}/jax/__init__.py)" in bench_line  # never a carried copy
    nightly_line = next(line for line in log.splitlines() if line.startswith("jax-nightly-tuned: "))
    assert "Keras 3.16.0.dev2026102704" in nightly_line and "JAX 0.11.2" in nightly_line

    report = json.loads((out / "W2" / "bench.json").read_text())
    assert report["machine"]["python"].startswith("3.12") and report["machine"]["jax"] == "0.11.2"
    variants = report["workloads"]["W2"]["variants"]
    assert list(variants) == list(GPU_VARIANTS)
    for name, result in variants.items():
        assert "skipped" not in result, (name, result.get("skipped"))
        assert result["median_epoch_s"] > 0 and result["ratio_to_floor"] > 0, name
        assert name == "floor" or math.isfinite(result["final_loss"]), name
    worker = variants["jax-nightly-tuned"]["worker"]
    assert worker["keras"] == "3.16.0.dev2026102704" and worker["python"].startswith("3.12")
    assert variants["jax-nightly-tuned"]["probe"]["configs"]
    markdown = (out / "bench.md").read_text()
    assert "| Keras-nightly on JAX, model.fit(numpy, tuned) | spe=" in markdown, markdown

    # The capacity probe: refused by the dataset's memory check just under 0.8 of
    # the limit (its rows and 4 bytes of positions a row must fit in 80%; where an
    # epoch's copy would not fit, "auto" gathers instead: with a copy it was 0.375).
    capacity = json.loads((out / "capacity" / "bench.json").read_text())["capacity"]
    assert capacity["limit_bytes"] == 32 * 2**20 and capacity["devices"] == 1
    assert 0.7 <= capacity["largest_share"] < 0.8, capacity["trials"]
    assert capacity["largest_bytes"] == capacity["largest_rows"] * 132
    assert capacity["trials"][-1]["result"] in ("trained", "refused"), capacity["trials"]
    assert any(t["result"] == "refused" for t in capacity["trials"])
    assert "### Capacity: the largest float32 dataset" in markdown
    assert f"Largest that trained: {capacity['largest_rows']:,} rows" in markdown


def test_gpu_wheels_never_shadow_the_machines_jax_numpy_or_what_it_has(tmp_path):
    """Run by this tier's Python, which has JAX, NumPy, Keras 3.15.1 and rich."""
    gpu_wheels = _gpu_wheels()
    names = [
        "jax-0.11.2-py3-none-any.whl",  # the machine's: never from the folder
        "jaxlib-0.11.2-cp312-cp312-manylinux_2_27_x86_64.whl",
        "numpy-2.5.2-cp312-cp312-manylinux_2_27_x86_64.whl",
        "jax_cuda13_plugin-0.11.2-cp312-cp312-manylinux_2_27_x86_64.whl",
        "keras-3.15.1-py3-none-any.whl",  # the same Keras is there: kept
        "keras_nightly-3.16.0.dev2026102704-py3-none-any.whl",  # its own folder
        "rich-99.0.0-py3-none-any.whl",  # another version is there: kept (no pin in Keras)
        "zz_not_installed-1.0-py3-none-any.whl",  # missing: installed
    ]
    site, nightly, lines = gpu_wheels.plan([tmp_path / n for n in names])
    assert [w.name for w in site] == ["zz_not_installed-1.0-py3-none-any.whl"]
    assert [w.name for w in nightly] == [names[5]]
    assert sum(line.startswith("not installed: ") for line in lines) == 4
    assert lines[4] == "kept the machine's keras 3.15.1 (carried: 3.15.1)"

    other_keras = gpu_wheels.plan([tmp_path / "keras-3.14.0-py3-none-any.whl"])
    assert [w.name for w in other_keras[0]] == ["keras-3.14.0-py3-none-any.whl"]
    assert other_keras[2] == ["install keras-3.14.0-py3-none-any.whl (the machine has 3.15.1)"]
    with pytest.raises(SystemExit) as raised:
        gpu_wheels.plan([tmp_path / "keras-3.15.1-py3-none-any.whl", tmp_path / names[4]])
    assert str(raised.value) == (
        "gpu_wheels: one wheel per distribution. Received: keras-3.15.1-py3-none-any.whl and "
        "keras-3.15.1-py3-none-any.whl. Remove one, or run `bash .ci/gpu-check.sh download` "
        "again."
    )


def test_gpu_wheels_check_refuses_a_carried_jax(tmp_path):
    gpu_wheels = _gpu_wheels()
    gpu_wheels.check([tmp_path])  # this tier's own JAX and NumPy: fine
    import jax

    carried = Path(jax.__file__).parents[1]  # as if this site-packages were a carried folder
    with pytest.raises(SystemExit) as raised:
        gpu_wheels.check([carried])
    assert str(raised.value) == (
        f"gpu_wheels: jax must be the machine's own. Received: jax from {jax.__file__}. "
        "Remove its wheel from the carried folder."
    )


def test_gpu_wheels_missing_and_pick(tmp_path):
    gpu_wheels = _gpu_wheels()
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    cache.mkdir()
    for name in ("keras-3.15.1-py3-none-any.whl", "keras-3.14.0-py3-none-any.whl",
                 "typing_extensions-4.16.0-py3-none-any.whl"):
        (cache / name).write_bytes(b"")
    specs = ["keras==3.15.1", "typing-extensions==4.16.0", "namex==0.1.0"]
    assert gpu_wheels.missing(cache, specs) == ["namex==0.1.0"]
    dest.mkdir()
    (dest / "keras-3.13.0-py3-none-any.whl").write_bytes(b"")  # stale: removed
    gpu_wheels.pick(cache, dest, specs[:2])
    assert sorted(p.name for p in dest.iterdir()) == [
        "keras-3.15.1-py3-none-any.whl",
        "typing_extensions-4.16.0-py3-none-any.whl",
    ]
