"""Memory across build / fit / delete cycles, and sizes read without copies.

Notebook users build a dataset, fit, drop it and build another, again and
again: each cycle must hand its rows back. The cycles run in a fresh
interpreter so that other tests' traces and caches do not blur the resident
set size (RSS); they read RSS from /proc/self/status (Linux).
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from shardfeed import ShardedResidentDataset

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads RSS from /proc/self/status (Linux)"
)


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line in /proc/self/status")


def test_describing_a_dataset_reads_no_rows():
    x = np.random.default_rng(0).random((2**20, 32), dtype="float32")  # 128 MiB
    y = np.zeros(2**20, "uint8")
    dataset = ShardedResidentDataset(x, y, per_replica_batch_size=1024, shuffle=False)
    gc.collect()
    before = _rss_bytes()
    text = repr(dataset)
    grown = _rss_bytes() - before
    assert dataset.nbytes_on_device == x.nbytes + y.nbytes
    assert f"{(x.nbytes + y.nbytes) / 2**20:,.1f} MiB on this worker's devices" in text
    assert grown < 0.1 * x.nbytes, f"repr grew RSS by {grown / 2**20:.1f} MiB"
