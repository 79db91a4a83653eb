"""shardfeed: train Keras models on datasets resident in accelerator memory.

The public API is exactly what this module exports; everything else lives in
private modules. `tests/test_public_api.py` snapshots it.
"""

from shardfeed._dataset import ShardedResidentDataset as ShardedResidentDataset
from shardfeed._options import FitOptions as FitOptions
from shardfeed._options import LoadOptions as LoadOptions
from shardfeed._plan import ShardPlan as ShardPlan
from shardfeed._plan import plan_shards as plan_shards
from shardfeed._training import evaluate as evaluate
from shardfeed._training import fit as fit
from shardfeed._training import predict as predict

__version__ = "0.1.0"

__all__ = [
    "FitOptions",
    "LoadOptions",
    "ShardPlan",
    "ShardedResidentDataset",
    "evaluate",
    "fit",
    "plan_shards",
    "predict",
]
