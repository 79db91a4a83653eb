"""The public API is exactly these lists; changing it is a decision, not an accident."""

import importlib
import subprocess
import sys

import shardfeed

EXPECTED = [
    "Batch",
    "FitOptions",
    "LoadOptions",
    "MemoryPlan",
    "ResidentEpoch",
    "ResidentIterator",
    "ShardPlan",
    "ShardedResidentDataset",
    "World",
    "disable_keras_hooks",
    "evaluate",
    "fit",
    "init",
    "memory_plan",
    "on_chief",
    "plan_shards",
    "predict",
    "resident_arrays",
    "save_model",
    "sync_model",
]

# The JAX backend's table: where each public name comes from there (None: not
# on JAX; a planned module not in the checkout yet raises the same way).
EXPECTED_JAX = {
    "Batch": "shardfeed._data.batch",
    "FitOptions": "shardfeed._training.options",
    "LoadOptions": "shardfeed._data.options",
    "MemoryPlan": "shardfeed._data.memplan",
    "ResidentEpoch": "shardfeed._jax.epoch",
    "ResidentIterator": "shardfeed._jax.iterator",
    "ShardPlan": "shardfeed._data.plan",
    "ShardedResidentDataset": "shardfeed._jax.dataset",
    "World": "shardfeed._jax.world",
    "disable_keras_hooks": "shardfeed._training.keras_hooks",
    "evaluate": "shardfeed._jax.evaluation",
    "fit": "shardfeed._jax.training",
    "init": "shardfeed._jax.initialize",
    "memory_plan": "shardfeed._data.memplan",
    "on_chief": "shardfeed._training.callbacks",
    "plan_shards": "shardfeed._data.plan",
    "predict": "shardfeed._jax.evaluation",
    "resident_arrays": "shardfeed._training.resident_arrays",
    "save_model": "shardfeed._jax.saving",
    "sync_model": "shardfeed._jax.sync",
}

# Public submodules and their exports.
EXPECTED_MODULES = {
    "augment": [
        "brightness",
        "compose",
        "contrast",
        "cutout",
        "flip_left_right",
        "gaussian_noise",
        "random_crop",
        "translate",
    ],
    "files": [
        "FileArray",
        "concat",
        "directory",
        "hdf5",
        "manifest",
        "npy",
        "npz",
        "parquet",
        "parquet_columns",
        "split",
        "tfrecord",
    ],
    "launch": ["LaunchOptions", "run"],
}


def test_public_names_snapshot():
    assert shardfeed.__all__ == EXPECTED
    for name in EXPECTED:
        assert getattr(shardfeed, name).__module__.startswith("shardfeed._")
    public = {n for n in dir(shardfeed) if not n.startswith("_")}
    assert public - set(EXPECTED_MODULES) == set(EXPECTED)


def test_both_backends_export_the_same_names():
    assert shardfeed._JAX_EXPORTS == EXPECTED_JAX
    assert sorted(EXPECTED_JAX) == EXPECTED
    # Backend-neutral names (the same module on both) resolve without asking Keras
    # for its backend; of them, `resident_arrays` asks it to install the hooks.
    assert shardfeed._NEUTRAL == {
        "Batch", "FitOptions", "LoadOptions", "MemoryPlan", "ShardPlan", "disable_keras_hooks",
        "memory_plan", "on_chief", "plan_shards", "resident_arrays",
    }


def test_public_submodules_snapshot():
    for module_name, names in EXPECTED_MODULES.items():
        module = importlib.import_module(f"shardfeed.{module_name}")
        assert module.__all__ == names
        public = {n for n in vars(module) if not n.startswith("_")}
        assert public == set(names)


def test_importing_the_package_and_cli_does_not_import_tensorflow():
    code = (
        "import sys, shardfeed, shardfeed._commands.cli\n"
        "shardfeed._commands.cli.build_parser()\n"
        "print('tensorflow' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "False"
