"""The public API is exactly this list; changing it is a decision, not an accident."""

import shardfeed

EXPECTED = [
    "FitOptions",
    "LoadOptions",
    "ShardPlan",
    "ShardedResidentDataset",
    "evaluate",
    "fit",
    "plan_shards",
    "predict",
]


def test_public_names_snapshot():
    assert sorted(shardfeed.__all__) == EXPECTED
    public = sorted(n for n in vars(shardfeed) if not n.startswith("_"))
    assert public == EXPECTED
