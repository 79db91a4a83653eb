"""`model.fit`'s arguments under `shardfeed.fit`: the ones that work, and what to use instead.

Owns the arguments a Keras user carries over from `model.fit`: refusing those
`fit` cannot honour with the replacement in the message (the full table is in
docs/keras.md), `validation_split` (the last rows of the dataset's sources,
as in Keras, split before sharding) and `validation_freq` (an int or a list
of epochs, as in Keras).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import optree

from shardfeed._common import errors as _errors
from shardfeed._data.dataset import ShardedResidentDataset

_ARRAYS = (
    "`shardfeed.fit` trains on a `ShardedResidentDataset` (the rows live on the devices).",
    "Build one and pass it: `shardfeed.fit(model, ShardedResidentDataset(x, y, "
    "per_replica_batch_size=..., seed=0))`.",
)
_NO_PIPELINE = (
    "`shardfeed.fit` has no input pipeline to tune: batches are gathered on the device "
    "inside the compiled step.",
    "Drop the argument.",
)

# model.fit argument -> (constraint, fix), for those `shardfeed.fit` refuses.
REFUSED: dict[str, tuple[str, str]] = {
    "x": _ARRAYS,
    "y": _ARRAYS,
    "shuffle": (
        "The dataset shuffles, with a new order every epoch drawn from `(seed, epoch)`.",
        "Build the dataset with `ShardedResidentDataset(..., shuffle=True, seed=0)` "
        "(or `shuffle=False`).",
    ),
    "sample_weight": (
        "Sample weights are a column of the dataset.",
        "Build it with `ShardedResidentDataset(x, y, sample_weight, per_replica_batch_size=...)`.",
    ),
    "validation_steps": (
        "Validation covers every row of `validation_data` exactly once.",
        "Pass fewer rows, e.g. `validation_data=(x_val[:n], y_val[:n])`.",
    ),
    "validation_batch_size": (
        "Arrays in `validation_data` are evaluated with the training per-replica batch "
        "(the numbers do not depend on it).",
        "To choose it, pass `validation_data=ShardedResidentDataset(x_val, y_val, "
        "per_replica_batch_size=..., shuffle=False)`.",
    ),
    "max_queue_size": _NO_PIPELINE,
    "workers": _NO_PIPELINE,
    "use_multiprocessing": _NO_PIPELINE,
}


def refuse(unsupported: dict[str, Any], dataset: Any) -> None:
    """Raises for the first of `unsupported` (keyword arguments `fit` does not take).

    Raises:
        TypeError: Always, when `unsupported` is not empty: `batch_size` with
            the dataset's global batch, a `model.fit` argument with what to
            use instead, any other name as Python would.
    """
    if not unsupported:
        return
    name, value = next(iter(unsupported.items()))
    if name == "batch_size":
        plan = getattr(dataset, "plan", None)
        now = (
            f" (this dataset: {plan.per_replica_batch_size} per replica x "
            f"{plan.num_replicas} replicas = {plan.global_batch_size})"
            if plan is not None
            else ""
        )
        raise TypeError(
            _errors.message(
                "The batch belongs to the dataset: the global batch is "
                f"`per_replica_batch_size x num_replicas_in_sync`{now}.",
                f"batch_size={value!r}",
                "Build the dataset with `ShardedResidentDataset(x, y, per_replica_batch_size="
                "batch_size // world.num_replicas_in_sync)`.",
            )
        )
    if name in REFUSED:
        constraint, fix = REFUSED[name]
        raise TypeError(_errors.message(constraint, f"{name}={_short(value)}", fix))
    raise TypeError(
        _errors.message(
            f"`shardfeed.fit` got an unexpected keyword argument `{name}`.",
            f"{name}={_short(value)}",
            "See docs/keras.md for each `model.fit` argument and what to use instead.",
        )
    )


def check_positional(dataset: Any, positional: tuple[Any, ...]) -> None:
    """Refuses Keras' `fit(x, y)` positional form and a missing dataset.

    Raises:
        TypeError: For positional arguments after the dataset (arrays, as in
            `shardfeed.fit(model, x, y)`, with how to build the dataset), or
            for no dataset at all.
    """
    if positional:
        arrays = dataset is not None and not isinstance(dataset, ShardedResidentDataset)
        constraint, fix = _ARRAYS if arrays else (
            "`shardfeed.fit` takes the model and the dataset by position, the rest by keyword.",
            "Pass the rest by name, e.g. `epochs=5`.",
        )
        shown = (dataset, *positional) if arrays else positional
        received = ", ".join(_short(v) for v in shown)
        raise TypeError(_errors.message(constraint, f"positional arguments {received}", fix))
    if dataset is None:
        raise TypeError(
            _errors.message("`shardfeed.fit` needs a dataset.", "dataset=None", _ARRAYS[1])
        )


def _short(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<{type(value).__name__} of shape {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validation_schedule(validation_freq: Any) -> Callable[[int], bool]:
    """Whether to validate after epoch `e` (0-based), as Keras' `_should_eval`:
    an int validates every that many epochs, a list after the epochs it names
    (1-based).

    Raises:
        ValueError: For anything but an int >= 1 or a list of ints >= 1.
    """
    if _errors.is_integer(validation_freq) and validation_freq >= 1:
        every = int(validation_freq)
        return lambda epoch: (epoch + 1) % every == 0
    if isinstance(validation_freq, (list, tuple)) and all(
        _errors.is_integer(e) and e >= 1 for e in validation_freq
    ):
        epochs = {int(e) for e in validation_freq}
        return lambda epoch: epoch + 1 in epochs
    raise ValueError(
        _errors.message(
            "`validation_freq` must be an integer >= 1 (validate every that many epochs) "
            "or a list of epochs counted from 1 (as in Keras).",
            f"validation_freq={validation_freq!r}",
            "Pass e.g. `validation_freq=1`, or `validation_freq=[1, 5, 10]`.",
        )
    )


class _Rows:
    """Rows `[start, stop)` of an array-like, read lazily (no copy until read)."""

    def __init__(self, data: Any, start: int, stop: int, shape: tuple[int, ...], dtype: Any):
        self._data, self._start = data, start
        self.shape = (stop - start, *shape[1:])
        self.dtype = dtype
        self.source = getattr(data, "source", None)

    def __getitem__(self, rows: slice) -> Any:
        begin, end, _ = rows.indices(self.shape[0])
        return self._data[self._start + begin : self._start + end]


# Split datasets per (dataset, fraction): repeated fits upload them once. Weak
# keys, and the split datasets keep only the user's arrays, not the dataset.
_SPLITS: weakref.WeakKeyDictionary[
    ShardedResidentDataset, dict[float, tuple[ShardedResidentDataset, ShardedResidentDataset]]
] = weakref.WeakKeyDictionary()


def split_validation(
    dataset: ShardedResidentDataset, validation_split: float, validation_data: Any = None
) -> tuple[ShardedResidentDataset, ShardedResidentDataset]:
    """Keras' `validation_split`: the last `validation_split` of the rows, taken
    before sharding, as validation data; the rest as training data.

    Both datasets are built from `dataset`'s sources (its arrays or files,
    read again) with its options; the validation one unshuffled. The rows
    of `dataset` itself stay on the devices as long as you hold it.

    Raises:
        ValueError: For a fraction outside (0, 1) or one that leaves a side
            empty, or with `validation_data` given too.
    """
    if validation_data is not None:
        raise ValueError(
            _errors.message(
                "Pass either `validation_data` or `validation_split`, not both.",
                f"validation_split={validation_split!r} and validation_data",
                "Keep one of the two.",
            )
        )
    if not (isinstance(validation_split, (int, float)) and 0 < validation_split < 1):
        raise ValueError(
            _errors.message(
                "`validation_split` must be a fraction between 0 and 1 (exclusive).",
                f"validation_split={validation_split!r}",
                "Pass e.g. `validation_split=0.2` to validate on the last 20% of the rows.",
            )
        )
    cached = _SPLITS.setdefault(dataset, {}).get(float(validation_split))
    if cached is not None:
        return cached
    rows = dataset.num_rows
    split_at = math.floor(rows * (1.0 - validation_split))  # as Keras
    if split_at in (0, rows):
        raise ValueError(
            _errors.message(
                "`validation_split` must leave rows on both sides.",
                f"validation_split={validation_split!r} of {rows} rows",
                "Use a fraction that leaves at least one training and one validation row.",
            )
        )
    plan = dataset.plan
    batch = plan.per_replica_batch_size

    def part(start: int, stop: int, **options: Any) -> ShardedResidentDataset:
        cols = dataset.columns
        views = [_Rows(c.data, start, stop, c.shape, c.dtype) for c in cols.columns]

        def structure(s: Any) -> Any:
            return None if s is None else optree.tree_map(lambda i: views[i], s)

        return ShardedResidentDataset(
            structure(cols.x),
            structure(cols.y),
            structure(cols.sample_weight),
            placement=plan.placement,
            transform=dataset.transform,
            load_options=dataset.load_options,
            strategy=dataset.world.strategy,
            **options,
        )

    # Validation pads rather than drops: shrink its batch for few rows (as
    # arrays in `validation_data` get).
    val_batch = max(1, min(batch, (rows - split_at) // plan.num_replicas))
    split = (
        part(
            0,
            split_at,
            per_replica_batch_size=batch,
            shuffle=dataset.shuffle,
            seed=dataset.seed,
            drop_remainder=plan.drop_remainder,
            augment=dataset.augment,  # training only: validation never augments
        ),
        part(split_at, rows, per_replica_batch_size=val_batch, shuffle=False),
    )
    _SPLITS[dataset][float(validation_split)] = split
    return split

