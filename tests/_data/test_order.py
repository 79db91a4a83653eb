"""One epoch order on both backends: the same seed trains the same rows in
the same steps on TensorFlow and on JAX.

For every placement and shuffle (global, `"local"`, in order, a partial
exchange; `_helpers_order.CASES`), the rows each replica's batch holds at
each step, read back from the batches the loops gather, on TensorFlow here
and on JAX in a child process (`SHARDFEED_JAX_PYTHON`: the JAX venv has no
TensorFlow, this one no Keras-on-JAX), and both against the neutral order
(`shardfeed._data.order`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import keras
import numpy as np
import pytest
from _helpers import strategy_of
from _helpers_order import (
    CASES,
    RESUME_CASE,
    data,
    dataset_kwargs,
    neutral_record,
    record,
    regression,
    regression_model,
)
from _helpers_resume import Preempt

import shardfeed
from shardfeed import LoadOptions, ShardedResidentDataset

pytestmark = pytest.mark.multi_device

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "_order_worker_jax.py"


_strategy = strategy_of


def _tf_record(name: str) -> list:
    replicas, *_, fraction, _ = CASES[name]
    strategy = _strategy(replicas)
    with strategy.scope():
        # A small staging buffer: several exchange rounds an epoch.
        options = LoadOptions(exchange_fraction=fraction, exchange_buffer_bytes=64)
        ds = ShardedResidentDataset(*data(), **dataset_kwargs(name), load_options=options)

    def replica_ys(epoch, step, batch):
        return strategy.experimental_local_results(batch.y)

    return record(lambda e, t: ds.epoch(e, training=t), replica_ys)


def _on_jax(*args: str) -> None:
    """Runs `_order_worker_jax.py args` with the Keras-on-JAX Python."""
    python = os.environ.get("SHARDFEED_JAX_PYTHON")
    if not python:
        pytest.skip("no Keras-on-JAX venv: set SHARDFEED_JAX_PYTHON (.ci/setup makes .venv-jax)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "KERAS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["KERAS_BACKEND"] = "jax"
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    result = subprocess.run(
        [python, str(WORKER), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def jax_records(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("order") / "jax.json"
    _on_jax("records", str(out))
    return json.loads(out.read_text())["records"]


@pytest.mark.parametrize("name", list(CASES))
def test_tensorflow_trains_the_neutral_order(name):
    assert _tf_record(name) == neutral_record(name)


@pytest.mark.parametrize("copy", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_jax_trains_the_rows_tensorflow_trains(jax_records, name, copy):
    """JAX's epochs, its rows gathered where they sit or copied per epoch,
    take the rows TensorFlow's take, step by step and replica by replica."""
    assert jax_records[f"{name}, epoch_copy={copy}"] == _tf_record(name)


def _fit_on_tensorflow(epochs: int, callbacks: list) -> tuple[list[np.ndarray], list[float]]:
    strategy = _strategy(CASES[RESUME_CASE][0])
    with strategy.scope():
        model = regression_model()
        ds = ShardedResidentDataset(*regression(), **dataset_kwargs(RESUME_CASE))
    history = shardfeed.fit(model, ds, epochs=epochs, verbose=0, callbacks=callbacks)
    return model.get_weights(), history.history["loss"]


def _backup_weights(backup: Path) -> list[np.ndarray]:
    """The weights a backup holds (read into a fresh model)."""
    name = json.loads((backup / "shardfeed_state.json").read_text())["weights"]
    model = regression_model()
    model.load_weights(backup / name)
    return model.get_weights()


def _assert_resumed_as_uninterrupted(at_backup, weights, losses, uninterrupted, expected_losses):
    """The resumed run's weights end where the uninterrupted run's end (to
    float32 noise between backends, far below how far they moved after the
    backup), and its epoch 1 logs the whole epoch's loss."""
    moved = max(np.abs(u - a).max() for u, a in zip(uninterrupted, at_backup, strict=True))
    error = max(np.abs(w - u).max() for w, u in zip(weights, uninterrupted, strict=True))
    assert moved > 1e-2  # the steps after the backup changed the weights
    assert error < 1e-3 * moved, (error, moved)
    np.testing.assert_allclose(losses[-1], expected_losses[-1], rtol=1e-4)


@pytest.mark.parametrize("save_freq", ["epoch", 10])  # 10: inside epoch 1 (13 steps an epoch)
def test_a_fit_backed_up_on_tensorflow_resumes_on_jax_on_the_same_rows(tmp_path, save_freq):
    """A `BackupAndRestore` state written on TensorFlow (after epoch 0, or
    inside epoch 1) resumes on JAX, whose steps train the rows TensorFlow's
    uninterrupted run trained. Before: another order (0.055 apart against
    0.32 moved, after epoch 0) and, inside an epoch, a refusal (TensorFlow's
    running loss)."""
    backup = tmp_path / "backup"
    with pytest.raises(KeyboardInterrupt):
        _fit_on_tensorflow(
            2, [keras.callbacks.BackupAndRestore(str(backup), save_freq=save_freq), Preempt(1, 13)]
        )
    cursor = json.loads((backup / "shardfeed_state.json").read_text())["state"]["cursor"]
    assert cursor["epoch"] == 1 and (cursor["step"] > 0) == (save_freq != "epoch"), cursor
    at_backup = _backup_weights(backup)  # before the resumed fit deletes the backup
    uninterrupted, expected_losses = _fit_on_tensorflow(2, [])
    out = tmp_path / "resumed.npz"
    _on_jax("resume", str(backup), "2", str(out))
    resumed = np.load(out)
    weights = [resumed[f"arr_{i}"] for i in range(len(uninterrupted))]
    _assert_resumed_as_uninterrupted(
        at_backup, weights, resumed["losses"], uninterrupted, expected_losses
    )


def test_a_fit_backed_up_on_jax_inside_an_epoch_resumes_on_tensorflow(tmp_path):
    """A state JAX wrote inside epoch 1 resumes on TensorFlow on the same
    rows, and epoch 1's loss covers the whole epoch: JAX writes its loss
    tracker's running loss as `loss_sum`/`loss_rows` (it wrote 0, and
    TensorFlow logged the loss of the steps after the resume alone)."""
    backup = tmp_path / "backup"
    _on_jax("interrupt", str(backup), "10")
    state = json.loads((backup / "shardfeed_state.json").read_text())["state"]
    assert state["cursor"]["epoch"] == 1 and state["loss_rows"] > 0, state
    at_backup = _backup_weights(backup)  # before the resumed fit deletes the backup
    weights, losses = _fit_on_tensorflow(2, [keras.callbacks.BackupAndRestore(str(backup))])
    # The uninterrupted run on JAX (its first weights are JAX's draws): an
    # empty backup directory starts afresh.
    out = tmp_path / "uninterrupted.npz"
    _on_jax("resume", str(tmp_path / "none"), "2", str(out))
    ran = np.load(out)
    uninterrupted = [ran[f"arr_{i}"] for i in range(len(weights))]
    _assert_resumed_as_uninterrupted(at_backup, weights, losses, uninterrupted, ran["losses"])


def test_the_order_of_a_seed_is_pinned():
    """The neutral order of one seed, written out: a change to it (another
    generator, another key) changes every backend's order and every resume
    state's meaning, so it must be deliberate (and `order.NAME` change)."""
    from shardfeed._data import order as _order

    assert _order.NAME == "numpy-pcg64-1"
    assert _order.permutation(10, 11, (0,), True).tolist() == [8, 5, 6, 1, 9, 3, 4, 2, 7, 0]
    assert _order.permutation(10, 11, (2, 1), True).tolist() == [0, 1, 5, 6, 9, 2, 7, 4, 8, 3]


@pytest.mark.parametrize(
    ("shuffle", "streaming", "suffix"),
    [
        (True, False, ""),  # the neutral order
        ("local", False, ""),
        (False, False, ""),  # rows in order, moved to follow one replica's batches
        ("local", True, "+tensorflow-stream-chunks"),  # chunk, then rows within it
        (False, True, "+tensorflow-unmoved"),  # each replica's own shard, in order
    ],
)
def test_a_dataset_names_the_order_its_epochs_take(shuffle, streaming, suffix):
    """What a resume state records: TensorFlow's streamed shards take
    another order than JAX's (a mid-epoch resume across them is refused)."""
    with _strategy(2).scope():
        ds = ShardedResidentDataset(
            *data(),
            per_replica_batch_size=4,
            seed=1,
            shuffle=shuffle,
            load_options=LoadOptions(streaming=streaming),
        )
    assert ds.order_name == "numpy-pcg64-1" + suffix
