"""Everything backend-neutral works where TensorFlow is not installed.

Each check runs in a fresh process of the JAX venv (Keras on JAX, no
TensorFlow) and ends by asserting that nothing imported `tensorflow`: the
package, the plans and options, the file readers, the CLI's `plan`, `split`
and `launch`. TFRecord, which needs TensorFlow, refuses naming the fix.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _helpers_jax import ASSERT_NO_TENSORFLOW, run_python


def test_the_neutral_public_names_work_without_tensorflow():
    code = """
import numpy as np
import shardfeed
plan = shardfeed.plan_shards(16, 4, per_replica_batch_size=2)
print("steps", plan.steps_per_epoch, "shards", plan.shards)
mp = shardfeed.memory_plan({"x": ((1000, 8), "float32")}, num_workers=2,
                           per_replica_batch_size=16, device_memory_bytes=2**30)
assert isinstance(mp, shardfeed.MemoryPlan) and mp.fits
print(shardfeed.LoadOptions(), shardfeed.FitOptions(), shardfeed.Batch(1, None, None))
print("names", len(dir(shardfeed)))
""" + ASSERT_NO_TENSORFLOW
    out = run_python(code).stdout
    assert "steps 2 shards ((0, 4), (4, 8), (8, 12), (12, 16))" in out


def test_the_file_readers_work_without_tensorflow(tmp_path):
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "xy.npz", x=x, y=np.arange(6))
    code = """
import sys
import h5py
import numpy as np
from shardfeed import files
d = sys.argv[1]
with h5py.File(d + "/x.h5", "w") as f:
    f["x"] = np.load(d + "/x.npy")
leaves = [files.npy(d + "/x.npy"), files.npz(d + "/xy.npz", "x"), files.hdf5(d + "/x.h5", "x")]
for leaf in leaves:
    assert np.array_equal(leaf[2:5], np.load(d + "/x.npy")[2:5]), leaf
files.split({"x": leaves[0]}, d + "/split", num_shards=2)
assert np.array_equal(np.asarray(files.manifest(d + "/split")["x"]), np.load(d + "/x.npy"))
print("read", len(leaves))
""" + ASSERT_NO_TENSORFLOW
    assert "read 3" in run_python(code, [str(tmp_path)]).stdout


def test_tfrecord_without_tensorflow_refuses_naming_the_fix(tmp_path):
    (tmp_path / "a.tfrecord").write_bytes(b"")
    code = """
import sys
from shardfeed import files
try:
    files.tfrecord(sys.argv[1], {"x": None})
except ImportError as err:
    print(err)
""" + ASSERT_NO_TENSORFLOW
    out = run_python(code, [str(tmp_path / "a.tfrecord")]).stdout
    assert out.startswith(
        "Reading TFRecord files (`shardfeed.files.tfrecord`) needs TensorFlow: it parses "
        "`tf.train.Example`s with `tf.io`. Received: import tensorflow failed (No module "
        "named 'tensorflow'). Install TensorFlow (`pip install shardfeed[cpu]`), or convert "
        "the records once to .npy/.npz/HDF5/Parquet and read those"
    )


@pytest.mark.parametrize("command", ["plan", "split", "launch"])
def test_the_cli_runs_without_tensorflow(tmp_path, command):
    np.save(tmp_path / "x.npy", np.zeros((100, 3), np.float32))
    argv = {
        "plan": ["plan", "--num-workers", "2", "--per-replica-batch-size", "8",
                 "--device-memory", "1GiB", f"x={tmp_path}/x.npy"],
        "split": ["split", "--num-shards", "2", "--out", f"{tmp_path}/out", f"x={tmp_path}/x.npy"],
        # A plain Python worker: the launcher's own imports are what is checked.
        "launch": ["launch", "-n", "2", "--timeout-s", "60", f"{tmp_path}/w.py"],
    }[command]
    (tmp_path / "w.py").write_text("import os; print('rank', os.environ['SHARDFEED_RANK'])\n")
    code = (
        "import json, sys\n"
        "from shardfeed._commands.cli import main\n"
        "code = main(json.loads(sys.argv[1]))\n"
        + ASSERT_NO_TENSORFLOW
        + "sys.exit(code)\n"
    )
    out = run_python(code, [json.dumps(argv)]).stdout
    if command == "launch":
        assert "[rank 0] rank 0" in out and "[rank 1] rank 1" in out
    elif command == "split":
        assert (tmp_path / "out" / "manifest.json").exists()
    else:
        assert "data: 100 rows x 12 B/row (x: float32[3])" in out
