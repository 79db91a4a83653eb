"""The examples run as documented (small sizes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
