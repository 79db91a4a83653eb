"""The examples run as documented (small sizes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("TF_CONFIG", "SHARDFEED_RANK", "SHARDFEED_WORLD_SIZE"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_train_on_several_local_devices():
    out = _run("examples/train.py", "--rows", "2000", "--epochs", "1", "--cpu-devices", "2")
    assert "engine=tf.distribute workers=1 replicas=2" in out
    assert '"eval": {"loss":' in out


def test_uint8_images_with_transform():
    out = _run("examples/images_uint8.py", "--rows", "800", "--epochs", "1")
    assert "x: uint8[32, 32, 3]" in out  # stored as uint8 on the device
    assert "'accuracy':" in out


def test_cifar_like_trains_with_augmentation():
    out = _run("examples/cifar_like.py", "--rows", "600", "--epochs", "1", "--batch", "64")
    assert "x: uint8[32, 32, 3]" in out
    assert "evaluate: {'loss':" in out and "'accuracy':" in out


def test_cifar_like_reads_a_tfrecord_source(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    from test_tfdata import write_tfrecords

    rng = np.random.default_rng(0)
    arrays = {
        "image": rng.integers(0, 256, (200, 32, 32, 3), dtype=np.uint8),
        "vector": np.zeros((200, 4), "float32"),
        "label": rng.integers(0, 10, 200).astype("int64"),
    }
    write_tfrecords(tmp_path, arrays, splits=(120,))
    pattern = str(tmp_path / "part-*.tfrecord")
    out = _run("examples/cifar_like.py", "--tfrecord", pattern, "--epochs", "1", "--batch", "32")
    assert "200 rows (x: uint8[32, 32, 3], y: int64[])" in out
