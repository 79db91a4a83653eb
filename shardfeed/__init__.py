"""shardfeed: train Keras models on datasets resident in accelerator memory.

The public API is exactly `__all__`; everything else lives in private
modules. `tests/test_public_api.py` snapshots it. Names are imported on first
use, so `shardfeed launch`, `split` and `plan` start without importing
TensorFlow.
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

# public name -> private module that defines it
_EXPORTS = {
    "Batch": "shardfeed._data.epoch",
    "FitOptions": "shardfeed._training.options",
    "LoadOptions": "shardfeed._data.options",
    "MemoryPlan": "shardfeed._data.memplan",
    "ResidentEpoch": "shardfeed._data.epoch",
    "ResidentIterator": "shardfeed._data.iterator",
    "ShardPlan": "shardfeed._data.plan",
    "ShardedResidentDataset": "shardfeed._data.dataset",
    "World": "shardfeed._distribute.world",
    "evaluate": "shardfeed._training.evaluation",
    "fit": "shardfeed._training.api",
    "init": "shardfeed._distribute.initialize",
    "memory_plan": "shardfeed._data.memplan",
    "on_chief": "shardfeed._training.callbacks",
    "plan_shards": "shardfeed._data.plan",
    "predict": "shardfeed._training.evaluation",
    "save_model": "shardfeed._training.saving",
}

__all__ = sorted(_EXPORTS)

if _typing.TYPE_CHECKING:
    from shardfeed._data.dataset import ShardedResidentDataset as ShardedResidentDataset
    from shardfeed._data.epoch import Batch as Batch
    from shardfeed._data.epoch import ResidentEpoch as ResidentEpoch
    from shardfeed._data.iterator import ResidentIterator as ResidentIterator
    from shardfeed._data.memplan import MemoryPlan as MemoryPlan
    from shardfeed._data.memplan import memory_plan as memory_plan
    from shardfeed._data.options import LoadOptions as LoadOptions
    from shardfeed._data.plan import ShardPlan as ShardPlan
    from shardfeed._data.plan import plan_shards as plan_shards
    from shardfeed._distribute.initialize import init as init
    from shardfeed._distribute.world import World as World
    from shardfeed._training.api import fit as fit
    from shardfeed._training.callbacks import on_chief as on_chief
    from shardfeed._training.evaluation import evaluate as evaluate
    from shardfeed._training.evaluation import predict as predict
    from shardfeed._training.options import FitOptions as FitOptions
    from shardfeed._training.saving import save_model as save_model


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shardfeed' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
