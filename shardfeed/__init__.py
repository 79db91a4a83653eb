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
    "FitOptions": "shardfeed._options",
    "LoadOptions": "shardfeed._options",
    "MemoryPlan": "shardfeed._memplan",
    "ShardPlan": "shardfeed._plan",
    "ShardedResidentDataset": "shardfeed._dataset",
    "World": "shardfeed._world",
    "evaluate": "shardfeed._training",
    "fit": "shardfeed._training",
    "init": "shardfeed._init",
    "memory_plan": "shardfeed._memplan",
    "plan_shards": "shardfeed._plan",
    "predict": "shardfeed._training",
}

__all__ = sorted(_EXPORTS)

if _typing.TYPE_CHECKING:
    from shardfeed._dataset import ShardedResidentDataset as ShardedResidentDataset
    from shardfeed._init import init as init
    from shardfeed._memplan import MemoryPlan as MemoryPlan
    from shardfeed._memplan import memory_plan as memory_plan
    from shardfeed._options import FitOptions as FitOptions
    from shardfeed._options import LoadOptions as LoadOptions
    from shardfeed._plan import ShardPlan as ShardPlan
    from shardfeed._plan import plan_shards as plan_shards
    from shardfeed._training import evaluate as evaluate
    from shardfeed._training import fit as fit
    from shardfeed._training import predict as predict
    from shardfeed._world import World as World


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shardfeed' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
