"""shardfeed: train Keras models on datasets resident in accelerator memory.

This module owns the public names: exactly `__all__` (snapshot-tested,
`tests/test_public_api.py`), each imported on first use so the CLI starts
without TensorFlow or Keras, and resolved for Keras' backend: through
`_JAX_EXPORTS` on JAX, else `_EXPORTS` (TensorFlow).
"""

import importlib as _importlib
import importlib.util as _importlib_util
import typing as _typing

__version__ = "0.1.0"

# public name -> private module that defines it
_EXPORTS = {
    "Batch": "shardfeed._data.batch",
    "FitOptions": "shardfeed._training.options",
    "LoadOptions": "shardfeed._data.options",
    "MemoryPlan": "shardfeed._data.memplan",
    "ResidentEpoch": "shardfeed._tf.epoch",
    "ResidentIterator": "shardfeed._tf.iterator",
    "ShardPlan": "shardfeed._data.plan",
    "ShardedResidentDataset": "shardfeed._tf.dataset",
    "World": "shardfeed._tf.world",
    "disable_keras_hooks": "shardfeed._training.keras_hooks",
    "evaluate": "shardfeed._tf.evaluation",
    "fit": "shardfeed._tf.training",
    "init": "shardfeed._tf.initialize",
    "memory_plan": "shardfeed._data.memplan",
    "on_chief": "shardfeed._training.callbacks",
    "plan_shards": "shardfeed._data.plan",
    "predict": "shardfeed._tf.evaluation",
    "resident_arrays": "shardfeed._training.resident_arrays",
    "save_model": "shardfeed._tf.saving",
    "sync_model": "shardfeed._tf.sync",
}

# On the JAX backend: public name -> its module there, or None where there is
# no JAX implementation (asking for it raises, naming the fix; a module not in
# this checkout yet counts as None). Backend-neutral names keep their module.
_JAX_EXPORTS: dict[str, str | None] = {
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

# Same module on every backend: resolved without asking Keras for its backend.
_NEUTRAL = frozenset(name for name, module in _JAX_EXPORTS.items() if module == _EXPORTS[name])

# Names that need Keras' own `fit`/`evaluate`/`predict` to take a resident
# dataset: resolving one installs the hooks (docs/keras.md, "Inside Keras").
_HOOKED = (frozenset(_EXPORTS) - _NEUTRAL) | {"resident_arrays"}
_HOOKS = {"jax": "shardfeed._jax.keras_hooks"}  # every other backend: TensorFlow's

# The fix a name without a JAX implementation names (none today; the default
# says to use the TensorFlow backend).
_JAX_FIXES: dict[str, str] = {}

__all__ = sorted(_EXPORTS)

if _typing.TYPE_CHECKING:
    from shardfeed._data.batch import Batch as Batch
    from shardfeed._data.memplan import MemoryPlan as MemoryPlan
    from shardfeed._data.memplan import memory_plan as memory_plan
    from shardfeed._data.options import LoadOptions as LoadOptions
    from shardfeed._data.plan import ShardPlan as ShardPlan
    from shardfeed._data.plan import plan_shards as plan_shards
    from shardfeed._tf.dataset import ShardedResidentDataset as ShardedResidentDataset
    from shardfeed._tf.epoch import ResidentEpoch as ResidentEpoch
    from shardfeed._tf.evaluation import evaluate as evaluate
    from shardfeed._tf.evaluation import predict as predict
    from shardfeed._tf.initialize import init as init
    from shardfeed._tf.iterator import ResidentIterator as ResidentIterator
    from shardfeed._tf.saving import save_model as save_model
    from shardfeed._tf.sync import sync_model as sync_model
    from shardfeed._tf.training import fit as fit
    from shardfeed._tf.world import World as World
    from shardfeed._training.callbacks import on_chief as on_chief
    from shardfeed._training.keras_hooks import disable_keras_hooks as disable_keras_hooks
    from shardfeed._training.options import FitOptions as FitOptions
    from shardfeed._training.resident_arrays import resident_arrays as resident_arrays


def __getattr__(name: str) -> _typing.Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'shardfeed' has no attribute {name!r}")
    module = _EXPORTS[name] if name in _NEUTRAL else _module_for_backend(name)
    value = getattr(_importlib.import_module(module), name)
    if name in _HOOKED:
        _install_keras_hooks()
    globals()[name] = value
    return value


def _install_keras_hooks() -> None:
    import keras

    backend = keras.backend.backend()
    _importlib.import_module(_HOOKS.get(backend, "shardfeed._tf.keras_hooks")).install()


def _module_for_backend(name: str) -> str:
    import keras

    backend = keras.backend.backend()
    if backend != "jax":
        return _EXPORTS[name]
    module = _JAX_EXPORTS[name]
    if module is None or _importlib_util.find_spec(module) is None:
        from shardfeed._common import errors as _errors

        raise NotImplementedError(
            _errors.message(
                f"`shardfeed.{name}` has no implementation on the JAX backend yet "
                "(docs/engines.md lists what each backend supports).",
                f"name={name!r}, keras.backend.backend()={backend!r}",
                _JAX_FIXES.get(name, "Use the TensorFlow backend (`KERAS_BACKEND=tensorflow`)."),
            )
        )
    return module


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
