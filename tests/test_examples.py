"""The examples run as documented (small sizes)."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers_horovod import NO_HOROVOD

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
    return proc.stdout + proc.stderr


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


def test_custom_train_step_gan_on_two_local_devices():
    out = _run(
        "examples/custom_train_step.py", "--rows", "512", "--epochs", "1", "--cpu-devices", "2"
    )
    # The JSON line is stdout's last; TensorFlow's start-up lines go to stderr.
    final = json.loads(next(ln for ln in reversed(out.splitlines()) if ln.startswith("{")))["final"]
    # The step's own logs and its custom metric, from History.
    assert set(final) == {"d_loss", "g_loss", "radius_error"}
    assert all(np.isfinite(v) for v in final.values())


def test_cifar_like_reads_a_tfrecord_source(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "_tf"))
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


# -- ports of Horovod's Keras MNIST example and TensorFlow's multi-worker tutorial --

PORTS = ["examples/horovod_keras_mnist.py", "examples/keras_multi_worker_mnist.py"]
SMALL = ["--rows", "256", "--epochs", "1"]
BIN = Path(sys.executable).parent


def _launched(cmd, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "SHARDFEED_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _port_args(script, tmp_path):
    if script.endswith("multi_worker_mnist.py"):
        return [str(ROOT / script), *SMALL, "--model-path", str(tmp_path / "m.keras")]
    return [str(ROOT / script), *SMALL, "--checkpoint-dir", str(tmp_path)]


def _check_port(script, out, tmp_path):
    if script.endswith("multi_worker_mnist.py"):
        assert "saved m.keras" in out and (tmp_path / "m.keras").is_file()
    else:
        assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-1.keras"]


@pytest.mark.multi_process
@pytest.mark.parametrize("script", PORTS)
def test_ports_run_under_shardfeed_launch(script, tmp_path):
    launch = [sys.executable, "-m", "shardfeed._commands.cli", "launch", "-n", "2"]
    cmd = [*launch, "--timeout-s", "360", "python", *_port_args(script, tmp_path)]
    out = _launched(cmd, tmp_path)  # exit 0: both workers finished (MWMS needs both)
    assert "[rank 0] Epoch 1/1" in out
    # Verbose output is the chief's alone: rank 1 prints no progress or callback lines.
    assert not [
        line for line in out.splitlines()
        if line.startswith("[rank 1] ") and ("Epoch" in line or "learning rate" in line)
    ]
    _check_port(script, out, tmp_path)


@pytest.mark.multi_process
@pytest.mark.horovod
@NO_HOROVOD
@pytest.mark.parametrize("script", PORTS)
def test_ports_run_under_horovodrun(script, tmp_path):
    horovodrun = [str(BIN / "horovodrun"), "-np", "2", "--gloo", "-H", "localhost:2"]
    out = _launched([*horovodrun, sys.executable, *_port_args(script, tmp_path)], tmp_path)
    assert "Epoch 1/1" in out
    _check_port(script, out, tmp_path)  # saved once, by rank 0


# -- custom-loop ports: Horovod's tensorflow2_mnist.py and TF's custom-training tutorial --

HVD_PORT = "examples/horovod_tf2_mnist.py"
TUTORIAL = "examples/custom_training_tutorial.py"
# 1344 rows = 10.5 global steps of 128: the tutorial's last step is partial on 2 replicas.
TUTORIAL_ARGS = ["--rows", "1344", "--epochs", "1"]
STEP_LINE = re.compile(r"^(.*?)Step #(\d+)\tLoss: ([0-9.]+)$", re.M)
EPOCH_LINE = re.compile(r"^(.*?)Epoch 1, Loss: ([0-9.]+), Accuracy: ([0-9.]+)(.*)$", re.M)


# 42 steps: 21 per replica on 2 replicas, so rank 0 prints steps 0, 10 and 20 (the last the
# check reads); the 22nd to 30th steps of 60 (as before) printed and checked nothing more.
HVD_STEPS, HVD_STEPS_PER_REPLICA = 42, 21


def _hvd_port_args(tmp_path):
    checkpoints = str(tmp_path / "checkpoints")
    return [str(ROOT / HVD_PORT), "--rows", "2048", "--steps", str(HVD_STEPS),
            "--checkpoint-dir", checkpoints]


def _check_hvd_port(out, tmp_path, steps_per_replica):
    printed = STEP_LINE.findall(out)
    # Each step's loss is printed once, by one process (rank 0), every 10 steps.
    assert [int(step) for _, step, _ in printed] == list(range(0, steps_per_replica, 10)), out
    assert len({prefix for prefix, _, _ in printed}) == 1, printed
    losses = [float(loss) for _, _, loss in printed]
    assert losses[-1] < 0.8 * losses[0], losses  # it trained (synthetic images learn fast)
    assert [p.name for p in tmp_path.glob("checkpoints-*.index")] == ["checkpoints-1.index"]
    return printed


def _check_tutorial(out, num_workers=1):
    # The partial last step, asked inside the tutorial's tf.function, converts cleanly.
    assert "AutoGraph could not transform" not in out, out
    epochs = EPOCH_LINE.findall(out)
    # Three sections train, each printing "Epoch 1, ..." once per worker: the epoch loop (with
    # test metrics), the 10-step loop and the in-graph epoch.
    assert len(epochs) == 3 * num_workers, out
    first, *_ = epochs
    test = re.search(r"Test Loss: ([0-9.]+), Test Accuracy: ([0-9.]+)", first[3])
    assert test is not None, first
    assert float(test[2]) > 50, first  # chance is 10%
    restored = re.findall(r"Accuracy after restoring the saved model without strategy: ([0-9.]+)",
                          out)
    # The checkpoint of epoch 0 holds the weights the test metrics saw (1 epoch): the same
    # accuracy, up to a row whose argmax another batching flips (0.1% of 1000 rows).
    assert len(restored) == num_workers, out
    assert all(abs(float(r) - float(test[2])) <= 0.11 for r in restored), (restored, test[2])
    losses = [float(loss) for _, loss, _, _ in epochs]
    assert losses[-1] < losses[0], losses  # the later sections keep training
    return epochs


@pytest.mark.multi_device
def test_horovod_tf2_port_on_two_logical_devices(tmp_path):
    out = _run(*_hvd_port_args(tmp_path), "--cpu-devices", "2")
    _check_hvd_port(out, tmp_path, HVD_STEPS_PER_REPLICA)  # steps // num_replicas_in_sync


@pytest.mark.multi_process
def test_horovod_tf2_port_under_shardfeed_launch(tmp_path):
    launch = [sys.executable, "-m", "shardfeed._commands.cli", "launch", "-n", "2"]
    cmd = [*launch, "--timeout-s", "360", "python", *_hvd_port_args(tmp_path)]
    printed = _check_hvd_port(_launched(cmd, tmp_path), tmp_path, HVD_STEPS_PER_REPLICA)
    assert printed[0][0] == "[rank 0] "  # the chief prints; rank 1 prints no step


@pytest.mark.multi_process
@pytest.mark.horovod
@NO_HOROVOD
def test_horovod_tf2_port_under_horovodrun(tmp_path):
    horovodrun = [str(BIN / "horovodrun"), "-np", "2", "--gloo", "-H", "localhost:2"]
    cmd = [*horovodrun, sys.executable, *_hvd_port_args(tmp_path)]
    _check_hvd_port(_launched(cmd, tmp_path), tmp_path, HVD_STEPS_PER_REPLICA)  # hvd's tape


def test_custom_training_tutorial_on_one_device(tmp_path):
    out = _run(str(ROOT / TUTORIAL), *TUTORIAL_ARGS, "--checkpoint-dir", str(tmp_path))
    assert "Number of devices: 1" in out
    _check_tutorial(out)


@pytest.mark.multi_device
def test_custom_training_tutorial_on_two_logical_devices(tmp_path):
    out = _run(str(ROOT / TUTORIAL), *TUTORIAL_ARGS, "--cpu-devices", "2",
               "--checkpoint-dir", str(tmp_path))
    assert "Number of devices: 2" in out
    _check_tutorial(out)


@pytest.mark.multi_process
def test_custom_training_tutorial_under_shardfeed_launch(tmp_path):
    launch = [sys.executable, "-m", "shardfeed._commands.cli", "launch", "-n", "2"]
    cmd = [*launch, "--timeout-s", "360", "python", str(ROOT / TUTORIAL), *TUTORIAL_ARGS,
           "--checkpoint-dir", str(tmp_path / "ckpt")]
    out = _launched(cmd, tmp_path)
    assert "[rank 0] Number of devices: 2" in out
    epochs = _check_tutorial(out, num_workers=2)
    # The tutorial prints on every process; its metrics are global, so both print the same.
    by_rank = {rank: sorted(line[1:] for line in epochs if line[0] == f"[rank {rank}] ")
               for rank in (0, 1)}
    assert by_rank[0] == by_rank[1], by_rank


def _write_idx(path, array):
    header = bytes([0, 0, 8, array.ndim]) + np.array(array.shape, ">u4").tobytes()
    data = header + array.astype(np.uint8).tobytes()
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)


@pytest.mark.parametrize(
    ("pattern", "suffix"),
    [
        ("{split}-{kind}-idx{rank}-ubyte", ".gz"),  # Keras' and Fashion-MNIST's names, gzipped
        ("{split}-{kind}.idx{rank}-ubyte", ""),  # MNIST's site, unpacked
    ],
)
def test_ports_read_mnist_idx_files(tmp_path, monkeypatch, pattern, suffix):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import mnist_data

    rng = np.random.default_rng(0)
    arrays = {}
    for split, rows in (("train", 5), ("t10k", 3)):
        arrays[split] = rng.integers(0, 256, (rows, 28, 28)), rng.integers(0, 10, rows)
        for kind, rank, array in (("images", 3, arrays[split][0]), ("labels", 1, arrays[split][1])):
            name = pattern.format(split=split, kind=kind, rank=rank) + suffix
            _write_idx(tmp_path / name, array)
    (x, y), (x_test, y_test) = mnist_data.load_data(str(tmp_path), rows=4)
    assert x.dtype == np.uint8 and x.shape == (4, 28, 28)
    np.testing.assert_array_equal(x, arrays["train"][0][:4])
    np.testing.assert_array_equal(y, arrays["train"][1][:4])
    np.testing.assert_array_equal(x_test, arrays["t10k"][0])
    np.testing.assert_array_equal(y_test, arrays["t10k"][1])
    with pytest.raises(FileNotFoundError, match="No train-images-idx3-ubyte"):
        mnist_data.load_data(str(tmp_path / "empty"))
